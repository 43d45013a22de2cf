"""The chart's alerts and dashboard, offline: the PrometheusRule and the dashboard ConfigMap
render (only when asked for), every PromQL expression parses, every series it names is one
the code really exports, every alert links an existing runbook, and the dashboard is a
well-formed Grafana dashboard. That each alert fires on its fault is tests/observability's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from mcp_epoch_operator.metrics import OperatorMetrics
from mcp_epoch_operator.resources import PORT_NAME
from prometheus_client import generate_latest

from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch._internal.keyring import RingCodec, RingFollower
from mcp_epoch.contract import METRICS_PATH, SERVER_LABEL
from tests.charts.support import CHART, REPO, Helm, HelmError, find, one
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.metrics import series_names

NS = "mcp-epoch-system"
RULES = CHART / "files" / "prometheus-rules.yaml"
DASHBOARD = CHART / "files" / "dashboard.json"
RUNBOOKS = REPO / "docs" / "runbooks"
ALL_ON = (
    "serviceMonitor.enabled=true",
    "replicaPodMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
)
#: Grafana's own variables, as a query sees them once Grafana has filled them in.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "1h"}
#: Series Prometheus makes itself rather than scraping them.
PROMETHEUS_OWN = {"up"}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def graph_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def filled(expr: str) -> str:
    """A panel's query as Grafana sends it, its own variables filled in."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def panel_exprs() -> Iterator[tuple[str, str]]:
    """(panel title, query as sent)."""
    for panel in graph_panels(dashboard()):
        for target in panel["targets"]:
            yield panel["title"], filled(target["expr"])


def selected_names(expr: str) -> set[str]:
    """The metric names an expression's vector selectors select, from its syntax tree."""
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            names.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def rendered(helm: Helm, *sets: str, release: str = "r") -> list[dict[str, Any]]:
    return helm.template(sets=sets, namespace=NS, release=release)


# --------------------------------------------------------------------------- rendering


def test_nothing_of_it_renders_unless_asked_for(helm: Helm) -> None:
    manifests = rendered(helm, "serviceMonitor.enabled=true")
    assert not find(manifests, "PrometheusRule")
    assert not find(manifests, "ConfigMap", "-dashboard")
    assert [m["metadata"]["name"] for m in find(manifests, "PodMonitor")] == [
        "r-mcp-epoch-operator"
    ]


