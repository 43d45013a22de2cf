"""The chart against the real loopback control plane (tests/cluster).

1. Every manifest rendered with every values file of ci/ is sent to the API server as a
   server-side dry run with strict field validation: the API server of the pinned version is
   the schema (built-in kinds, the McpServer CRD's structural schema, unknown fields refused).
   That is more faithful than an exported OpenAPI document fed to an offline validator, and
   needs nothing beyond the control plane the suite already runs. cert-manager's and the
   Prometheus Operator's CRDs are not installed here: minimal stand-ins (group, version, kind,
   scope; any spec) are, so those documents get apiVersion/kind/metadata validation only, and
   their fields are asserted in test_chart_render.py instead.
2. ``helm install`` (kwok makes the pods Ready, so ``--wait`` really waits for Available
   Deployments and a Bound claim), then the operator and the epoch service run as local
   processes: the operator with a token of the chart's ServiceAccount and the chart's flags,
   the service with the chart's generated tokens. An McpServer's pods get live epochs.
3. ``helm upgrade`` keeps tokens and certificate; ``helm uninstall`` leaves only the CRD and
   the ledger's claim, as documented.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.charts.support import (
    CHART,
    CI_VALUES,
    ChartOperator,
    Helm,
    ServiceAccountView,
    ledger_volume,
    localize_operator_args,
    parse_manifests,
    serviceaccount_kubeconfig,
)
from tests.cluster.harness import Cluster
from tests.cluster.kube import Kube, status_of
from tests.operator.support import (
    EPOCH_ANNOTATION,
    SERVER_LABEL,
    apply,
    env_of,
    ledger_states,
    make_namespace,
    mcpserver,
    settled,
    wait_for,
)
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.ports import free_port

pytestmark = pytest.mark.cluster

RELEASE = "mcp-epoch"
NS = "mcp-epoch-chart"  # the release namespace
SERVERS_NS = "chart-servers"  # where the McpServer lives; gets a copy of the replica token
VALIDATE_NS = "chart-validate"
OPERATOR_SA = "mcp-epoch-operator"
EPOCHSVC_SA = "mcp-epoch-epoch-service"
PV_NAME = "mcp-epoch-chart-ledger"
SETTLE = 60

#: Stand-ins for CRDs of other projects the chart can render objects for.
THIRD_PARTY_KINDS = [
    ("cert-manager.io", "v1", "Certificate", "certificates"),
    ("cert-manager.io", "v1", "Issuer", "issuers"),
    ("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors"),
    ("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors"),
]

#: (verb, resource, subresource, namespace or None for cluster-wide) the operator needs.
OPERATOR_ALLOWED = [
    ("list", "pods", "", None),
    ("watch", "pods", "", None),
    ("create", "services", "", SERVERS_NS),
    ("patch", "services", "", SERVERS_NS),
    ("create", "events", "", SERVERS_NS),
    ("get", "deployments.apps", "", SERVERS_NS),
    ("list", "deployments.apps", "", None),
    ("watch", "deployments.apps", "", None),
    ("create", "deployments.apps", "", SERVERS_NS),
    ("patch", "deployments.apps", "", SERVERS_NS),
    ("get", "mcpservers.mcp.epochs.dev", "", SERVERS_NS),
    ("list", "mcpservers.mcp.epochs.dev", "", None),
    ("watch", "mcpservers.mcp.epochs.dev", "", None),
    ("patch", "mcpservers.mcp.epochs.dev", "status", SERVERS_NS),
    ("update", "mcpservers.mcp.epochs.dev", "finalizers", SERVERS_NS),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", "", None),
    ("watch", "customresourcedefinitions.apiextensions.k8s.io", "", None),
    ("get", "configmaps/mcp-epoch-operator-servers", "", NS),
    ("patch", "configmaps/mcp-epoch-operator-servers", "", NS),
]
#: What it must not do: above all read Secrets, anywhere, or touch webhook configurations.
OPERATOR_DENIED = [
    ("get", "secrets", "", NS),
    ("list", "secrets", "", NS),
    ("get", "secrets", "", SERVERS_NS),
    ("list", "secrets", "", None),
    ("watch", "secrets", "", None),
    ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io", "", None),
    ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io", "", None),
    ("create", "pods", "", SERVERS_NS),
    ("delete", "pods", "", SERVERS_NS),
    ("get", "pods", "", SERVERS_NS),
    ("delete", "deployments.apps", "", SERVERS_NS),
    ("update", "deployments.apps", "", SERVERS_NS),
    ("patch", "mcpservers.mcp.epochs.dev", "", SERVERS_NS),
    ("delete", "mcpservers.mcp.epochs.dev", "", SERVERS_NS),
    ("get", "configmaps", "", SERVERS_NS),
    ("get", "configmaps/kube-root-ca.crt", "", NS),
    ("create", "configmaps", "", NS),
    ("delete", "configmaps/mcp-epoch-operator-servers", "", NS),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", "", None),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", "", None),
]


def can_i(
    cluster: Cluster, account: str, verb: str, resource: str, sub: str, ns: str | None
) -> bool:
    """``kubectl auth can-i`` as a ServiceAccount (exit 0: yes, 1: no)."""
    args = ["auth", "can-i", verb, resource, f"--as=system:serviceaccount:{NS}:{account}"]
    if sub:
        args.append(f"--subresource={sub}")
    args += ["--all-namespaces"] if ns is None else ["-n", ns]
    proc = cluster.kubectl(*args, check=False)
    assert proc.stdout.strip() in ("yes", "no"), proc.stderr
    return proc.returncode == 0


def stub_crd(group: str, version: str, kind: str, plural: str) -> dict[str, Any]:
    """A CRD that accepts any spec: stands in for another project's CRD."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}", "labels": {"mcp-epoch-test": "stub"}},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def third_party_crds(k8s_cluster: Cluster) -> Iterator[None]:
    apply(k8s_cluster, *(stub_crd(*kind) for kind in THIRD_PARTY_KINDS))
    for _group, _version, _kind, plural in THIRD_PARTY_KINDS:
        k8s_cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{plural}.{_group}", "--timeout=60s"
        )
    yield
    k8s_cluster.kubectl("delete", "crd", "-l", "mcp-epoch-test=stub", "--wait=false")


