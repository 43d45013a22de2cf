"""Proof that the loopback control plane is the real thing.

Each test exercises behaviour that only the upstream components provide:
the Deployment and ReplicaSet controllers, the scheduler, OpenAPI schema
validation of custom resources, admission webhook dispatch with object
selectors, RBAC and ServiceAccount tokens, and helm against the cache.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import versions
from tests.cluster.harness import Cluster, wait_until
from tests.cluster.kube import ApiException, status_of
from tests.cluster.kwok_stages import PROBER_LABEL, PROBER_VALUE
from tests.e2e.prober import with_readiness

pytestmark = pytest.mark.cluster


# --------------------------------------------------------------------------- helpers


def apply(cluster: Cluster, *objects: dict[str, Any]) -> None:
    """``kubectl apply`` a list of objects given as dicts."""
    body = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))


def namespace(cluster: Cluster, name: str, labels: dict[str, str] | None = None) -> str:
    """Create a namespace for one test, so tests never see each other's pods."""
    apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": labels or {}},
        },
    )
    return name


def pod_ready(pod: dict[str, Any]) -> bool:
    """Running phase and a True Ready condition, as a kubelet would report."""
    status = pod.get("status", {})
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    return status.get("phase") == "Running" and ready


def pods(cluster: Cluster, ns: str, selector: str) -> list[dict[str, Any]]:
    """Pods of a namespace matching a label selector."""
    return list(cluster.kubectl_json("get", "pods", "-n", ns, "-l", selector)["items"])


def simple_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod with a placeholder image: kwok never pulls it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }


# --------------------------------------------------------------------------- basics


def test_server_reports_pinned_version(k8s_cluster: Cluster) -> None:
    """The binaries carry the release version stamps, not v0.0.0-master."""
    info = k8s_cluster.kubectl_json("version")
    assert info["serverVersion"]["gitVersion"] == versions.KUBERNETES
    assert info["clientVersion"]["gitVersion"] == versions.KUBERNETES


def test_fake_nodes_are_ready(k8s_cluster: Cluster) -> None:
    """kwok adopted the annotated nodes and keeps them Ready."""
    nodes = k8s_cluster.kubectl_json("get", "nodes", "-l", "type=kwok")["items"]
    assert len(nodes) == k8s_cluster.nodes
    for node in nodes:
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["Ready"] == "True", node["metadata"]["name"]


# --------------------------------------------------------------------------- deployments