def test_the_rule_is_the_rules_file_with_this_releases_jobs_and_runbooks(helm: Helm) -> None:
    """The PrometheusRule carries every alert of files/prometheus-rules.yaml, its expressions
    selecting the scrape jobs this release's ServiceMonitor and PodMonitor produce (the
    Service's name; <namespace>/<PodMonitor name>), each runbook_url at the configured base."""
    base = "https://runbooks.example/mcp-epoch"
    manifests = rendered(
        helm,
        *ALL_ON,
        "serviceMonitor.namespace=monitoring",
        f"prometheusRule.runbookBaseUrl={base}/",
        "prometheusRule.labels.release=kube-prometheus-stack",
        "prometheusRule.additionalRuleLabels.team=platform",
        release="prod",
    )
    rule = one(manifests, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == NS
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service_job = one(manifests, "Service", "-epoch-service")["metadata"]["name"]
    operator_monitor = one(manifests, "PodMonitor", "-operator")["metadata"]
    operator_job = f"{operator_monitor['namespace']}/{operator_monitor['name']}"
    assert (service_job, operator_job) == (
        "prod-mcp-epoch-epoch-service",
        "monitoring/prod-mcp-epoch-operator",
    )

    source = {a["alert"]: a for a in alerts()}
    out = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert list(out) == list(source)
    for name, r in out.items():
        expected = (
            source[name]["expr"]
            .replace('job="mcp-epoch-epoch-service"', f'job="{service_job}"')
            .replace('job="mcp-epoch-system/mcp-epoch-operator"', f'job="{operator_job}"')
        )
        assert r["expr"] == expected
        assert r["for"] == source[name]["for"]
        assert r["labels"] == {**source[name]["labels"], "team": "platform"}
        assert r["annotations"]["runbook_url"] == f"{base}/{name}.md"
        assert r["annotations"]["summary"] == source[name]["annotations"]["summary"]
        # Prometheus's own templates reach it untouched (helm does not render them).
        assert r["annotations"]["description"] == source[name]["annotations"]["description"]
    assert f'up{{job="{service_job}"}}' in out["McpEpochServiceDown"]["expr"]
    assert f'up{{job="{operator_job}"}}' in out["McpEpochOperatorDown"]["expr"]


def test_alerts_can_be_left_out_by_name(helm: Helm) -> None:
    rule = one(
        rendered(
            helm, "prometheusRule.enabled=true", "prometheusRule.disabled={McpEpochWebhookSlow}"
        ),
        "PrometheusRule",
    )
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert names == {a["alert"] for a in alerts()} - {"McpEpochWebhookSlow"}


def test_the_dashboard_configmap_carries_the_sidecars_label_and_the_file(helm: Helm) -> None:
    default = one(rendered(helm, "grafanaDashboard.enabled=true"), "ConfigMap", "-dashboard")
    assert default["metadata"]["labels"]["grafana_dashboard"] == "1"
    (key,) = default["data"]
    assert key.endswith(".json") and json.loads(default["data"][key]) == dashboard()
    custom = one(
        rendered(
            helm,
            "grafanaDashboard.enabled=true",
            "grafanaDashboard.label=dashboards",
            "grafanaDashboard.labelValue=mcp",
            "grafanaDashboard.namespace=monitoring",
            "grafanaDashboard.annotations.grafana_folder=Platform",
        ),
        "ConfigMap",
        "-dashboard",
    )
    assert custom["metadata"]["labels"]["dashboards"] == "mcp"
    assert "grafana_dashboard" not in custom["metadata"]["labels"]
    assert custom["metadata"]["namespace"] == "monitoring"
    assert custom["metadata"]["annotations"] == {"grafana_folder": "Platform"}


def test_the_replica_pod_monitor_scrapes_every_mcp_server_pod_on_its_mcp_port(helm: Helm) -> None:
    """Pods get SERVER_LABEL from the webhook's rules, and their MCP port (where the library
    and the sidecar answer /metrics) is named PORT_NAME by the operator."""
    monitor = one(rendered(helm, "replicaPodMonitor.enabled=true"), "PodMonitor", "-replicas")
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"any": True}
    assert spec["selector"] == {"matchExpressions": [{"key": SERVER_LABEL, "operator": "Exists"}]}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == (PORT_NAME, METRICS_PATH)
    meta_label = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", SERVER_LABEL)
    assert endpoint["relabelings"] == [{"sourceLabels": [meta_label], "targetLabel": "server"}]
    listed = one(
        rendered(
            helm, "replicaPodMonitor.enabled=true", "replicaPodMonitor.namespaces={team-a,team-b}"
        ),
        "PodMonitor",
        "-replicas",
    )
    assert listed["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["prometheusRule.enable=true"], "additional properties 'enable' not allowed"),
        (["prometheusRule.runbookBaseUrl=docs/runbooks"], "at '/prometheusRule/runbookBaseUrl'"),
        (["prometheusRule.disabled={WebhookSlow}"], "at '/prometheusRule/disabled/0'"),
        (["replicaPodMonitor.interval=30"], "at '/replicaPodMonitor/interval'"),
        (["grafanaDashboard.labelValue=1"], "at '/grafanaDashboard/labelValue'"),
    ],
    ids=["typo", "relative-runbooks", "unprefixed-alert", "interval-unit", "label-not-string"],
)
def test_the_schema_refuses_bad_monitoring_values(
    helm: Helm, sets: list[str], expected: str
) -> None:
    with pytest.raises(HelmError) as info:
        rendered(helm, *sets)
    assert expected in info.value.stderr, info.value.stderr


def test_helm_lint_strict_with_everything_on(helm: Helm) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NS]
    for item in ALL_ON:
        args += ["--set", item]
    assert "0 chart(s) failed" in helm.run(*args)


# --------------------------------------------------------------------------- the rules file


@pytest.mark.parametrize("rule", alerts(), ids=lambda r: r["alert"])
def test_every_alert_parses_and_follows_the_conventions(rule: dict[str, Any]) -> None:
    promql_parser.parse(rule["expr"])
    assert re.fullmatch(r"McpEpoch[A-Z][A-Za-z]+", rule["alert"])
    assert DURATION.match(rule["for"]), rule["for"]
    assert rule["labels"]["severity"] in {"warning", "critical"}
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["summary"].endswith(".") and "\n" not in annotations["summary"]


@pytest.mark.parametrize(("title", "expr"), list(panel_exprs()), ids=lambda v: str(v)[:60])
def test_every_panel_query_parses(title: str, expr: str) -> None:
    assert "$" not in expr, f"{title}: a variable the test does not fill in: {expr}"
    promql_parser.parse(expr)