# --------------------------------------------------------------------------- 1. validation


@pytest.mark.parametrize(
    "values",
    [None, *CI_VALUES],
    ids=["default", *(p.name.removesuffix("-values.yaml") for p in CI_VALUES)],
)
def test_rendered_manifests_pass_strict_server_side_validation(
    k8s_cluster: Cluster, helm: Helm, third_party_crds: None, values: Path | None
) -> None:
    for ns in (VALIDATE_NS, "mcp-servers"):
        make_namespace(k8s_cluster, ns)
    rendered = helm.run(
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        VALIDATE_NS,
        "--include-crds",
        *(["--values", str(values)] if values else []),
    )
    manifests = parse_manifests(rendered)
    proc = k8s_cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-o", "name", "-f", "-", stdin=rendered
    )
    accepted = proc.stdout.split()
    assert len(accepted) == len(manifests), proc.stdout
    assert not proc.stderr.strip(), f"warnings from the API server:\n{proc.stderr}"


# --------------------------------------------------------------------------- 2. install


class Release(NamedTuple):
    """What ``helm install`` made, and what it told the user."""

    manifests: list[dict[str, Any]]
    output: str


@pytest.fixture(scope="module")
def installed(k8s_cluster: Cluster, cluster_helm: Helm) -> Iterator[Release]:
    """The chart installed with its defaults (plus one namespace for the replica token).

    No provisioner runs here, so a hostPath PersistentVolume is made for the ledger's claim.
    """
    make_namespace(k8s_cluster, NS)
    make_namespace(k8s_cluster, SERVERS_NS)
    apply(k8s_cluster, ledger_volume(PV_NAME, "/tmp/mcp-epoch-chart-ledger"))
    notes = cluster_helm.run(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NS,
        "--wait",
        "--timeout=120s",
    )
    manifest = cluster_helm.run("get", "manifest", RELEASE, "--namespace", NS)
    try:
        yield Release(parse_manifests(manifest), notes)
    finally:
        cluster_helm.run("uninstall", RELEASE, "--namespace", NS, "--wait", check=False)
        k8s_cluster.kubectl("delete", "mcpservers", "--all", "-n", SERVERS_NS, check=False)
        k8s_cluster.kubectl("delete", "pvc", "--all", "-n", NS, "--wait=false", check=False)
        k8s_cluster.kubectl(
            "delete", "configmap", "mcp-epoch-operator-servers", "-n", NS, check=False
        )
        k8s_cluster.kubectl("delete", "pv", PV_NAME, "--wait=false", check=False)
        k8s_cluster.kubectl("delete", "namespace", SERVERS_NS, "--wait=false", check=False)


