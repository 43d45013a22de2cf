"""The chart, offline: lint, rendering with every values file of ci/, the schema, and what
the rendered objects must say (they are validated against the API server in
test_chart_cluster.py). Needs only the pinned helm binary."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from mcp_epoch_operator.names import SERVER_LABEL, WEBHOOK_NAME, WEBHOOK_PATH
from mcp_epoch_operator.webhook import webhook_configuration

from epochsvc.cli import build_parser
from tests.charts.support import (
    CHART,
    CI_VALUES,
    CRD_NAME,
    REPO,
    Helm,
    HelmError,
    container,
    env_of,
    find,
    one,
)
from tests.support.epochsvc_proc import EpochServiceProcess

NS = "mcp-epoch-system"
VALUE_SETS = [None, *CI_VALUES]
VALUE_IDS = ["default", *(p.name.removesuffix("-values.yaml") for p in CI_VALUES)]

#: The operator's API calls (operator/mcp_epoch_operator: kube.py, runtime.py, handlers.py,
#: plus kopf's watches and CRD discovery). The ClusterRole must grant exactly these.
OPERATOR_PERMISSIONS = {
    ("", "pods"): {"list", "watch"},
    ("", "services"): {"create", "patch"},
    ("", "events"): {"create"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch"},
    ("mcp.epochs.dev", "mcpservers"): {"get", "list", "watch"},
    ("mcp.epochs.dev", "mcpservers/status"): {"patch"},
    ("mcp.epochs.dev", "mcpservers/finalizers"): {"update"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
}


def render(helm: Helm, values: Path | None = None, *sets: str) -> list[dict[str, Any]]:
    return helm.template(values=[values] if values else [], sets=sets, namespace=NS)


def rules_of(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(group, resource) -> verbs; refuses wildcards and resourceNames-free duplicates."""
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


# --------------------------------------------------------------------------- sources


