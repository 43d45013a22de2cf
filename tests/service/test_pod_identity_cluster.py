"""Per-pod identity against the real control plane: ServiceAccount tokens minted by its API
server (TokenRequest, bound to real Pod objects), verified by the epoch service with
TokenReview under nothing but a ClusterRole for ``tokenreviews`` create."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from kubernetes import client

from mcp_epoch.contract import TOKEN_AUDIENCE
from tests.cluster.harness import Cluster
from tests.support.epochsvc_proc import EpochServiceProcess

pytestmark = pytest.mark.cluster


@dataclass
class Pod:
    namespace: str
    name: str
    uid: str
    token: str


class Api:
    """The admin's view of the control plane, for setting the scene."""

    def __init__(self, cluster: Cluster) -> None:
        self.kube = cluster.api()

    def account(self, namespace: str, name: str) -> None:
        body = {"metadata": {"name": name}}
        self.kube.json(self.kube.core.create_namespaced_service_account, namespace, body)

    def token(
        self,
        namespace: str,
        account: str,
        *,
        audiences: list[str] | None = None,
        pod: dict[str, Any] | None = None,
    ) -> str:
        return self.kube.mint_token(namespace, account, audiences, pod=pod, seconds=600)

    def create_pod(self, namespace: str, name: str, account: str = "server") -> dict[str, Any]:
        body = {
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": account,
                "containers": [{"name": "mcp", "image": "mcp-server:test"}],
            },
        }
        created: dict[str, Any] = self.kube.json(
            self.kube.core.create_namespaced_pod, namespace, body
        )
        return created

    def pod(self, namespace: str, name: str, account: str = "server") -> Pod:
        created = self.create_pod(namespace, name, account)
        token = self.token(namespace, account, audiences=[TOKEN_AUDIENCE], pod=created)
        return Pod(namespace, name, created["metadata"]["uid"], token)

    def delete_pod(self, pod: Pod) -> None:
        core = self.kube.core
        self.kube.json(core.delete_namespaced_pod, pod.name, pod.namespace, grace_period_seconds=0)
        deadline = time.monotonic() + 30
        while self.kube.find(core.read_namespaced_pod, pod.name, pod.namespace) is not None:
            assert time.monotonic() < deadline, f"pod {pod.name} was never removed"
            time.sleep(0.1)


@dataclass
class Scene:
    svc: EpochServiceProcess
    operator: str
    pods: dict[str, Pod]
    epochs: dict[str, str]  # pod key -> its bound epoch
    api: Api
    others: dict[str, str]  # tokens that stand for nobody here