def deployment(name: str, replicas: int, version: str) -> dict[str, Any]:
    """A Deployment whose template changes with ``version``."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "app",
                            "image": f"registry.invalid/app:{version}",
                            "env": [{"name": "APP_VERSION", "value": version}],
                        }
                    ],
                },
            },
        },
    }


def _all_ready(cluster: Cluster, ns: str, count: int, image: str) -> bool:
    current = pods(cluster, ns, "app=web")
    return len(current) == count and all(
        pod_ready(p) and p["spec"]["containers"][0]["image"] == image for p in current
    )


def test_deployment_rolls_out_and_rolls_over(k8s_cluster: Cluster) -> None:
    """3 replicas become Running+Ready; a template change replaces all of
    them and the old pods terminate and disappear from the API."""
    ns = namespace(k8s_cluster, "ctl-deploy")
    manifest = deployment("web", 3, "1") | {"metadata": {"name": "web", "namespace": ns}}
    apply(k8s_cluster, manifest)
    k8s_cluster.kubectl("rollout", "status", "-n", ns, "deployment/web", "--timeout=120s")
    wait_until(lambda: _all_ready(k8s_cluster, ns, 3, "registry.invalid/app:1"), 60, "3 ready pods")
    old = {p["metadata"]["name"] for p in pods(k8s_cluster, ns, "app=web")}
    assert len(old) == 3
    assert all(
        p["spec"].get("nodeName", "").startswith("kwok-node-")
        for p in pods(k8s_cluster, ns, "app=web")
    ), "scheduler placed the pods"

    updated = deployment("web", 3, "2") | {"metadata": {"name": "web", "namespace": ns}}
    apply(k8s_cluster, updated)
    k8s_cluster.kubectl("rollout", "status", "-n", ns, "deployment/web", "--timeout=120s")

    def old_gone() -> bool:
        names = {p["metadata"]["name"] for p in pods(k8s_cluster, ns, "app=web")}
        return not (names & old)

    wait_until(old_gone, 90, "old pods to disappear")
    wait_until(lambda: _all_ready(k8s_cluster, ns, 3, "registry.invalid/app:2"), 60, "new pods")
    replicasets = k8s_cluster.kubectl_json("get", "rs", "-n", ns, "-l", "app=web")["items"]
    assert sorted(rs["spec"]["replicas"] for rs in replicasets) == [0, 3]
    k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false")


# --------------------------------------------------------------------------- CRD validation


WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.harness.mcp-epoch.test"},
    "spec": {
        "group": "harness.mcp-epoch.test",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["replicas"],
                                "properties": {
                                    "replicas": {"type": "integer", "minimum": 1},
                                    "colour": {"type": "string", "enum": ["red", "blue"]},
                                },
                            }
                        },
                    }
                },
            }
        ],
    },
}


def test_crd_schema_rejects_invalid_object(k8s_cluster: Cluster) -> None:
    """The API server itself (not kubectl) refuses an object breaking the schema."""
    apply(k8s_cluster, WIDGET_CRD)
    k8s_cluster.kubectl(
        "wait", "--for=condition=Established", "crd/widgets.harness.mcp-epoch.test", "--timeout=60s"
    )

    def widget(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "apiVersion": "harness.mcp-epoch.test/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": spec,
        }

    group = ("harness.mcp-epoch.test", "v1", "default", "widgets")
    with k8s_cluster.api() as api:
        # Discovery of a new CRD can lag its Established condition by a moment.
        wait_until(
            lambda: status_of(lambda: api.custom.list_namespaced_custom_object(*group)) == 200,
            30,
            "widgets to be served",
        )
        with pytest.raises(ApiException) as refused:
            api.custom.create_namespaced_custom_object(
                *group, widget("bad", {"replicas": 0, "colour": "green"})
            )
        created = api.json(
            api.custom.create_namespaced_custom_object,
            *group,
            widget("good", {"replicas": 2, "colour": "red"}),
        )
    assert refused.value.status == 422, refused.value.body
    body = json.loads(refused.value.body)
    assert body["reason"] == "Invalid"
    message = body["message"]
    assert 'Widget.harness.mcp-epoch.test "bad" is invalid' in message
    assert "spec.replicas" in message and "greater than or equal to 1" in message
    assert "spec.colour" in message and "Unsupported value" in message

    proc = k8s_cluster.kubectl(
        "create", "-f", "-", stdin=json.dumps(widget("bad2", {"replicas": "three"})), check=False
    )
    assert proc.returncode != 0
    assert "spec.replicas" in proc.stderr and "must be of type integer" in proc.stderr
    assert created["spec"] == {"replicas": 2, "colour": "red"}


# --------------------------------------------------------------------------- admission webhook


@dataclass
class WebhookRecorder:
    """A tiny mutating webhook on 127.0.0.1 that records who called it."""

    cert: Path
    key: Path
    seen: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """The address registered in the webhook configuration."""
        assert self.server is not None
        return f"https://127.0.0.1:{self.server.server_address[1]}/mutate"

    def review(self, request: dict[str, Any]) -> dict[str, Any]:
        """Admit the pod and add an annotation via JSONPatch."""
        obj = request["object"]
        meta = obj.get("metadata", {})
        self.seen.append(meta.get("name") or meta.get("generateName", "?"))
        if meta.get("annotations"):
            patch = [
                {"op": "add", "path": "/metadata/annotations/harness.test~1mutated", "value": "yes"}
            ]
        else:
            patch = [
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {"harness.test/mutated": "yes"},
                }
            ]
        return {
            "uid": request["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        }

    def start(self) -> None:
        """Serve TLS with the harness's webhook certificate in a thread."""
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                review = json.loads(self.rfile.read(length))
                answer = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": recorder.review(review["request"]),
                }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Shut the server down."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def webhook(k8s_cluster: Cluster) -> Iterator[WebhookRecorder]:
    """A running webhook recorder, registered for labelled pods in one namespace."""
    recorder = WebhookRecorder(k8s_cluster.webhook_cert, k8s_cluster.webhook_key)
    recorder.start()
    ns = namespace(k8s_cluster, "ctl-webhook", {"harness-webhook": "on"})
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "harness-recorder"},
        "webhooks": [
            {
                "name": "recorder.harness.mcp-epoch.test",
                "clientConfig": {
                    "url": recorder.url,
                    "caBundle": base64.b64encode(k8s_cluster.ca_cert.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {"matchLabels": {"harness-webhook": "on"}},
                "objectSelector": {"matchLabels": {"inject": "yes"}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
            }
        ],
    }
    apply(k8s_cluster, config)
    try:
        yield recorder
    finally:
        k8s_cluster.kubectl(
            "delete", "mutatingwebhookconfiguration", "harness-recorder", "--ignore-not-found"
        )
        k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false")
        recorder.stop()


def _create_pod(cluster: Cluster, ns: str, pod: dict[str, Any], dry_run: bool = False) -> None:
    args = ["create", "-n", ns, "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    cluster.kubectl(*args, stdin=json.dumps(pod))


def test_mutating_webhook_called_for_selected_pods_only(
    k8s_cluster: Cluster, webhook: WebhookRecorder
) -> None:
    """A labelled pod reaches the webhook and stores its patch; an
    unlabelled pod in the same namespace never reaches it."""
    ns = "ctl-webhook"
    probe = simple_pod("probe", {"inject": "yes"})

    # The API server picks up webhook configurations asynchronously; a
    # server-side dry run calls the webhook without storing anything.
    def active() -> bool:
        _create_pod(k8s_cluster, ns, probe, dry_run=True)
        return "probe" in webhook.seen

    wait_until(active, 30, "the webhook configuration to take effect", interval=0.5)

    _create_pod(k8s_cluster, ns, simple_pod("plain", {"inject": "no"}))
    _create_pod(k8s_cluster, ns, simple_pod("labelled", {"inject": "yes"}))

    assert "labelled" in webhook.seen
    assert "plain" not in webhook.seen
    stored = k8s_cluster.kubectl_json("get", "pod", "-n", ns, "labelled")
    assert stored["metadata"]["annotations"]["harness.test/mutated"] == "yes"
    plain = k8s_cluster.kubectl_json("get", "pod", "-n", ns, "plain")
    assert "harness.test/mutated" not in (plain["metadata"].get("annotations") or {})
    wait_until(
        lambda: pod_ready(k8s_cluster.kubectl_json("get", "pod", "-n", ns, "labelled")),
        60,
        "the mutated pod to be Ready",
    )


# --------------------------------------------------------------------------- readiness


def _condition_of(pod: dict[str, Any], kind: str) -> str | None:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c.get("status") for c in conditions if c.get("type") == kind), None)


def test_pods_labelled_for_the_runner_start_unready_until_it_reports(
    k8s_cluster: Cluster,
) -> None:
    """kwok starts a labelled pod Running with a pod IP and its container not ready, and keeps
    what the runner then writes; an unlabelled pod next to it is Ready at once."""
    ns = namespace(k8s_cluster, "ctl-readiness")
    _create_pod(k8s_cluster, ns, simple_pod("probed", {PROBER_LABEL: PROBER_VALUE}))
    _create_pod(k8s_cluster, ns, simple_pod("plain"))
    api = k8s_cluster.api()

    def get(name: str) -> dict[str, Any]:
        pod: dict[str, Any] = api.json(api.core.read_namespaced_pod, name, ns)
        return pod

    def running(name: str) -> dict[str, Any] | None:
        pod = get(name)
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    wait_until(
        lambda: running("probed") is not None and running("plain") is not None,
        60,
        "both pods Running",
    )
    wait_until(lambda: pod_ready(get("plain")), 60, "the plain pod Ready")
    probed = get("probed")
    assert probed["status"]["podIP"]
    assert _condition_of(probed, "Ready") == "False"
    assert _condition_of(probed, "ContainersReady") == "False"
    assert [c["ready"] for c in probed["status"]["containerStatuses"]] == [False]
    assert probed["status"]["containerStatuses"][0]["state"]["running"]

    status = with_readiness(probed["status"], "app", True)
    api.patch(api.core.patch_namespaced_pod_status, "probed", ns, body={"status": status})
    now = get("probed")
    api.close()
    assert pod_ready(now) and _condition_of(now, "ContainersReady") == "True"
    assert now["status"]["podIP"] == probed["status"]["podIP"]
    k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false")


# --------------------------------------------------------------------------- RBAC


def test_rbac_refuses_serviceaccount_without_role(k8s_cluster: Cluster) -> None:
    """RBAC is enforced: by impersonation and with a real token."""
    ns = namespace(k8s_cluster, "ctl-rbac")
    for sa in ("nobody", "reader"):
        k8s_cluster.kubectl("create", "serviceaccount", "-n", ns, sa)
    k8s_cluster.kubectl(
        "create", "role", "-n", ns, "pod-reader", "--verb=get,list", "--resource=pods"
    )
    k8s_cluster.kubectl(
        "create",
        "rolebinding",
        "-n",
        ns,
        "reader",
        "--role=pod-reader",
        f"--serviceaccount={ns}:reader",
    )

    def can_i(user: str) -> str:
        proc = k8s_cluster.kubectl(
            "auth",
            "can-i",
            "list",
            "pods",
            "-n",
            ns,
            f"--as=system:serviceaccount:{ns}:{user}",
            check=False,
        )
        return proc.stdout.strip()

    assert can_i("nobody") == "no"
    wait_until(lambda: can_i("reader") == "yes", 30, "the RoleBinding to apply")

    # A real token from the TokenRequest API, signed with the harness's SA key.
    token = k8s_cluster.kubectl("create", "token", "-n", ns, "nobody").stdout.strip()
    denied = _get_with_token(k8s_cluster, f"/api/v1/namespaces/{ns}/pods", token)
    assert denied[0] == 403, denied
    assert (
        f'"system:serviceaccount:{ns}:nobody" cannot list resource "pods"' in denied[1]["message"]
    )
    token = k8s_cluster.kubectl("create", "token", "-n", ns, "reader").stdout.strip()
    assert _get_with_token(k8s_cluster, f"/api/v1/namespaces/{ns}/pods", token)[0] == 200
    k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false")


def _get_with_token(cluster: Cluster, path: str, token: str) -> tuple[int, Any]:
    """GET as a bearer-token client (no client certificate)."""
    import urllib.error
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(cluster.ca_cert))
    req = urllib.request.Request(
        cluster.server + path, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


# --------------------------------------------------------------------------- helm


def _helm(cluster: Cluster, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the cached helm with its state kept under ``home``."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    return subprocess.run(
        [str(cluster.binary("helm")), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_helm_runs_from_cache(k8s_cluster: Cluster, tmp_path: Path) -> None:
    """helm version and helm template work; the chart also installs for real."""
    version = _helm(k8s_cluster, tmp_path, "version", "--short")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith(versions.HELM), version.stdout

    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    rendered = _helm(k8s_cluster, tmp_path, "template", "rel", str(chart), "--set", "greeting=hi")
    assert rendered.returncode == 0, rendered.stderr
    assert "name: rel-cm" in rendered.stdout and 'greeting: "hi"' in rendered.stdout

    installed = _helm(
        k8s_cluster,
        tmp_path,
        "install",
        "rel",
        str(chart),
        "-n",
        "ctl-helm",
        "--create-namespace",
        "--wait",
        "--timeout",
        "60s",
    )
    assert installed.returncode == 0, installed.stderr
    cm = k8s_cluster.kubectl_json("get", "configmap", "-n", "ctl-helm", "rel-cm")
    assert cm["data"] == {"greeting": "hello"}
    _helm(k8s_cluster, tmp_path, "uninstall", "rel", "-n", "ctl-helm")


def test_second_cluster_coexists(k8s_cluster: Cluster) -> None:
    """Free ports per run: a second control plane starts beside the first."""
    with Cluster(nodes=1, log=lambda _msg: None) as other:
        assert other.ports.apiserver != k8s_cluster.ports.apiserver
        names = {n["metadata"]["name"] for n in other.kubectl_json("get", "nodes")["items"]}
        assert names == {"kwok-node-0"}
        pids = [p.pid for p in other.processes]
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert k8s_cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"


def test_api_client_is_admin(k8s_cluster: Cluster) -> None:
    """The tests' client authenticates as a system:masters member."""
    with k8s_cluster.api() as api:
        review = api.json(
            api.authentication.create_self_subject_review,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
    assert "system:masters" in review["status"]["userInfo"]["groups"]