def test_install_creates_every_object(k8s_cluster: Cluster, installed: Release) -> None:
    kinds = sorted(m["kind"] for m in installed.manifests)
    assert kinds == sorted(
        [
            "ClusterRole",
            "ClusterRole",  # the epoch service's: tokenreviews create
            "ClusterRoleBinding",
            "ClusterRoleBinding",
            "ConfigMap",  # the operator's servers record
            "Deployment",
            "Deployment",
            "MutatingWebhookConfiguration",
            "PersistentVolumeClaim",
            "Role",
            "RoleBinding",
            "Secret",  # webhook TLS: no token Secret anywhere
            "Service",
            "Service",
            "ServiceAccount",
            "ServiceAccount",
        ]
    )
    for m in installed.manifests:
        meta = m["metadata"]
        where = ["-n", meta["namespace"]] if meta.get("namespace") else []
        live = k8s_cluster.kubectl_json("get", m["kind"], meta["name"], *where)
        assert live["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    for name in ("mcp-epoch-operator", "mcp-epoch-epoch-service"):
        deployment = k8s_cluster.kubectl_json("get", "deployment", name, "-n", NS)
        assert deployment["status"].get("availableReplicas") == 1, name
    claim = k8s_cluster.kubectl_json("get", "pvc", "mcp-epoch-ledger", "-n", NS)
    assert claim["status"]["phase"] == "Bound"
    crd = k8s_cluster.kubectl_json("get", "crd", "mcpservers.mcp.epochs.dev")
    assert crd["spec"]["group"] == "mcp.epochs.dev"

    # NOTES.txt: where things are, and that there are no credentials to copy.
    notes = installed.output
    assert f"http://mcp-epoch-epoch-service.{NS}.svc:8080" in notes
    assert "Credentials: nothing to copy" in notes and "create secret" not in notes
    assert "PersistentVolumeClaim mcp-epoch-ledger is kept on `helm uninstall`" in notes


def test_service_accounts_have_exactly_the_documented_permissions(
    k8s_cluster: Cluster, installed: Release, tmp_path: Path
) -> None:
    wrong = [
        (verb, resource, sub, ns, expected)
        for expected, table in ((True, OPERATOR_ALLOWED), (False, OPERATOR_DENIED))
        for verb, resource, sub, ns in table
        if can_i(k8s_cluster, OPERATOR_SA, verb, resource, sub, ns) != expected
    ]
    assert not wrong, f"operator permissions differ (verb, resource, sub, ns, expected): {wrong}"
    for verb, resource in (("list", "pods"), ("get", "secrets"), ("create", "events")):
        assert not can_i(k8s_cluster, EPOCHSVC_SA, verb, resource, "", NS), (verb, resource)
    assert can_i(k8s_cluster, EPOCHSVC_SA, "create", "tokenreviews.authentication.k8s.io", "", "")

    # The same, as real requests with the operator's token: Secrets are refused everywhere.
    kubeconfig = serviceaccount_kubeconfig(k8s_cluster, NS, OPERATOR_SA, tmp_path / "kc")
    with Kube(kubeconfig) as operator:
        for call in (
            lambda: operator.core.read_namespaced_secret("mcp-epoch-webhook-tls", NS),
            lambda: operator.core.list_namespaced_secret(NS),
            lambda: operator.core.list_secret_for_all_namespaces(),
        ):
            assert status_of(call) == 403
        pods = operator.core.list_pod_for_all_namespaces
        listed = operator.json(pods, label_selector=SERVER_LABEL)
        assert listed["kind"] == "PodList"


def mint_token(cluster: Cluster, namespace: str, account: str, audience: str | None = None) -> str:
    """A ServiceAccount token from the API server (TokenRequest), as the kubelet gets one."""
    with cluster.api() as api:
        return api.mint_token(namespace, account, [audience] if audience else None)


def _foreign_webhooks(cluster: Cluster) -> list[str]:
    """Other MutatingWebhookConfigurations that would also inject epochs into labelled pods."""
    configs = cluster.kubectl_json("get", "mutatingwebhookconfigurations")["items"]
    return [
        c["metadata"]["name"]
        for c in configs
        if c["metadata"]["name"] != RELEASE and SERVER_LABEL in json.dumps(c.get("webhooks"))
    ]


def test_operator_with_the_chart_credentials_gives_mcpserver_pods_epochs(
    k8s_cluster: Cluster, installed: Release, tmp_path: Path
) -> None:
    """The operator's scenario, run under the chart's ServiceAccount with the chart's flags
    and tokens: kwok runs no containers, so the chart's own pods never execute."""
    foreign = _foreign_webhooks(k8s_cluster)
    assert not foreign, (
        f"another operator's webhook is registered ({foreign}): it would issue epochs too; run "
        "tests/charts before tests/operator (the default order) or in a session of its own"
    )
    # Both run under the chart's accounts with tokens their API server mints, as the kubelet
    # would mount them: the service reviews tokens with the chart's RBAC and nothing more.
    epochsvc = k8s_cluster.kubectl_json("get", "deployment", "mcp-epoch-epoch-service", "-n", NS)
    svc_env = {
        e["name"]: e["value"]
        for e in epochsvc["spec"]["template"]["spec"]["containers"][0]["env"]
        if "value" in e and e["name"].startswith("EPOCHSVC_") and "URL" not in e["name"]
    }
    assert svc_env["EPOCHSVC_AUTH"] == "kubernetes"
    own_token = tmp_path / "epoch-service-token"
    own_token.write_text(mint_token(k8s_cluster, NS, EPOCHSVC_SA))
    service = EpochServiceProcess(
        f"sqlite:///{tmp_path}/ledger.db",
        tmp_path / "epochsvc.log",
        **svc_env,
        EPOCHSVC_KUBE_API_URL=k8s_cluster.server,
        EPOCHSVC_KUBE_CA_FILE=str(k8s_cluster.ca_cert),
        EPOCHSVC_KUBE_TOKEN_FILE=str(own_token),
    )
    token_file = tmp_path / "operator-token"
    token_file.write_text(
        mint_token(k8s_cluster, NS, OPERATOR_SA, svc_env["EPOCHSVC_TOKEN_AUDIENCE"])
    )
    service.operator_token = token_file.read_text()
    deployment = k8s_cluster.kubectl_json("get", "deployment", "mcp-epoch-operator", "-n", NS)
    chart_args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    in_cluster_url = f"http://mcp-epoch-epoch-service.{NS}.svc:8080"
    assert f"--replica-epoch-service-url={in_cluster_url}" in chart_args
    port = free_port()

    # The API server cannot reach the webhook Service (no pod network): point the chart's
    # configuration, selectors and policies unchanged, at the local process instead.
    mwc = k8s_cluster.kubectl_json("get", "mutatingwebhookconfiguration", RELEASE)
    original = mwc["webhooks"][0]["clientConfig"]
    local_client = {
        "url": f"https://127.0.0.1:{port}/inject-epoch",
        "caBundle": base64.b64encode(k8s_cluster.ca_cert.read_bytes()).decode(),
    }

    def set_client(client: dict[str, Any]) -> None:
        patch = [{"op": "replace", "path": "/webhooks/0/clientConfig", "value": client}]
        k8s_cluster.kubectl(
            "patch", "mutatingwebhookconfiguration", RELEASE, "--type=json", "-p", json.dumps(patch)
        )

    view = ServiceAccountView(
        k8s_cluster, serviceaccount_kubeconfig(k8s_cluster, NS, OPERATOR_SA, tmp_path / "kc")
    )
    args = localize_operator_args(
        chart_args,
        {
            "--epoch-service-url": "",  # filled in once the service has its port
            "--operator-token-file": str(token_file),
            "--webhook-host": "127.0.0.1",
            "--webhook-port": str(port),
            "--webhook-cert": str(k8s_cluster.webhook_cert),
            "--webhook-key": str(k8s_cluster.webhook_key),
            "--resync-interval": "2",
            "--health-endpoint": f"http://127.0.0.1:{free_port()}/healthz",
        },
    )
    operator: ChartOperator | None = None
    set_client(local_client)
    try:
        service.start()
        args = localize_operator_args(args, {"--epoch-service-url": service.url})
        operator = ChartOperator(view, service, port, tmp_path / "operator.log", args)
        operator.start()

        apply(k8s_cluster, mcpserver("echo", SERVERS_NS, replicas=2))
        state = wait_for(
            lambda: settled(k8s_cluster, service, SERVERS_NS, "echo", 2), SETTLE, "2 live epochs"
        )
        for epoch, pod in state["pods"].items():
            assert pod["metadata"]["annotations"][EPOCH_ANNOTATION] == epoch
            env = env_of(pod["spec"]["containers"][0])
            assert env["MCP_EPOCH"] == epoch
            assert env["MCP_EPOCH_SERVICE_URL"] == in_cluster_url
            # Its own projected token for the epoch service, nothing copied from a Secret.
            assert env["MCP_EPOCH_SERVICE_TOKEN_FILE"] == "/var/run/secrets/mcp.epochs.dev/token"
            assert "MCP_EPOCH_SERVICE_TOKEN" not in env
            volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
            (source,) = volumes["mcp-epoch-token"]["projected"]["sources"]
            assert source["serviceAccountToken"]["audience"] == "mcp-epoch"

        # A pod goes away: its epoch is retired, the replacement gets a new live one.
        gone = next(iter(state["pods"]))
        victim = state["pods"][gone]["metadata"]["name"]
        k8s_cluster.kubectl("delete", "pod", victim, "-n", SERVERS_NS, "--wait=false")
        after = wait_for(
            lambda: (
                (s := settled(k8s_cluster, service, SERVERS_NS, "echo", 2))
                and gone not in s["pods"]
                and s
            ),
            SETTLE,
            "a replacement pod with a new live epoch",
        )
        wait_for(
            lambda: ledger_states(service, SERVERS_NS, "echo").get(gone) == "retired",
            SETTLE,
            f"epoch {gone} retired",
        )
        assert len(after["pods"]) == 2

        # The operator remembered the server in the ConfigMap the chart made for it.
        record = k8s_cluster.kubectl_json(
            "get", "configmap", "mcp-epoch-operator-servers", "-n", NS
        )
        assert f"{SERVERS_NS}.echo" in (record.get("data") or {})

        log = operator.tail(2000)
        # A 403 status, not the digits inside a port, an id or a timestamp (":40379", and the
        # milliseconds of "05:23:03,403", each once failed this check).
        refused = [
            line
            for line in log.splitlines()
            if "Forbidden" in line or re.search(r"(?<![\w:.,])403(?![\w.])", line)
        ]
        assert not refused, "refused calls:\n" + "\n".join(refused)
    finally:
        if operator is not None:
            if operator.proc is not None:
                print(f"----- operator log (tail) -----\n{operator.tail(60)}")
            operator.stop()
        k8s_cluster.kubectl("delete", "mcpserver", "echo", "-n", SERVERS_NS, check=False)
        service.stop()
        set_client(original)


# --------------------------------------------------------------------------- 3. upgrade, uninstall


def _release_state(cluster: Cluster) -> dict[str, Any]:
    secrets = cluster.kubectl_json(
        "get", "secrets", "-A", "-l", f"app.kubernetes.io/instance={RELEASE}"
    )["items"]
    mwc = cluster.kubectl_json("get", "mutatingwebhookconfiguration", RELEASE)
    epochsvc = cluster.kubectl_json("get", "deployment", "mcp-epoch-epoch-service", "-n", NS)
    return {
        "secrets": {
            f"{s['metadata']['namespace']}/{s['metadata']['name']}": s["data"] for s in secrets
        },
        "caBundle": mwc["webhooks"][0]["clientConfig"]["caBundle"],
        "epochsvc_template": epochsvc["spec"]["template"],
    }


def test_upgrade_keeps_secrets_and_uninstall_leaves_only_the_documented(
    k8s_cluster: Cluster, cluster_helm: Helm, installed: Release
) -> None:
    # What the operator writes into its ConfigMap must survive upgrades.
    k8s_cluster.kubectl(
        "patch",
        "configmap",
        "mcp-epoch-operator-servers",
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"data": {"team.server": ""}}),
    )
    before = _release_state(k8s_cluster)
    assert list(before["secrets"]) == [f"{NS}/mcp-epoch-webhook-tls"]  # no token Secrets
    tls = before["secrets"][f"{NS}/mcp-epoch-webhook-tls"]
    assert before["caBundle"] == tls["ca.crt"]

    cluster_helm.run(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "operator.resyncIntervalSeconds=15",
        "--wait",
        "--timeout=120s",
    )
    after = _release_state(k8s_cluster)
    assert after["secrets"] == before["secrets"], "the generated certificate changed"
    assert after["caBundle"] == before["caBundle"]
    record = k8s_cluster.kubectl_json("get", "configmap", "mcp-epoch-operator-servers", "-n", NS)
    assert "team.server" in record["data"]
    # An unrelated change: the epoch service (and its SQLite lock) is not restarted.
    assert after["epochsvc_template"] == before["epochsvc_template"]
    operator = k8s_cluster.kubectl_json("get", "deployment", "mcp-epoch-operator", "-n", NS)
    assert "--resync-interval=15" in operator["spec"]["template"]["spec"]["containers"][0]["args"]

    cluster_helm.run("uninstall", RELEASE, "--namespace", NS, "--wait", "--timeout=120s")
    kinds = k8s_cluster.kubectl("api-resources", "--verbs=list", "-o", "name").stdout.split()
    left = k8s_cluster.kubectl_json(
        "get", ",".join(kinds), "-A", "-l", f"app.kubernetes.io/instance={RELEASE}"
    )["items"]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in left) == [
        ("ConfigMap", "mcp-epoch-operator-servers"),
        ("PersistentVolumeClaim", "mcp-epoch-ledger"),
    ], "only the ledger's claim and the operator's record of it (resource-policy keep) remain"
    k8s_cluster.kubectl("get", "crd", "mcpservers.mcp.epochs.dev")  # CRDs are never deleted