@pytest.fixture(scope="module")
def scene(k8s_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    api = Api(k8s_cluster)
    run = secrets.token_hex(3)
    system, ns_a, ns_b = f"pid-sys-{run}", f"pid-a-{run}", f"pid-b-{run}"
    for ns in (system, ns_a, ns_b):
        api.kube.json(api.kube.core.create_namespace, {"metadata": {"name": ns}})
    for ns in (ns_a, ns_b):
        api.account(ns, "server")
    api.account(system, "epoch-service")
    api.account(system, "operator")
    # The epoch service gets exactly one right: to ask the API server about tokens.
    role = f"pid-tokenreview-{run}"
    rbac = client.RbacAuthorizationV1Api(api.kube.client)
    api.kube.json(
        rbac.create_cluster_role,
        {
            "metadata": {"name": role},
            "rules": [
                {
                    "apiGroups": ["authentication.k8s.io"],
                    "resources": ["tokenreviews"],
                    "verbs": ["create"],
                }
            ],
        },
    )
    api.kube.json(
        rbac.create_cluster_role_binding,
        {
            "metadata": {"name": role},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [{"kind": "ServiceAccount", "name": "epoch-service", "namespace": system}],
        },
    )
    work = tmp_path_factory.mktemp("pod-identity")
    own = work / "epoch-service.token"
    own.write_text(api.token(system, "epoch-service"))
    svc = EpochServiceProcess(
        f"sqlite:///{work / 'ledger.db'}",
        work / "epochsvc.log",
        EPOCHSVC_AUTH="kubernetes",
        EPOCHSVC_KUBE_API_URL=k8s_cluster.server,
        EPOCHSVC_KUBE_CA_FILE=str(k8s_cluster.ca_cert),
        EPOCHSVC_KUBE_TOKEN_FILE=str(own),
        EPOCHSVC_OPERATOR_SERVICE_ACCOUNT=f"{system}/operator",
        EPOCHSVC_TOKEN_CACHE_SECONDS="1",
    ).start()
    operator = api.token(system, "operator", audiences=[TOKEN_AUDIENCE])
    pods = {
        "a1": api.pod(ns_a, "a1"),  # server s1 in namespace A
        "a2": api.pod(ns_a, "a2"),  # server s2 in namespace A
        "b1": api.pod(ns_b, "b1"),  # server s1 in namespace B
        "stray": api.pod(ns_a, "stray"),  # a pod of no MCP server
    }
    servers = {"a1": "s1", "a2": "s2", "b1": "s1"}
    epochs = {}
    with svc.client(operator) as op:
        for key, server in servers.items():
            pod = pods[key]
            body = {"namespace": pod.namespace, "server": server, "request_uid": f"r-{key}"}
            epoch = op.post("/v1/epochs", json=body).json()["epoch"]
            op.post(
                f"/v1/epochs/{epoch}/bind", json={"pod_name": pod.name, "pod_uid": pod.uid}
            ).raise_for_status()
            epochs[key] = epoch
    others = {
        # The API server's own audience: a token for the cluster, not for this service.
        "wrong-audience": api.token(
            ns_a, "server", pod=api.create_pod(ns_a, f"aud-{secrets.token_hex(3)}")
        ),
        # The right audience, but bound to no pod and not the operator.
        "unbound": api.token(ns_a, "server", audiences=[TOKEN_AUDIENCE]),
        "garbage": "not.a.token",
    }
    try:
        yield Scene(svc, operator, pods, epochs, api, others)
    finally:
        svc.stop()
        api.kube.close()


def register(scene: Scene, pod: str, epoch_of: str, body: Any = None) -> httpx.Response:
    with scene.svc.client(scene.pods[pod].token) as c:
        return c.post(f"/v1/epochs/{scene.epochs[epoch_of]}/incarnations", json=body)


def incarnation(scene: Scene, key: str) -> int | None:
    with scene.svc.client(scene.operator) as op:
        value = op.get(f"/v1/epochs/{scene.epochs[key]}").json()["incarnation"]
    return None if value is None else int(value)


def test_a_pod_registers_only_for_its_own_epoch(scene: Scene) -> None:
    own = register(scene, "a1", "a1")
    assert own.status_code == 201, own.text
    assert own.json()["process_epoch"] == f"{scene.epochs['a1']}.0"
    assert own.json()["epoch"]["pod_uid"] is None  # not even its own UID is echoed
    assert register(scene, "a2", "a2").status_code == 201
    before = {key: incarnation(scene, key) for key in ("a2", "b1")}
    # The attack of the first release: one POST, no body, at someone else's epoch.
    attacks = [
        register(scene, "a1", "a2"),  # same namespace, other server
        register(scene, "a1", "b1"),  # across namespaces
        register(scene, "a1", "a2", {"pod_uid": scene.pods["a2"].uid}),  # naming the victim
        register(scene, "stray", "b1"),
    ]
    for answer in attacks:
        assert answer.status_code == 403, answer.text
        assert answer.json()["code"] in ("not-your-epoch", "forbidden")
        assert all(p.uid not in answer.text for p in scene.pods.values())
    # The victims' processes are still the newest incarnations: nobody superseded them.
    assert {key: incarnation(scene, key) for key in ("a2", "b1")} == before


def test_a_pod_reads_only_its_own_servers_epochs(scene: Scene) -> None:
    a1, b1 = scene.pods["a1"], scene.pods["b1"]
    with scene.svc.client(a1.token) as c:
        mine = c.get(f"/v1/servers/{a1.namespace}/s1/epochs")
        assert mine.status_code == 200
        assert [e["epoch"] for e in mine.json()["epochs"]] == [scene.epochs["a1"]]
        assert all(e["pod_uid"] is None for e in mine.json()["epochs"])
        assert c.get(f"/v1/epochs/{scene.epochs['a1']}").status_code == 200
        for path in (
            f"/v1/servers/{a1.namespace}/s2/epochs",
            f"/v1/servers/{b1.namespace}/s1/epochs",  # the same server name elsewhere
            f"/v1/epochs/{scene.epochs['a2']}",
            f"/v1/epochs/{scene.epochs['b1']}.0",
        ):
            denied = c.get(path)
            assert denied.status_code == 403, (path, denied.text)
            assert all(p.uid not in denied.text for p in scene.pods.values())
    with scene.svc.client(b1.token) as c:
        assert c.get(f"/v1/servers/{b1.namespace}/s1/epochs").status_code == 200
    with scene.svc.client(scene.pods["stray"].token) as c:
        stray = c.get(f"/v1/servers/{a1.namespace}/s1/epochs")
        assert stray.status_code == 403 and stray.json()["code"] == "not-bound"


def test_a_pod_loads_only_its_own_servers_request_state_keys(scene: Scene) -> None:
    a1, b1 = scene.pods["a1"], scene.pods["b1"]
    ring = f"/v1/servers/{a1.namespace}/s1/request-state/ring"
    with scene.svc.client(a1.token) as c:
        mine = c.get(ring)
        assert mine.status_code == 200, mine.text
        keys = mine.json()["keys"]
        for path in (
            f"/v1/servers/{a1.namespace}/s2/request-state/ring",
            f"/v1/servers/{b1.namespace}/s1/request-state/ring",  # the same name elsewhere
        ):
            denied = c.get(path)
            assert denied.status_code == 403, (path, denied.text)
            assert "keys" not in denied.json()
        process = register(scene, "a1", "a1").json()["process_epoch"]
        held = c.put(f"/v1/epochs/{process}/request-state", json={"revision": 1})
        assert held.status_code == 200, held.text
        other = register(scene, "b1", "b1").json()["process_epoch"]
        forged = c.put(f"/v1/epochs/{other}/request-state", json={"revision": 1})
        assert forged.status_code == 403 and forged.json()["code"] == "not-your-epoch"
    with scene.svc.client(b1.token) as c:
        theirs = c.get(f"/v1/servers/{b1.namespace}/s1/request-state/ring").json()["keys"]
    assert theirs != keys  # one ring per server, not per name
    # The operator steers rotations and sees who holds what, never a key.
    with scene.svc.client(scene.operator) as op:
        assert op.get(ring).status_code == 403
        status = op.get(f"/v1/servers/{a1.namespace}/s1/request-state")
        assert status.status_code == 200 and keys[0] not in status.text
        assert {"pod": "a1", "revision": 1} in status.json()["holders"]
    for token in scene.others.values():
        with scene.svc.client(token) as c:
            assert c.get(ring).status_code == 403


def test_the_operators_account_works_and_nothing_else_does(scene: Scene) -> None:
    body = {"namespace": scene.pods["a1"].namespace, "server": "s1", "request_uid": "r-new"}
    with scene.svc.client(scene.operator) as op:
        issued = op.post("/v1/epochs", json=body)
        assert issued.status_code == 201, issued.text
        seen = op.get(f"/v1/epochs/{scene.epochs['a1']}").json()
        assert seen["pod_uid"] == scene.pods["a1"].uid  # the operator alone sees UIDs
    others = [p.token for p in scene.pods.values()] + list(scene.others.values())
    for token in others:
        with scene.svc.client(token) as c:
            assert c.post("/v1/epochs", json=body).status_code == 403
            assert c.post(f"/v1/epochs/{scene.epochs['a1']}/drain").status_code == 403
    for name, token in scene.others.items():
        with scene.svc.client(token) as c:
            answer = c.get(f"/v1/servers/{body['namespace']}/s1/epochs")
            assert answer.status_code == 403, name
            assert answer.json()["code"] == "forbidden"


def test_a_pod_hands_on_only_its_own_sessions_and_only_within_its_server(scene: Scene) -> None:
    a1, b1 = scene.pods["a1"], scene.pods["b1"]
    peer = scene.api.pod(a1.namespace, f"a3-{secrets.token_hex(2)}")  # another pod of s1
    with scene.svc.client(scene.operator) as op:
        body = {"namespace": peer.namespace, "server": "s1", "request_uid": f"r-{peer.name}"}
        peer_epoch = op.post("/v1/epochs", json=body).json()["epoch"]
        op.post(
            f"/v1/epochs/{peer_epoch}/bind", json={"pod_name": peer.name, "pod_uid": peer.uid}
        ).raise_for_status()
    processes = {}
    for key, pod, epoch in (
        ("a1", a1, scene.epochs["a1"]),
        ("a2", scene.pods["a2"], scene.epochs["a2"]),
        ("b1", b1, scene.epochs["b1"]),
        ("peer", peer, peer_epoch),
    ):
        with scene.svc.client(pod.token) as c:
            answer = c.post(f"/v1/epochs/{epoch}/incarnations")
            assert answer.status_code == 201, answer.text
            processes[key] = answer.json()["process_epoch"]

    def hand(by: Pod, owner: str, to: str) -> httpx.Response:
        with scene.svc.client(by.token) as c:
            return c.put(f"/v1/epochs/{processes[owner]}/successor", json={"successor": to})

    # Another pod of the same server cannot hand a1's sessions anywhere, nor claim them.
    stolen = hand(peer, "a1", processes["peer"])
    assert stolen.status_code == 403 and stolen.json()["code"] == "not-your-epoch"
    # a1 hands only within its own server: not to s2, not to s1 of another namespace.
    for other in ("a2", "b1"):
        refused = hand(a1, "a1", processes[other])
        assert refused.status_code == 403 and refused.json()["code"] == "illegal-handoff"
        assert all(p.uid not in refused.text for p in scene.pods.values())
    with scene.svc.client(scene.operator) as op:
        rule = op.get(f"/v1/epochs/{scene.epochs['a1']}").json()
    assert rule["successor"] is None
    ok = hand(a1, "a1", processes["peer"])
    assert ok.status_code == 200, ok.text
    assert ok.json()["successor"] == processes["peer"] and ok.json()["pod_uid"] is None
    # The peer now sees the rule in its own server's epochs; the other server does not.
    with scene.svc.client(peer.token) as c:
        listed = c.get(f"/v1/servers/{a1.namespace}/s1/epochs").json()["epochs"]
    assert {e["epoch"]: e["successor"] for e in listed}[scene.epochs["a1"]] == processes["peer"]


def _refused_within(scene: Scene, pod: Pod, path: str, seconds: float) -> bool:
    """Wait until the service refuses the token itself (``forbidden``, not a read it may
    not make): its cache may keep an earlier answer for the cache period."""
    deadline = time.monotonic() + seconds
    with scene.svc.client(pod.token) as c:
        while time.monotonic() < deadline:
            answer = c.get(path)
            if answer.status_code == 403 and answer.json()["code"] == "forbidden":
                return True
            assert answer.status_code == 200, answer.text
            time.sleep(0.1)
    return False


def test_a_deleted_pods_token_is_refused(scene: Scene) -> None:
    b1 = scene.pods["b1"]
    with scene.svc.client(b1.token) as c:
        assert c.get(f"/v1/servers/{b1.namespace}/s1/epochs").status_code == 200
    scene.api.delete_pod(b1)
    # Once its epoch retires the pod's token is refused at once, although the API server may
    # still accept it for a while (it caches token reviews for 10 s).
    with scene.svc.client(scene.operator) as op:
        op.post(f"/v1/epochs/{scene.epochs['b1']}/retire").raise_for_status()
    with scene.svc.client(b1.token) as c:
        gone = c.get(f"/v1/servers/{b1.namespace}/s1/epochs")
        assert gone.status_code == 403, gone.text
        assert register(scene, "b1", "b1").status_code == 403


def test_a_deleted_pods_token_is_refused_even_before_its_epoch_retires(scene: Scene) -> None:
    a2 = scene.pods["a2"]
    path = f"/v1/servers/{a2.namespace}/s2/epochs"
    with scene.svc.client(a2.token) as c:
        assert c.get(path).status_code == 200
    scene.api.delete_pod(a2)
    # No retire: the API server's cache (10 s) and ours (1 s here) stand between deletion
    # and refusal.
    assert _refused_within(scene, a2, path, 30.0)


def test_refusals_are_counted(scene: Scene) -> None:
    with httpx.Client(base_url=scene.svc.url) as c:
        text = c.get("/metrics").text
    assert 'epochsvc_auth_refused_total{code="forbidden"}' in text
