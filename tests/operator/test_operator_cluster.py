"""The operator against the real loopback control plane and a real epoch service process.

The operator runs as ``mcp-epoch operator`` in its own process (stopped and restarted for
real); kwok plays the kubelets, so pods become Running/Ready without containers.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from mcp_epoch_operator.handlers import WATCH_SELECTORS

from tests.cluster.harness import Cluster
from tests.operator.support import (
    EPOCH_ANNOTATION,
    SERVER_LABEL,
    OperatorProcess,
    apply,
    condition,
    env_of,
    get_mcps,
    ledger,
    ledger_states,
    make_namespace,
    mcpserver,
    pods,
    settled,
    wait_for,
)
from tests.support.epochsvc_proc import EpochServiceProcess

pytestmark = pytest.mark.cluster

SETTLE = 60  # seconds; a rollout here takes a few


def _generation(epoch: str) -> int:
    return int(epoch.rsplit("-", 1)[1])


def test_mcpserver_gets_deployment_service_and_live_epochs(
    k8s_cluster: Cluster, running_operator: OperatorProcess, op_service: EpochServiceProcess
) -> None:
    ns = make_namespace(k8s_cluster, "op-basic")
    apply(
        k8s_cluster,
        mcpserver(
            "echo",
            ns,
            replicas=3,
            port=9000,
            resumption={"reconnectWindowSeconds": 60, "eventsPerSecond": 50},
        ),
    )
    state = wait_for(lambda: settled(k8s_cluster, op_service, ns, "echo", 3), SETTLE, "3 live")

    deployment = k8s_cluster.kubectl_json("get", "deployment", "-n", ns, "echo")
    owner = deployment["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("McpServer", "echo", True)
    service = k8s_cluster.kubectl_json("get", "service", "-n", ns, "echo")
    assert service["spec"]["selector"] == {SERVER_LABEL: "echo"}
    assert service["spec"]["ports"][0]["port"] == 9000

    epochs = sorted(state["pods"], key=_generation)
    assert len(set(epochs)) == 3
    ledger_prefix = {e.split("-")[0] for e in epochs}
    assert len(ledger_prefix) == 1
    for epoch, pod in state["pods"].items():
        assert pod["metadata"]["annotations"][EPOCH_ANNOTATION] == epoch
        env = env_of(pod["spec"]["containers"][0])
        assert env["MCP_EPOCH"] == epoch
        assert env["MCP_SERVER_NAME"] == "echo"
        assert env["MCP_EPOCH_SERVICE_URL"] == op_service.url
        assert env["MCP_RESUME_BUFFER_EVENTS"] == "3000"  # 60 s x 50/s
        assert env["MCP_POD_NAME"] == {
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}
        }
        assert env["MCP_POD_UID"]["fieldRef"]["fieldPath"] == "metadata.uid"
        assert env["MCP_SERVER_NAMESPACE"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        # The replica token only ever travels by reference.
        assert env["MCP_EPOCH_SERVICE_TOKEN"] == {
            "secretKeyRef": {"name": "replica-token", "key": "token"}
        }
        assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 9000

    status = state["mcps"]["status"]
    assert status["newestGeneration"] == _generation(epochs[-1])
    assert status["observedGeneration"] == state["mcps"]["metadata"]["generation"]
    assert condition(state["mcps"], "EpochServiceReachable")["status"] == "True"
    assert {e["pod"] for e in status["epochs"]} == {
        p["metadata"]["name"] for p in state["pods"].values()
    }

    printed = k8s_cluster.kubectl("get", "mcps", "-n", ns, "echo").stdout
    assert "NEWEST-GENERATION" in printed and str(status["newestGeneration"]) in printed

    def issued_announced() -> bool:
        events = k8s_cluster.kubectl_json(
            "get", "events", "-n", ns, "--field-selector", "involvedObject.kind=McpServer"
        )["items"]
        return any(e["reason"] == "EpochIssued" for e in events)

    # The epochs of one moment are announced together, a little after their admissions.
    wait_for(issued_announced, 30, "the EpochIssued Event")
    # The operator's own metrics saw the admissions, the issue calls and the reconciles.
    metric = running_operator.metric
    assert metric("mcp_epoch_operator_webhook_seconds_count", outcome="issued") >= 3
    ok = {"call": "issue_batch", "outcome": "ok"}
    assert metric("mcp_epoch_operator_epoch_service_calls_total", **ok) >= 1
    assert metric("mcp_epoch_operator_reconcile_seconds_count", result="ok") >= 1


def test_rollout_retires_old_epochs_and_status_agrees_with_ledger(
    k8s_cluster: Cluster, running_operator: OperatorProcess, op_service: EpochServiceProcess
) -> None:
    ns = make_namespace(k8s_cluster, "op-rollout")
    apply(k8s_cluster, mcpserver("roll", ns, replicas=2))
    first = wait_for(lambda: settled(k8s_cluster, op_service, ns, "roll", 2), SETTLE, "first")
    first_epochs = set(first["pods"])

    # 1. kubectl rollout restart of the owned Deployment (the operator keeps its annotation).
    k8s_cluster.kubectl("rollout", "restart", "-n", ns, "deployment/roll")

    def restarted() -> dict[str, Any] | None:
        state = settled(k8s_cluster, op_service, ns, "roll", 2)
        return state if state and not set(state["pods"]) & first_epochs else None

    second = wait_for(restarted, SETTLE, "new epochs after rollout restart")
    states = ledger_states(op_service, ns, "roll")
    assert all(states[e] == "retired" for e in first_epochs)
    assert min(map(_generation, second["pods"])) > max(map(_generation, first_epochs))

    # 2. A spec change on the McpServer rolls the pods too.
    second_epochs = set(second["pods"])
    apply(k8s_cluster, mcpserver("roll", ns, replicas=2, env=[{"name": "MODE", "value": "b"}]))

    def changed() -> dict[str, Any] | None:
        state = settled(k8s_cluster, op_service, ns, "roll", 2)
        if not state or set(state["pods"]) & second_epochs:
            return None
        return state

    third = wait_for(changed, SETTLE, "new epochs after a spec change")
    for pod in third["pods"].values():
        assert env_of(pod["spec"]["containers"][0])["MODE"] == "b"
    states = ledger_states(op_service, ns, "roll")
    assert all(states[e] == "retired" for e in first_epochs | second_epochs)
    assert {e for e, s in states.items() if s == "live"} == set(third["pods"])
    assert third["mcps"]["status"]["newestGeneration"] == max(map(_generation, third["pods"]))
    assert third["mcps"]["status"]["observedGeneration"] == third["mcps"]["metadata"]["generation"]


def test_scale_subresource_and_the_ledger_follows(
    k8s_cluster: Cluster, running_operator: OperatorProcess, op_service: EpochServiceProcess
) -> None:
    ns = make_namespace(k8s_cluster, "op-scale")
    apply(k8s_cluster, mcpserver("scaled", ns, replicas=1))
    wait_for(lambda: settled(k8s_cluster, op_service, ns, "scaled", 1), SETTLE, "1 replica")

    k8s_cluster.kubectl("scale", "-n", ns, "mcps/scaled", "--replicas=4")
    four = wait_for(lambda: settled(k8s_cluster, op_service, ns, "scaled", 4), SETTLE, "4 live")
    scale_path = f"/apis/mcp.epochs.dev/v1alpha1/namespaces/{ns}/mcpservers/scaled/scale"
    scale = json.loads(k8s_cluster.kubectl("get", "--raw", scale_path).stdout)
    assert scale["spec"]["replicas"] == 4 and scale["status"]["replicas"] == 4
    assert scale["status"]["selector"] == f"{SERVER_LABEL}=scaled"

    k8s_cluster.kubectl("scale", "-n", ns, "mcps/scaled", "--replicas=2")
    two = wait_for(lambda: settled(k8s_cluster, op_service, ns, "scaled", 2), SETTLE, "2 live")
    gone = set(four["pods"]) - set(two["pods"])
    assert len(gone) == 2
    states = ledger_states(op_service, ns, "scaled")
    assert all(states[e] == "retired" for e in gone)


def test_pods_deleted_while_the_operator_is_stopped_are_retired_after_restart(
    k8s_cluster: Cluster, running_operator: OperatorProcess, op_service: EpochServiceProcess
) -> None:
    ns = make_namespace(k8s_cluster, "op-restart")
    apply(k8s_cluster, mcpserver("survivor", ns, replicas=2))
    before = wait_for(lambda: settled(k8s_cluster, op_service, ns, "survivor", 2), SETTLE, "2")
    # A plain labelled pod too: no controller will bring it back.
    loner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "loner", "namespace": ns, "labels": {SERVER_LABEL: "loner"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
    }
    apply(k8s_cluster, loner)
    loner_epoch = wait_for(
        lambda: {e.epoch for e in ledger(op_service, ns, "loner") if e.state == "live"},
        SETTLE,
        "the loner's epoch to be live",
    ).pop()

    running_operator.kill()  # a crash: no shutdown code runs
    k8s_cluster.kubectl("delete", "pod", "-n", ns, "loner", "--wait=true")
    for pod in before["pods"].values():
        k8s_cluster.kubectl("delete", "pod", "-n", ns, pod["metadata"]["name"], "--wait=false")
    wait_for(
        lambda: (
            not {p["metadata"]["uid"] for p in pods(k8s_cluster, ns, "survivor")}
            & {p["metadata"]["uid"] for p in before["pods"].values()}
        ),
        SETTLE,
        "the old pods to be gone",
    )
    # Nobody watched: the ledger still believes in them.
    states = ledger_states(op_service, ns, "survivor")
    assert all(states[e] == "live" for e in before["pods"])

    running_operator.start()
    after = wait_for(lambda: settled(k8s_cluster, op_service, ns, "survivor", 2), SETTLE, "2 again")
    states = ledger_states(op_service, ns, "survivor")
    assert all(states[e] == "retired" for e in before["pods"])
    assert not set(after["pods"]) & set(before["pods"])
    wait_for(
        lambda: ledger_states(op_service, ns, "loner")[loner_epoch] == "retired",
        SETTLE,
        "the loner's epoch to be retired",
    )


def test_epoch_service_down_refuses_labelled_pods_only(
    k8s_cluster: Cluster, running_operator: OperatorProcess, op_service: EpochServiceProcess
) -> None:
    ns = make_namespace(k8s_cluster, "op-down")
    apply(k8s_cluster, mcpserver("fragile", ns, replicas=1))
    wait_for(lambda: settled(k8s_cluster, op_service, ns, "fragile", 1), SETTLE, "1 live")

    def pod(name: str, labels: dict[str, str]) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
            }
        )

    op_service.stop()
    try:
        # fragile's pool was issued before the outage: its epochs were proven then, and a
        # pod admitted now gets one of them.
        pooled = k8s_cluster.kubectl(
            "create", "-f", "-", stdin=pod("pooled", {SERVER_LABEL: "fragile"}), check=False
        )
        assert pooled.returncode == 0, pooled.stderr
        # A server with nothing pooled needs an issue now, and the webhook fails closed.
        began = time.monotonic()
        refused = k8s_cluster.kubectl(
            "create", "-f", "-", stdin=pod("labelled", {SERVER_LABEL: "cold"}), check=False
        )
        # Answered well inside the webhook's 5 s timeout (kubectl's own start-up included).
        assert time.monotonic() - began < 5
        assert refused.returncode != 0
        message = refused.stderr
        assert 'admission webhook "epochs.mcp.epochs.dev" denied the request' in message
        assert "no epoch could be issued for this pod of MCP server op-down/cold" in message
        assert op_service.url in message and "not answering" in message

        plain = k8s_cluster.kubectl("create", "-f", "-", stdin=pod("plain", {"app": "x"}))
        assert plain.returncode == 0
        # Counted as a refused admission after retried, unanswered issue calls.
        metric = running_operator.metric
        assert metric("mcp_epoch_operator_webhook_seconds_count", outcome="refused") >= 1
        unavailable = {"call": "issue_batch", "outcome": "unavailable"}
        assert metric("mcp_epoch_operator_epoch_service_calls_total", **unavailable) >= 1
        assert metric("mcp_epoch_operator_epoch_service_retries_total") >= 1

        def unreachable() -> dict[str, Any] | None:
            cond = condition(get_mcps(k8s_cluster, ns, "fragile"), "EpochServiceReachable")
            return cond if cond.get("status") == "False" else None

        cond = wait_for(unreachable, 30, "EpochServiceReachable=False")
        assert cond["reason"] == "Unreachable" and op_service.url in cond["message"]
        printed = k8s_cluster.kubectl("get", "mcps", "-n", ns, "fragile").stdout
        assert "False" in printed
    finally:
        op_service.start()

    wait_for(
        lambda: (
            condition(get_mcps(k8s_cluster, ns, "fragile"), "EpochServiceReachable").get("status")
            == "True"
        ),
        30,
        "EpochServiceReachable=True again",
    )
    created = k8s_cluster.kubectl(
        "create", "-f", "-", stdin=pod("labelled", {SERVER_LABEL: "fragile"})
    )
    assert created.returncode == 0


def test_plain_labelled_deployment_gets_epochs(
    k8s_cluster: Cluster, running_operator: OperatorProcess, op_service: EpochServiceProcess
) -> None:
    ns = make_namespace(k8s_cluster, "op-plain")
    labels = {"app": "legacy", SERVER_LABEL: "legacy"}
    apply(
        k8s_cluster,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "legacy", "namespace": ns},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {
                        "labels": labels,
                        "annotations": {"mcp.epochs.dev/reconnect-window-seconds": "10"},
                    },
                    "spec": {
                        "terminationGracePeriodSeconds": 1,
                        "initContainers": [
                            {
                                "name": "side",
                                "image": "registry.invalid/s:1",
                                "restartPolicy": "Always",
                            }
                        ],
                        "containers": [
                            {"name": "a", "image": "registry.invalid/a:1"},
                            {
                                "name": "b",
                                "image": "registry.invalid/b:1",
                                "env": [{"name": "MCP_SERVER_NAME", "value": "custom"}],
                            },
                        ],
                    },
                },
            },
        },
    )

    def live_pods() -> list[dict[str, Any]] | None:
        current = pods(k8s_cluster, ns, "legacy")
        live = {e.pod_uid for e in ledger(op_service, ns, "legacy") if e.state == "live"}
        ok = len(current) == 2 and {p["metadata"]["uid"] for p in current} == live
        return current if ok else None

    current = wait_for(live_pods, SETTLE, "2 live epochs for the plain Deployment")
    for pod in current:
        epoch = pod["metadata"]["annotations"][EPOCH_ANNOTATION]
        spec = pod["spec"]
        for container in spec["initContainers"] + spec["containers"]:
            env = env_of(container)
            assert env["MCP_EPOCH"] == epoch, container["name"]
            assert env["MCP_RESUME_BUFFER_EVENTS"] == "1000"  # 10 s x the default 100/s
            assert env["MCP_EPOCH_SERVICE_URL"] == op_service.url
        assert env_of(spec["containers"][1])["MCP_SERVER_NAME"] == "custom"  # kept
        assert env_of(spec["containers"][0])["MCP_SERVER_NAME"] == "legacy"

    # Deleting the Deployment retires its pods' epochs, and leaves none live or draining
    # (the rest are the admission pool's, pending until the service abandons them).
    carried = {p["metadata"]["annotations"][EPOCH_ANNOTATION] for p in current}
    k8s_cluster.kubectl("delete", "deployment", "-n", ns, "legacy")

    def all_retired() -> bool:
        states = ledger_states(op_service, ns, "legacy")
        return all(states[e] == "retired" for e in carried) and not {
            s for s in states.values() if s in ("live", "draining")
        }

    wait_for(all_retired, SETTLE, "every epoch of the deleted Deployment to be retired")


def test_drift_is_corrected_and_dry_runs_issue_nothing(
    k8s_cluster: Cluster, running_operator: OperatorProcess, op_service: EpochServiceProcess
) -> None:
    ns = make_namespace(k8s_cluster, "op-drift")
    apply(k8s_cluster, mcpserver("steady", ns, replicas=1))
    wait_for(lambda: settled(k8s_cluster, op_service, ns, "steady", 1), SETTLE, "1 live")
    before = len(ledger(op_service, ns, "steady"))

    k8s_cluster.kubectl(
        "patch",
        "deployment",
        "-n",
        ns,
        "steady",
        "--type=json",
        "-p",
        json.dumps([{"op": "replace", "path": "/spec/replicas", "value": 3}]),
    )
    k8s_cluster.kubectl("delete", "service", "-n", ns, "steady")
    wait_for(
        lambda: (
            k8s_cluster.kubectl_json("get", "deployment", "-n", ns, "steady")["spec"]["replicas"]
            == 1
        ),
        30,
        "the Deployment's replicas to be put back",
    )
    wait_for(
        lambda: (
            k8s_cluster.kubectl("get", "service", "-n", ns, "steady", check=False).returncode == 0
        ),
        30,
        "the Service to be recreated",
    )
    wait_for(lambda: settled(k8s_cluster, op_service, ns, "steady", 1), SETTLE, "1 live again")

    dry = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "dry", "namespace": ns, "labels": {SERVER_LABEL: "steady"}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
    }
    issued_before = len(ledger(op_service, ns, "steady"))
    proc = k8s_cluster.kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(dry))
    assert "dry run, so no epoch was issued" in proc.stderr
    assert len(ledger(op_service, ns, "steady")) == issued_before
    assert issued_before >= before

    # Deleting the McpServer cascades to what it owns.
    k8s_cluster.kubectl("delete", "mcps", "-n", ns, "steady")
    wait_for(
        lambda: (
            k8s_cluster.kubectl("get", "deployment", "-n", ns, "steady", check=False).returncode
            != 0
        ),
        60,
        "the owned Deployment to be garbage-collected",
    )


INVALID: list[tuple[str, dict[str, Any], list[str]]] = [
    ("no-image", {"replicas": 1}, ["spec.image", "Required value"]),
    ("neg", {"image": "x", "replicas": -1}, ["spec.replicas", "greater than or equal to 0"]),
    ("port", {"image": "x", "port": 70000}, ["spec.port", "less than or equal to 65535"]),
    ("path", {"image": "x", "path": "mcp"}, ["spec.path", "should match"]),
    (
        "env",
        {"image": "x", "env": [{"name": "MCP_EPOCH", "value": "forged"}]},
        ["spec.env", "must not set MCP_EPOCH"],
    ),
    (
        "label",
        {"image": "x", "podLabels": {"mcp.epochs.dev/server": "other"}},
        ["spec.podLabels", "must not set mcp.epochs.dev/server"],
    ),
    (
        "buffer",
        {"image": "x", "resumption": {"reconnectWindowSeconds": 3600, "eventsPerSecond": 1000}},
        ["spec.resumption", "at most 1000000 events"],
    ),
    (
        "surge",
        {"image": "x", "rollingUpdate": {"maxSurge": "lots"}},
        ["spec.rollingUpdate.maxSurge", "percentage"],
    ),
    ("Bad_Name", {"image": "x"}, ["metadata.name", "DNS-1035"]),
]


@pytest.mark.parametrize(("name", "spec", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_api_server_rejects_invalid_mcpservers(
    k8s_cluster: Cluster, crd: object, name: str, spec: dict[str, Any], expected: list[str]
) -> None:
    obj = {
        "apiVersion": "mcp.epochs.dev/v1alpha1",
        "kind": "McpServer",
        "metadata": {
            "name": name.lower() if name != "Bad_Name" else "9bad",
            "namespace": "default",
        },
        "spec": spec,
    }
    proc = k8s_cluster.kubectl(
        "create", "--dry-run=server", "-f", "-", stdin=json.dumps(obj), check=False
    )
    assert proc.returncode != 0, proc.stdout
    for fragment in expected:
        assert fragment in proc.stderr, proc.stderr


def test_the_watches_are_filtered_by_the_api_server(k8s_cluster: Cluster) -> None:
    # The operator's watch selectors, asked of the real API server: exactly the objects its
    # handlers act on come back, so nothing else of the cluster is ever sent to the operator.
    ns = make_namespace(k8s_cluster, "watch-filter")
    managed = {"app.kubernetes.io/managed-by": "mcp-epoch-operator"}
    labels = {
        "served": {SERVER_LABEL: "calc"},
        "owned": {SERVER_LABEL: "calc", **managed},
        "other": {"app": "calc"},
        "bare": {},
    }
    template = {"containers": [{"name": "c", "image": "registry.invalid/c:1"}]}
    objects: list[dict[str, Any]] = []
    for name, these in labels.items():
        meta = {"name": name, "namespace": ns, "labels": these}
        objects.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template})
        objects.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta,
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"pod": name}},
                    "template": {"metadata": {"labels": {"pod": name}}, "spec": template},
                },
            }
        )
    apply(k8s_cluster, *objects)

    def names(kind: str, selector: str) -> set[str]:
        listed = k8s_cluster.kubectl_json("get", kind, "-n", ns, "-l", selector)
        return {item["metadata"]["name"] for item in listed["items"]}

    assert names("pods", WATCH_SELECTORS["v1", "pods"]) == {"served", "owned"}
    assert names("deployments", WATCH_SELECTORS["apps", "v1", "deployments"]) == {"owned"}