# --------------------------------------------------------------------------- the series exist


@pytest.fixture
def exported(epoch_service: EpochServiceProcess) -> set[str]:
    """Every series name the components export: the epoch service's /metrics (a real
    process), the operator's registry, and a replica's /metrics as the library and the
    sidecar serve it (through the ASGI app; the request-state ring's lines from its
    follower)."""
    with epoch_service.client() as c:
        service = c.get("/metrics")
    assert service.status_code == 200
    operator = generate_latest(OperatorMetrics().registry).decode()
    replica = _replica_exposition()
    ring = "\n".join(RingFollower(ReplicaConfig.from_env({}), RingCodec()).metrics()) + "\n"
    return set().union(*(series_names(text) for text in (service.text, operator, replica, ring)))


def _replica_exposition() -> str:
    """GET /metrics of a started sidecar app (the core's lines and the relay's own), in
    process."""
    import anyio

    from mcp_epoch import sidecar_app

    app = sidecar_app("127.0.0.1:9", env={})

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with (
            app.running(),  # no epoch service: a fallback epoch, at once
            httpx.AsyncClient(transport=transport, base_url="http://replica") as client,
        ):
            return await client.get(METRICS_PATH)

    response = anyio.run(get)
    assert response.status_code == 200
    return response.text


def test_every_series_the_alerts_and_panels_name_is_exported(exported: set[str]) -> None:
    named = {rule["alert"]: selected_names(rule["expr"]) for rule in alerts()}
    for title, expr in panel_exprs():
        named.setdefault(f"panel {title!r}", set()).update(selected_names(expr))
    missing = {
        where: sorted(names - exported - PROMETHEUS_OWN)
        for where, names in named.items()
        if names - exported - PROMETHEUS_OWN
    }
    assert not missing, f"not exported by the code: {missing}"
    # The exports this check reads are the real ones (a broken collection would pass it).
    assert {"epochsvc_store_up", "mcp_epoch_operator_webhook_seconds_bucket"} <= exported
    assert {"mcp_epoch_registered", "mcp_epoch_upstream_up"} <= exported
    assert "mcp_epoch_request_state_rejected_total" in exported


# --------------------------------------------------------------------------- runbooks


def test_every_alert_links_its_runbook_and_every_runbook_has_an_alert(helm: Helm) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    base = values["prometheusRule"]["runbookBaseUrl"]
    names = [rule["alert"] for rule in alerts()]
    assert len(set(names)) == len(names)
    for rule in alerts():
        assert rule["annotations"]["runbook_url"] == f"{base}/{rule['alert']}.md"
        text = (RUNBOOKS / f"{rule['alert']}.md").read_text()
        assert text.startswith(f"# {rule['alert']}\n"), rule["alert"]
        for heading in ("## What it means", "## How to confirm", "## What to do"):
            assert heading in text, f"{rule['alert']}.md lacks {heading!r}"
    books = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert books == set(names)
    index = (RUNBOOKS / "README.md").read_text()
    for name in names:
        assert f"]({name}.md)" in index, f"docs/runbooks/README.md does not link {name}"


# --------------------------------------------------------------------------- the dashboard


def test_the_dashboard_is_a_well_formed_grafana_dashboard() -> None:
    board = dashboard()
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board["uid"] and board["title"]
    (variable,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")

    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Epoch service", "Operator", "Replicas"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)

    taken: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= set(grid), panel["title"]
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells

    for panel in graph_panels(board):
        where = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], f"{where} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), where
        for target in panel["targets"]:
            assert target["expr"].strip(), where
            assert target["datasource"] == panel["datasource"], where


def test_each_row_shows_its_components_series() -> None:
    """The epoch service's row reads epochsvc_*, the operator's mcp_epoch_operator_*, the
    replicas' the replicas' own (mcp_epoch_* but not the operator's)."""
    board = dashboard()
    row, by_row = "", {}
    for panel in sorted(board["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        if panel["type"] == "row":
            row = panel["title"]
            continue
        for target in panel["targets"]:
            by_row.setdefault(row, set()).update(selected_names(filled(target["expr"])))
    assert all(n.startswith("epochsvc_") for n in by_row["Epoch service"])
    assert all(n.startswith("mcp_epoch_operator_") for n in by_row["Operator"])
    assert all(
        n.startswith("mcp_epoch_") and not n.startswith("mcp_epoch_operator_")
        for n in by_row["Replicas"]
    )
