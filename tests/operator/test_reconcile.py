"""The reconciler in-process: :mod:`mcp_epoch_operator.reconcile` and the runtime's sweep, with
a fake API server and a fake ledger (both in memory, recording every call), so each rule is
checked without a cluster. The same code runs against the real control plane in
test_operator_cluster.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from mcp_epoch_operator import events, reconcile
from mcp_epoch_operator.config import OperatorConfig
from mcp_epoch_operator.kube import KubeError
from mcp_epoch_operator.names import EPOCH_ANNOTATION, SERVER_LABEL
from mcp_epoch_operator.resources import ReplicaDefaults
from mcp_epoch_operator.runtime import Runtime

from epochsvc.service import keyring
from epochsvc.service.routers.request_state import status_of
from mcp_epoch.api import Call, Epoch, EpochList, Readiness, RingStatus
from mcp_epoch.api_client import EpochServiceError, EpochServiceUnavailable
from mcp_epoch.contract import ROTATE_ANNOTATION

NS = "team"


class FakeKube:
    """The calls the operator makes, answered from dicts; every write is recorded."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.mcpservers: dict[tuple[str, str], dict[str, Any]] = {}
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.applied: list[tuple[str, str, str]] = []
        self.statuses: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.selectors: list[str] = []
        self.fail_apply = False

    async def list_pods(self, namespace: str | None, label_selector: str) -> list[Any]:
        self.selectors.append(label_selector)
        key, _, value = label_selector.partition("=")
        labels = [(p, (p["metadata"].get("labels") or {})) for p in self.pods]
        return [
            p
            for p, lab in labels
            if key in lab
            and (not value or lab[key] == value)
            and (namespace is None or p["metadata"]["namespace"] == namespace)
        ]

    async def list_mcpservers(self, namespace: str | None) -> list[Any]:
        return [m for (ns, _), m in self.mcpservers.items() if namespace in (None, ns)]

    async def get_mcpserver(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.mcpservers.get((namespace, name))

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.deployments.get((namespace, name))

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.configmaps.get((namespace, name))

    async def annotate_deployment(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> None:
        meta = self.deployments[(namespace, name)]["metadata"]
        meta.setdefault("annotations", {}).update(annotations)

    async def patch_configmap(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        cm = self.configmaps.get((namespace, name))
        if cm is None:
            raise KubeError(404, {"message": "not found"})
        data = cm.setdefault("data", {})
        for k, v in patch["data"].items():
            if v is None:
                data.pop(k, None)
            else:
                data[k] = v

    async def create_configmap(self, namespace: str, body: dict[str, Any]) -> None:
        self.configmaps[(namespace, body["metadata"]["name"])] = body

    async def apply_deployment(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        if self.fail_apply:
            raise KubeError(422, {"message": "spec.template: Invalid value"})
        self.applied.append(("Deployment", namespace, name))

    async def apply_service(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.applied.append(("Service", namespace, name))

    async def patch_mcpserver_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        self.statuses.append(status)
        self.mcpservers[(namespace, name)]["status"] = status

    async def post_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str
    ) -> None:
        self.events.append((type_, reason, message))

    async def aclose(self) -> None:
        pass


LEDGER_ID = "abcd1234" * 4


class FakeLedger:
    """The epoch service's answers for one namespace, from a list of epoch dicts."""

    def __init__(self) -> None:
        self.epochs: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.down = False
        #: The request-state ring (the service's own rotation rules), and what each pod holds.
        self.ring: keyring.Ring | None = None
        self.holding: dict[str, int | None] = {}

    def add(self, server: str, generation: int, state: str, pod_uid: str | None = None) -> str:
        epoch = f"abcd1234-{generation}"
        self.epochs[epoch] = {
            "epoch": epoch,
            "generation": generation,
            "namespace": NS,
            "server": server,
            "state": state,
            "pod_name": None,
            "pod_uid": pod_uid,
            "incarnation": None,
            "process_epoch": None,
            "revision": generation,
            "address": None,
            "created_at": 0.0,
            "updated_at": 0.0,
        }
        return epoch

    async def send(self, call: Call[Any], policy: Any = None) -> Any:
        """Answer the calls the reconciler makes: lifecycle verbs, a server's list, readiness."""
        if self.down:
            raise EpochServiceUnavailable("connection refused")
        parts = call.path.strip("/").split("/")
        if call.path == "/readyz":
            return Readiness(status="ready", ledger_id=LEDGER_ID)
        if parts[:2] == ["v1", "servers"] and parts[4:5] == ["request-state"]:
            return self._ring_call(parts[3], parts[5:])
        if parts[:2] == ["v1", "servers"]:
            epochs = [Epoch(**e) for e in self.epochs.values() if e["server"] == parts[3]]
            return EpochList(ledger_id=LEDGER_ID, revision=1, epochs=epochs)
        _, _, epoch, verb = parts
        self.calls.append((verb, epoch))
        entry = self.epochs[epoch]
        target = {"bind": "live", "drain": "draining", "retire": "retired"}[verb]
        if verb == "drain" and entry["state"] == "retired":
            raise EpochServiceError(409, "illegal-transition", "already retired")
        entry.update(state=target)
        if verb == "bind":
            body = call.json() or {}
            entry.update(
                pod_name=body["pod_name"], pod_uid=body["pod_uid"], address=body.get("address")
            )
        return Epoch(**entry)

    def _ring_call(self, server: str, verb: list[str]) -> RingStatus:
        holders = [keyring.Holder(pod, rev) for pod, rev in sorted(self.holding.items())]
        step = None
        if self.ring is not None and verb == ["rotate"]:
            self.calls.append(("rotate", server))
            self.ring = keyring.start_rotation(self.ring, time.time())
        elif self.ring is not None and verb == ["advance"]:
            self.calls.append(("advance", server))
            step = keyring.advance(self.ring, holders, time.time())
            self.ring = step.ring
        return status_of(NS, server, self.ring, holders, 600.0, step)

    async def aclose(self) -> None:
        pass


def pod(name: str, server: str, epoch: str | None, *, ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {SERVER_LABEL: server},
            "annotations": {EPOCH_ANNOTATION: epoch} if epoch else {},
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.9",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def mcpserver(name: str, generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "mcp.epochs.dev/v1alpha1",
        "kind": "McpServer",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"mcps-{name}",
            "generation": generation,
        },
        "spec": {"image": "registry.invalid/echo:1", "replicas": 1},
    }


@pytest.fixture
def world() -> Iterator[tuple[Runtime, FakeKube, FakeLedger]]:
    kube, ledger = FakeKube(), FakeLedger()
    config = OperatorConfig(
        namespaces=None,
        epoch_service_url="http://epochs.test:8080",
        operator_token="t",
        replica=ReplicaDefaults(service_url="http://epochs.test:8080"),
        operator_namespace="mcp-epoch-system",
    )
    rt = Runtime(config, kube, ledger)  # type: ignore[arg-type]
    yield rt, kube, ledger


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def settle(rt: Runtime) -> None:
    """Let the fire-and-forget Events and ConfigMap writes finish."""
    while rt.events.background:
        await asyncio.gather(*rt.events.background)


def test_an_mcpserver_is_applied_once_per_generation_and_gets_its_status(world: Any) -> None:
    rt, kube, ledger = world
    kube.mcpservers[(NS, "echo")] = mcpserver("echo")
    epoch = ledger.add("echo", 1, "live", pod_uid="uid-echo-0")
    kube.pods.append(pod("echo-0", "echo", epoch))

    async def scenario() -> None:
        await reconcile.sync_server(rt, (NS, "echo"), reapply=False)
        await reconcile.sync_server(rt, (NS, "echo"), reapply=False)

    run(scenario())
    assert kube.applied == [("Deployment", NS, "echo"), ("Service", NS, "echo")]
    assert len(kube.statuses) == 1  # the second pass found nothing to change
    status = kube.statuses[0]
    assert [e["epoch"] for e in status["epochs"]] == [epoch]
    kube.mcpservers[(NS, "echo")]["metadata"]["generation"] = 2
    run(reconcile.sync_server(rt, (NS, "echo"), reapply=False))
    assert len(kube.applied) == 4


def test_a_failed_apply_is_a_warning_event_and_a_status_problem(world: Any) -> None:
    rt, kube, _ = world
    kube.mcpservers[(NS, "echo")] = mcpserver("echo")
    kube.fail_apply = True

    async def scenario() -> None:
        await reconcile.sync_server(rt, (NS, "echo"), reapply=False)
        await settle(rt)

    run(scenario())
    assert [e[:2] for e in kube.events] == [("Warning", "ReconcileFailed")]
    assert "Invalid value" in str(kube.statuses[-1])
    assert (NS, "echo") not in rt.applied  # retried at the next reconcile


def test_resync_retires_an_epoch_whose_pod_is_gone_and_announces_it_once(world: Any) -> None:
    rt, kube, ledger = world
    gone = ledger.add("plain", 1, "live", pod_uid="uid-vanished")
    kube.deployments[(NS, "plain")] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "plain", "namespace": NS},
    }

    async def scenario() -> None:
        await reconcile.sync_server(rt, (NS, "plain"), reapply=False)
        await reconcile.run_calls(rt, (NS, "plain"), [])  # nothing more to do
        await settle(rt)

    run(scenario())
    assert ledger.calls == [("retire", gone)]
    assert [e[1] for e in kube.events] == ["EpochRetired"]
    # A second retirement of the same epoch (the watch also saw the pod go) is not announced.
    rt.events.retired((NS, "plain"), gone, "p")
    run(settle(rt))
    assert [e[1] for e in kube.events] == ["EpochRetired"]


def test_a_server_with_nothing_left_is_forgotten(world: Any) -> None:
    rt, kube, ledger = world
    ledger.add("old", 1, "retired")
    kube.configmaps[("mcp-epoch-system", "mcp-epoch-operator-servers")] = {
        "metadata": {"name": "mcp-epoch-operator-servers"},
        "data": {f"{NS}.old": ""},
    }

    async def scenario() -> None:
        rt.mark(NS, "old")
        await settle(rt)
        await reconcile.sync_server(rt, (NS, "old"), reapply=False)

    run(scenario())
    assert (NS, "old") not in rt.known
    cm = kube.configmaps[("mcp-epoch-system", "mcp-epoch-operator-servers")]
    assert f"{NS}.old" not in cm["data"]


def test_an_unreachable_service_postpones_the_calls_and_shows_in_the_status(world: Any) -> None:
    rt, kube, ledger = world
    kube.mcpservers[(NS, "echo")] = mcpserver("echo")
    epoch = ledger.add("echo", 1, "pending")
    kube.pods.append(pod("echo-0", "echo", epoch))
    ledger.down = True
    run(reconcile.pod_event(rt, "ADDED", kube.pods[0]))
    assert ledger.calls == [] and not rt.reach.reachable
    run(reconcile.sync_server(rt, (NS, "echo"), reapply=False))
    conditions = {c["type"]: c["status"] for c in kube.statuses[-1]["conditions"]}
    assert conditions["EpochServiceReachable"] == "False"
    ledger.down = False
    run(reconcile.pod_event(rt, "MODIFIED", kube.pods[0]))
    assert ledger.calls == [("bind", epoch)] and rt.reach.reachable
    assert ledger.epochs[epoch]["state"] == "live"


def test_the_sweep_lists_labelled_objects_only_and_finds_recorded_servers(world: Any) -> None:
    rt, kube, _ = world
    kube.pods.append(pod("a-0", "a", None))
    kube.pods.append({"metadata": {"name": "unrelated", "namespace": NS, "uid": "u"}})
    kube.mcpservers[(NS, "b")] = mcpserver("b")
    kube.configmaps[("mcp-epoch-system", "mcp-epoch-operator-servers")] = {
        "metadata": {"name": "mcp-epoch-operator-servers"},
        "data": {f"{NS}.c": ""},
    }

    async def scenario() -> None:
        await rt.sweep()
        await settle(rt)

    run(scenario())
    assert rt.known == {(NS, "a"), (NS, "b"), (NS, "c")}
    assert set(rt.dirty) == rt.known
    assert kube.selectors == [SERVER_LABEL]  # the API server filters; nothing unlabelled
    cm = kube.configmaps[("mcp-epoch-system", "mcp-epoch-operator-servers")]
    assert set(cm["data"]) == {f"{NS}.a", f"{NS}.b", f"{NS}.c"}


def test_warnings_about_one_server_are_not_repeated_within_the_interval(world: Any) -> None:
    rt, kube, _ = world
    kube.mcpservers[(NS, "echo")] = mcpserver("echo")

    async def scenario() -> None:
        for _ in range(5):
            rt.events.post((NS, "echo"), "Warning", "EpochIssueFailed", "refused")
            await settle(rt)
        rt.events.post((NS, "echo"), "Warning", "OtherReason", "refused")
        await settle(rt)

    run(scenario())
    assert [e[1] for e in kube.events] == ["EpochIssueFailed", "OtherReason"]


def test_epochs_issued_together_are_announced_in_one_event(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollout's admissions: one Event per server for the epochs of one moment, naming the
    first ten, never an Event per pod."""
    rt, kube, _ = world
    monkeypatch.setattr(events, "ISSUED_EVENT_INTERVAL", 0.05)
    kube.mcpservers[(NS, "echo")] = mcpserver("echo")
    kube.mcpservers[(NS, "other")] = mcpserver("other")

    async def scenario() -> None:
        for g in range(12, 0, -1):
            rt.events.issued((NS, "echo"), f"0123abcd-{g}", g)
        rt.events.issued((NS, "other"), "0123abcd-13", 13)
        deadline = time.monotonic() + 10
        while len(kube.events) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # polled: the announcement is on the loop's timer
            await settle(rt)

    run(scenario())
    assert [e[1] for e in kube.events] == ["EpochIssued", "EpochIssued"]
    echo = next(e for e in kube.events if "12 new pods" in e[2])
    assert "0123abcd-1 (generation 1), 0123abcd-2 (generation 2)" in echo[2]
    assert "and 2 more" in echo[2] and "0123abcd-11" not in echo[2]
    assert any("0123abcd-13 (generation 13) for a new pod of" in e[2] for e in kube.events)


def test_a_ring_rotation_is_begun_on_demand_stepped_as_pods_report_and_shown(
    world: Any,
) -> None:
    rt, kube, ledger = world
    ledger.ring = keyring.Ring(NS, "echo", 1, keyring.Phase.STEADY, (b"k" * 32,), 0.0, 0.0)
    ledger.holding = {"echo-0": 1, "echo-1": 1}
    kube.mcpservers[(NS, "echo")] = server = mcpserver("echo")
    sync = reconcile.sync_server

    def ring_status() -> tuple[dict[str, Any], dict[str, Any]]:
        current = kube.mcpservers[(NS, "echo")]["status"]
        cond = next(c for c in current["conditions"] if c["type"] == "RequestStateRing")
        return current["requestState"], cond

    async def scenario() -> None:
        await sync(rt, (NS, "echo"), reapply=False)  # steady, nothing asked
        assert ("rotate", "echo") not in ledger.calls
        state, cond = ring_status()
        assert (state["phase"], state["podsAtRevision"], cond["reason"]) == ("steady", 2, "Steady")

        server["metadata"]["annotations"] = {ROTATE_ANNOTATION: "2026-12-02"}
        await sync(rt, (NS, "echo"), reapply=False)
        state, cond = ring_status()
        assert state["phase"] == "adding" and state["rotationRequest"] == "2026-12-02"
        assert cond["reason"] == "Rotating"
        await sync(rt, (NS, "echo"), reapply=False)  # nobody holds revision 2: no step
        state, _ = ring_status()
        assert state["phase"] == "adding" and state["behind"] == ["echo-0", "echo-1"]

        for phase, revision in (("switching", 2), ("switching", 3), ("steady", 3)):
            ledger.holding = dict.fromkeys(ledger.holding, revision)
            await sync(rt, (NS, "echo"), reapply=False)
            assert ring_status()[0]["phase"] == phase
        await sync(rt, (NS, "echo"), reapply=False)  # the same annotation: no second rotation
        await settle(rt)

    run(scenario())
    assert ledger.calls.count(("rotate", "echo")) == 1
    assert ledger.ring is not None and ledger.ring.revision == 4
    assert len(ledger.ring.keys) == 1 and ledger.ring.keys[0] != b"k" * 32
    reasons = [reason for _, reason, _ in kube.events if reason.startswith("RequestState")]
    assert reasons == [
        "RequestStateRotationStarted",
        "RequestStateRotationAdvanced",
        "RequestStateRotated",
    ]
    assert all("kkkk" not in message for _, _, message in kube.events)


def test_a_pod_that_never_catches_up_stalls_the_rotation_loudly_and_keeps_the_keys(
    world: Any,
) -> None:
    rt, kube, ledger = world
    steady = keyring.Ring(NS, "echo", 1, keyring.Phase.STEADY, (b"k" * 32,), 0.0, 0.0)
    ledger.ring = keyring.start_rotation(steady, time.time() - 3600)  # began an hour ago
    ledger.holding = {"echo-0": 2, "echo-1": 1}
    kube.mcpservers[(NS, "echo")] = mcpserver("echo")

    async def scenario() -> None:
        for _ in range(2):
            await reconcile.sync_server(rt, (NS, "echo"), reapply=False)
        await settle(rt)

    run(scenario())
    current = kube.mcpservers[(NS, "echo")]["status"]
    cond = next(c for c in current["conditions"] if c["type"] == "RequestStateRing")
    assert (cond["status"], cond["reason"]) == ("False", "RotationStalled")
    assert "echo-1" in cond["message"] and current["requestState"]["behind"] == ["echo-1"]
    assert ledger.ring.phase is keyring.Phase.ADDING and len(ledger.ring.keys) == 2
    stalls = [r for t, r, _ in kube.events if r == "RequestStateRotationStalled"]
    assert stalls == ["RequestStateRotationStalled"]  # once, not once per pass


def test_the_stalled_gauge_follows_the_rotation_and_goes_with_the_server(world: Any) -> None:
    """``mcp_epoch_operator_request_state_rotation_stalled`` (what the alert reads): 1 while
    a pod lags the rotation past the stall time, 0 once it catches up, and no series at all
    once the server is gone (a stale 1 would alert forever)."""
    rt, kube, ledger = world
    steady = keyring.Ring(NS, "echo", 1, keyring.Phase.STEADY, (b"k" * 32,), 0.0, 0.0)
    ledger.ring = keyring.start_rotation(steady, time.time() - 3600)  # began an hour ago
    ledger.holding = {"echo-0": 2, "echo-1": 1}
    kube.mcpservers[(NS, "echo")] = mcpserver("echo")

    def stalled() -> float | None:
        """The gauge's sample for team/echo, as a scrape would read it (None: no series)."""
        (family,) = rt.metrics.rotation_stalled.collect()
        found = [s.value for s in family.samples if s.labels == {"namespace": NS, "server": "echo"}]
        return found[0] if found else None

    async def scenario() -> None:
        await reconcile.sync_server(rt, (NS, "echo"), reapply=False)
        assert stalled() == 1.0
        ledger.holding = dict.fromkeys(ledger.holding, 2)  # the laggard loads revision 2
        await reconcile.sync_server(rt, (NS, "echo"), reapply=False)
        assert stalled() == 0.0
        del kube.mcpservers[(NS, "echo")]
        ledger.epochs.clear()
        await reconcile.sync_server(rt, (NS, "echo"), reapply=False)
        assert stalled() is None
        await settle(rt)

    run(scenario())


def test_a_plain_deployment_is_rotated_by_its_annotation_once_per_value(world: Any) -> None:
    rt, kube, ledger = world
    ledger.ring = keyring.Ring(NS, "plain", 1, keyring.Phase.STEADY, (b"k" * 32,), 0.0, 0.0)
    ledger.holding = {"plain-0": 1}
    kube.pods.append(pod("plain-0", "plain", ledger.add("plain", 1, "live", "uid-plain-0")))
    kube.deployments[(NS, "plain")] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "plain", "namespace": NS, "annotations": {}},
    }
    annotations = kube.deployments[(NS, "plain")]["metadata"]["annotations"]

    async def scenario() -> None:
        await reconcile.sync_server(rt, (NS, "plain"), reapply=False)
        assert ("rotate", "plain") not in ledger.calls
        annotations[ROTATE_ANNOTATION] = "now"
        for _ in range(3):  # the value is recorded as handled: one rotation, not three
            await reconcile.sync_server(rt, (NS, "plain"), reapply=False)
        await settle(rt)

    run(scenario())
    assert ledger.calls.count(("rotate", "plain")) == 1
    assert annotations[f"{ROTATE_ANNOTATION}-handled"] == "now"
    assert ledger.ring is not None and ledger.ring.phase is keyring.Phase.ADDING
    assert any(reason == "RequestStateRotationStarted" for _, reason, _ in kube.events)