def test_chart_crds_are_byte_identical_to_the_top_level_ones() -> None:
    """crds/ is the single source of truth; the chart ships a copy that must not drift
    (after changing crds/, copy the file into charts/mcp-epoch/crds/)."""
    top = {p.name: p.read_bytes() for p in (REPO / "crds").glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert CRD_NAME in top
    assert set(chart) == set(top)
    for name, content in top.items():
        assert chart[name] == content, f"charts/mcp-epoch/crds/{name} differs from crds/{name}"


def test_app_version_is_the_project_version() -> None:
    """The default image tag is the appVersion, which must be the release pyproject builds."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_helm_lint_strict(helm: Helm, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NS]
    if values:
        args += ["--values", str(values)]
    out = helm.run(*args)
    assert "0 chart(s) failed" in out


# --------------------------------------------------------------------------- every values file


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_every_object_is_labelled_and_placed(helm: Helm, values: Path | None) -> None:
    manifests = render(helm, values)
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration"}
    for m in manifests:
        meta = m["metadata"]
        labels = meta.get("labels") or {}
        where = f"{m['kind']}/{meta['name']}"
        for key in ("name", "instance", "component", "version", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, f"{where} lacks app.kubernetes.io/{key}"
        assert labels["app.kubernetes.io/instance"] == "r"
        assert len(meta["name"]) <= 63, where
        if m["kind"] in cluster_scoped:
            assert "namespace" not in meta, where
        else:
            assert meta.get("namespace"), f"{where} has no namespace"


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_workloads_are_hardened(helm: Helm, values: Path | None) -> None:
    """Restricted pod security for both Deployments and the test pod."""
    manifests = render(helm, values)
    pods = [d["spec"]["template"]["spec"] for d in find(manifests, "Deployment")]
    pods.append(one(manifests, "Pod", "-test")["spec"])
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["runAsNonRoot"] is True
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    for deployment in find(manifests, "Deployment"):
        c = container(deployment)
        assert c["livenessProbe"] and c["readinessProbe"], deployment["metadata"]["name"]
        assert c["image"] == "ghcr.io/mcp-epoch/mcp-epoch:0.1.0"
        # Writable /tmp only: the root filesystem is read-only.
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert "/tmp" in mounts


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_pod_disruption_budgets_only_for_several_replicas(helm: Helm, values: Path | None) -> None:
    manifests = render(helm, values)
    for deployment in find(manifests, "Deployment"):
        name = deployment["metadata"]["name"]
        pdbs = find(manifests, "PodDisruptionBudget", name.removeprefix("r-mcp-epoch"))
        if deployment["spec"]["replicas"] > 1:
            assert len(pdbs) == 1, name
            selector = pdbs[0]["spec"]["selector"]["matchLabels"]
            assert selector == deployment["spec"]["selector"]["matchLabels"]
        else:
            assert not pdbs, name


# --------------------------------------------------------------------------- operator


def test_operator_flags_parse_with_the_real_cli_and_point_at_the_chart_objects(
    helm: Helm,
) -> None:
    manifests = render(helm)
    operator = one(manifests, "Deployment", "-operator")
    c = container(operator)
    args = build_parser().parse_args(c["args"])
    assert args.all_namespaces and args.operator_namespace == NS
    assert not args.register_webhook  # the chart owns the webhook configuration
    svc = one(manifests, "Service", "-epoch-service")
    url = f"http://{svc['metadata']['name']}.{NS}.svc:{svc['spec']['ports'][0]['port']}"
    assert args.epoch_service_url == url and args.replica_epoch_service_url == url
    # Pods get their own projected tokens for the audience the service checks; no Secret.
    assert args.replica_token_secret is None and args.token_audience == "mcp-epoch"
    epochsvc_env = env_of(container(one(manifests, "Deployment", "-epoch-service")))
    assert epochsvc_env["EPOCHSVC_TOKEN_AUDIENCE"] == args.token_audience
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert args.webhook_port == ports["webhook"] and args.webhook_host == "0.0.0.0"
    assert args.health_endpoint == f"http://0.0.0.0:{ports['health']}/healthz"
    # Its own projected token and the certificate are mounted at the paths the flags name.
    volumes = {v["name"]: v for v in operator["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert str(args.operator_token_file) == f"{mounts['operator-token']}/token"
    (source,) = volumes["operator-token"]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == args.token_audience
    assert source["serviceAccountToken"]["path"] == "token"
    assert str(args.webhook_cert) == f"{mounts['webhook-tls']}/tls.crt"
    assert volumes["webhook-tls"]["secret"]["secretName"] == "r-mcp-epoch-webhook-tls"
    webhook_svc = one(manifests, "Service", "-webhook")
    assert webhook_svc["spec"]["selector"] == operator["spec"]["selector"]["matchLabels"]
    assert webhook_svc["spec"]["ports"][0]["targetPort"] == "webhook"


def test_operator_cluster_role_grants_exactly_the_operators_calls(helm: Helm) -> None:
    manifests = render(helm)
    role = one(manifests, "ClusterRole", "-operator")
    assert rules_of(role) == OPERATOR_PERMISSIONS
    binding = one(manifests, "ClusterRoleBinding", "-operator")
    account = one(manifests, "ServiceAccount", "-operator")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NS}
    ]
    # In its own namespace: get and patch of its servers ConfigMap, by name, nothing else.
    role = one(manifests, "Role")
    configmap = one(manifests, "ConfigMap", "-operator-servers")
    args = build_parser().parse_args(container(one(manifests, "Deployment", "-operator"))["args"])
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [configmap["metadata"]["name"]],
            "verbs": ["get", "patch"],
        },
        # The admission Lease, by name; create cannot be limited by name.
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [args.admission_lease],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]
    assert args.admission_lease == "r-mcp-epoch-operator-admission"
    assert configmap["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "data" not in configmap, "the data is the operator's; Helm must never reset it"
    assert one(manifests, "RoleBinding")["subjects"] == binding["subjects"]
    assert args.servers_configmap == configmap["metadata"]["name"]
    assert args.operator_namespace == role["metadata"]["namespace"] == NS
    # The epoch service may create TokenReviews, nothing else; the operator is the account
    # it names as such.
    epochsvc = one(manifests, "ServiceAccount", "-epoch-service")
    assert epochsvc["automountServiceAccountToken"] is True
    review = one(manifests, "ClusterRole", "-epoch-service")
    assert review["rules"] == [
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["tokenreviews"],
            "verbs": ["create"],
        }
    ]
    review_binding = one(manifests, "ClusterRoleBinding", "-epoch-service")
    assert review_binding["roleRef"]["name"] == review["metadata"]["name"]
    assert review_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": epochsvc["metadata"]["name"], "namespace": NS}
    ]
    env = env_of(container(one(manifests, "Deployment", "-epoch-service")))
    assert env["EPOCHSVC_AUTH"] == "kubernetes"
    assert env["EPOCHSVC_OPERATOR_SERVICE_ACCOUNT"] == f"{NS}/{account['metadata']['name']}"
    assert not find(manifests, "Secret", "-token"), "nothing to copy into namespaces"
    # With static tokens the service calls no Kubernetes API: no token, no role.
    static = render(helm, None, "auth.mode=static")
    account = one(static, "ServiceAccount", "-epoch-service")
    assert account["automountServiceAccountToken"] is False
    assert not find(static, "ClusterRole", "-epoch-service")
    without = rules_of(
        one(
            render(helm, None, "operator.ownerReferencesPermission=false"),
            "ClusterRole",
            "-operator",
        )
    )
    assert ("mcp.epochs.dev", "mcpservers/finalizers") not in without


# --------------------------------------------------------------------------- epoch service store


def test_sqlite_store_is_one_replica_recreated_on_a_kept_claim(helm: Helm) -> None:
    manifests = render(helm)
    deployment = one(manifests, "Deployment", "-epoch-service")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    env = env_of(container(deployment))
    assert env["EPOCHSVC_DATABASE_URL"] == "sqlite:////var/lib/mcp-epoch/ledger.db"
    claim = one(manifests, "PersistentVolumeClaim")
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "ledger",
        "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]},
    } in volumes
    mounts = container(deployment)["volumeMounts"]
    assert {"name": "ledger", "mountPath": "/var/lib/mcp-epoch"} in mounts
    not_kept = one(
        render(helm, None, "store.sqlite.persistence.keep=false"), "PersistentVolumeClaim"
    )
    assert "annotations" not in not_kept["metadata"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["epochService.replicas=2"],
            "epochService.replicas=2 needs store.type=postgresql: a SQLite ledger is one file",
        ),
        (["store.type=postgresql"], "store.type=postgresql needs store.postgresql.existingSecret"),
    ],
    ids=["sqlite-with-two-replicas", "postgresql-without-secret"],
)
def test_store_combinations_that_break_the_ledger_are_refused(
    helm: Helm, sets: list[str], message: str
) -> None:
    with pytest.raises(HelmError) as info:
        render(helm, None, *sets)
    assert message in info.value.stderr


def test_postgresql_store_takes_the_dsn_from_the_existing_secret(helm: Helm) -> None:
    manifests = render(helm, CHART / "ci" / "postgresql-values.yaml")
    deployment = one(manifests, "Deployment", "-epoch-service")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = env_of(container(deployment))
    assert env["EPOCHSVC_DATABASE_URL"] == {
        "secretKeyRef": {"name": "mcp-epoch-postgresql", "key": "url"}
    }
    assert not find(manifests, "PersistentVolumeClaim")
    assert "ledger" not in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}


# --------------------------------------------------------------------------- tokens


def test_tokens_are_generated_distinct_or_taken_from_values(helm: Helm) -> None:
    manifests = render(
        helm, None, "auth.mode=static", "replicaTokenSecret.namespaces={team-a,team-b}"
    )
    operator_token = base64.b64decode(one(manifests, "Secret", "-operator-token")["data"]["token"])
    replicas = find(manifests, "Secret", "-replica-token")
    assert sorted(s["metadata"]["namespace"] for s in replicas) == sorted([NS, "team-a", "team-b"])
    values = {base64.b64decode(s["data"]["token"]) for s in replicas}
    assert len(values) == 1, "every namespace's copy holds the same replica token"
    replica_token = values.pop()
    assert len(operator_token) == len(replica_token) == 48 and operator_token != replica_token

    given = render(
        helm, None, "auth.mode=static", "tokens.operator=op-secret", "tokens.replica=rep-secret"
    )
    assert (
        base64.b64decode(one(given, "Secret", "-operator-token")["data"]["token"]) == b"op-secret"
    )
    assert (
        base64.b64decode(one(given, "Secret", "-replica-token")["data"]["token"]) == b"rep-secret"
    )
    env = env_of(container(one(given, "Deployment", "-epoch-service")))
    assert env["EPOCHSVC_AUTH"] == "static"
    assert env["EPOCHSVC_OPERATOR_TOKEN"]["secretKeyRef"]["name"] == "r-mcp-epoch-operator-token"
    assert env["EPOCHSVC_REPLICA_TOKEN"]["secretKeyRef"] == {
        "name": "r-mcp-epoch-replica-token",
        "key": "token",
    }


# --------------------------------------------------------------------------- webhook


def test_webhook_configuration_matches_the_operators_own_and_trusts_the_generated_ca(
    helm: Helm,
) -> None:
    """The chart's configuration is the one the operator registers itself outside a cluster
    (same selectors, policies and path), pointed at the Service, with the generated CA."""
    manifests = render(helm)
    mwc = one(manifests, "MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    expected = webhook_configuration(
        "x",
        service={"name": "r-mcp-epoch-webhook", "namespace": NS, "port": 443},
        ca_bundle=b"ca",
        excluded_namespaces=["kube-system", NS],
        timeout_seconds=5,
    )["webhooks"][0]
    for key in (
        "name",
        "rules",
        "objectSelector",
        "namespaceSelector",
        "failurePolicy",
        "sideEffects",
        "timeoutSeconds",
        "admissionReviewVersions",
        "reinvocationPolicy",
        "matchPolicy",
    ):
        assert hook[key] == expected[key], key
    assert hook["name"] == WEBHOOK_NAME
    assert hook["objectSelector"]["matchExpressions"][0]["key"] == SERVER_LABEL
    assert hook["clientConfig"]["service"] == {**expected["clientConfig"]["service"]}
    assert hook["clientConfig"]["service"]["path"] == WEBHOOK_PATH

    secret = one(manifests, "Secret", "-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"r-mcp-epoch-webhook.{NS}.svc" in names.get_values_for_type(x509.DNSName)

    extra = one(
        render(helm, None, "webhook.excludeNamespaces={infra}"), "MutatingWebhookConfiguration"
    )
    excluded = extra["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"]
    assert excluded == sorted(["infra", "kube-system", NS])


def test_cert_manager_issues_the_webhook_certificate(helm: Helm) -> None:
    manifests = render(helm, CHART / "ci" / "cert-manager-values.yaml")
    assert not find(manifests, "Secret", "-webhook-tls"), "cert-manager owns the TLS Secret"
    certificate = one(manifests, "Certificate")
    issuer = one(manifests, "Issuer")
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["issuerRef"] == {
        "name": issuer["metadata"]["name"],
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert f"r-mcp-epoch-webhook.{NS}.svc" in certificate["spec"]["dnsNames"]
    operator = one(manifests, "Deployment", "-operator")
    volumes = {v["name"]: v for v in operator["spec"]["template"]["spec"]["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    mwc = one(manifests, "MutatingWebhookConfiguration")
    annotation = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert annotation == f"{NS}/{certificate['metadata']['name']}"
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]

    external = render(helm, CHART / "ci" / "cert-manager-issuer-values.yaml")
    assert not find(external, "Issuer")
    assert one(external, "Certificate")["spec"]["issuerRef"] == {
        "name": "cluster-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


# --------------------------------------------------------------------------- monitoring


def test_service_monitor_and_network_policy_select_the_epoch_service(helm: Helm) -> None:
    manifests = render(helm, CHART / "ci" / "monitoring-values.yaml")
    service = one(manifests, "Service", "-epoch-service")
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NS]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["path"] == "/metrics"
    # The operator's pods are scraped directly, on the port its --metrics-port names.
    pods = one(manifests, "PodMonitor")
    operator_deployment = one(manifests, "Deployment", "-operator")
    template = operator_deployment["spec"]["template"]
    assert pods["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (scrape,) = pods["spec"]["podMetricsEndpoints"]
    container = template["spec"]["containers"][0]
    port = next(p for p in container["ports"] if p["name"] == scrape["port"])
    assert f"--metrics-port={port['containerPort']}" in container["args"]

    policy = one(manifests, "NetworkPolicy")
    epoch = one(manifests, "Deployment", "-epoch-service")
    operator = one(manifests, "Deployment", "-operator")
    assert policy["spec"]["podSelector"]["matchLabels"] == epoch["spec"]["selector"]["matchLabels"]
    (rule,) = policy["spec"]["ingress"]
    peers = rule["from"]
    operator_labels = operator["spec"]["template"]["metadata"]["labels"]
    assert peers[0]["podSelector"]["matchLabels"].items() <= operator_labels.items()
    test_labels = one(manifests, "Pod", "-test")["metadata"]["labels"]
    assert peers[1]["podSelector"]["matchLabels"].items() <= test_labels.items()
    assert peers[2] == {
        "namespaceSelector": {},
        "podSelector": {"matchExpressions": [{"key": SERVER_LABEL, "operator": "Exists"}]},
    }
    assert peers[3]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }


# --------------------------------------------------------------------------- schema


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (["replicas=3"], "additional properties 'replicas' not allowed"),
        (["operator.replicass=2"], "at '/operator': additional properties 'replicass' not allowed"),
        (["epochService.replicas=two"], "at '/epochService/replicas': got string, want integer"),
        (["store.type=mysql"], "at '/store/type'"),
        (["webhook.timeoutSeconds=60"], "at '/webhook/timeoutSeconds'"),
        (["image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
        (["webhook.certManager.issuerRef.kind=Issuer"], "missing property 'name'"),
        (
            ["replicaTokenSecret.namespaces={Not_A_Namespace}"],
            "at '/replicaTokenSecret/namespaces/0'",
        ),
    ],
    ids=[
        "unknown-top-level",
        "unknown-nested",
        "wrong-type",
        "bad-enum",
        "out-of-range",
        "bad-pull-policy",
        "issuer-without-name",
        "bad-namespace",
    ],
)
def test_schema_rejects_bad_values_readably(helm: Helm, sets: list[str], expected: str) -> None:
    with pytest.raises(HelmError) as info:
        render(helm, None, *sets)
    message = info.value.stderr
    assert "values don't meet the specifications of the schema" in message
    assert expected in message, message


# --------------------------------------------------------------------------- helm test


def _test_script(manifests: list[dict[str, Any]]) -> list[str]:
    pod = one(manifests, "Pod", "-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (c,) = pod["spec"]["containers"]
    assert c["command"][:2] == ["python", "-c"]
    return list(c["command"][2:])


def test_helm_test_script_passes_against_a_real_service_and_fails_on_a_wrong_token(
    helm: Helm, epoch_service: EpochServiceProcess
) -> None:
    """The hook pod's own script, run locally against a real epoch service: kwok does not run
    containers, so `helm test` itself cannot execute it here."""
    script = _test_script(render(helm))
    base = {**os.environ, "EPOCH_SERVICE_URL": epoch_service.url, "EPOCH_NAMESPACE": NS}

    def run(token: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", *script],
            env={**base, "REPLICA_TOKEN": token},
            capture_output=True,
            text=True,
            timeout=30,
        )

    ok = run(epoch_service.replica_token)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("ok:")
    refused = run("not-the-token")
    assert refused.returncode != 0
    assert "FAIL: the replica token was refused: 403" in refused.stderr


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_is_pinned_non_root_and_runs_mcp_epoch() -> None:
    """What can be checked without a container engine (none here): pinned base images, a
    numeric non-root user, the entrypoint, and pins for the extras the chart runs."""
    text = (REPO / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert froms, "no FROM"
    for image in froms:
        assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", image), image
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users, "the image must not run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric, so runAsNonRoot can check it"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert int(uid) == values["operator"]["podSecurityContext"]["runAsUser"]
    assert int(uid) == values["epochService"]["podSecurityContext"]["runAsUser"]
    assert re.search(r'^ENTRYPOINT \["mcp-epoch"\]$', text, flags=re.M)
    assert "mcp-epoch[service,mcp,operator]" in text
    # Every dependency comes from uv.lock, with its hashes, through uv at the version the lock
    # itself records; nothing is pinned by hand in the Dockerfile.
    assert "uv export --frozen" in text and "--require-hashes" in text
    assert not re.search(r"^[A-Za-z0-9_.-]+==[0-9]", text, flags=re.M), "a hand-kept pin list"
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    uv_locked = next(p["version"] for p in lock["package"] if p["name"] == "uv")
    assert re.search(rf"^ARG UV_VERSION={re.escape(uv_locked)}$", text, flags=re.M), uv_locked


def test_the_version_has_one_source() -> None:
    """pyproject.toml names the release; the chart's appVersion (its default image tag) must
    say the same, and the Dockerfile takes it as a build argument it checks, never a copy."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    dockerfile = (REPO / "Dockerfile").read_text()
    assert version not in dockerfile
    assert 'org.opencontainers.image.version="${VERSION}"' in dockerfile


def test_the_release_workflow_publishes_where_the_chart_pulls_from() -> None:
    """A user who installs the published chart with its defaults pulls the image the release
    workflow pushed, and the chart from where the README says it is."""
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    image = f"{values['image']['registry']}/{values['image']['repository']}"
    assert workflow["env"]["IMAGE"] == image
    assert "linux/arm64" in json.dumps(workflow)
    readme = (REPO / "README.md").read_text()
    assert f"helm install mcp-epoch {workflow['env']['CHART_REPO']}/mcp-epoch" in readme
