"""Multi-round-trip requests (MCP 2026-07-28) on the loopback control plane: the real SDK on
both sides (``mcp.Client`` at 2026-07-28; the demo replica's ``MCPServer`` as the pods of an
``McpServer``), a balancer that routes every request round-robin over the Service's ready
endpoints (no affinity), so every retry lands on another pod than the one that sealed it.

With the server's key ring (``mcp_epoch.request_state_security()``), retries keep working
while ``kubectl rollout restart`` replaces every pod and while the operator rotates the ring,
begun by annotating the McpServer in the middle of the traffic. With the SDK's ephemeral keys,
the control, the same traffic through the same rollout fails on every retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from epochsvc.demo.balancer import Balancer
from mcp_epoch.contract import ENV_RING_REFRESH, ROTATE_ANNOTATION
from tests.cluster.harness import Cluster
from tests.e2e.conftest import RING_TTL_SECONDS
from tests.e2e.kube_fleet import KubernetesFleet
from tests.e2e.podrunner import KubeAccess
from tests.operator.support import OperatorProcess
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.mrtr import Outcome, Rounds, call_approve

pytestmark = pytest.mark.cluster
REPLICAS = 2


async def _through_a_rollout(
    fleet: KubernetesFleet, balancer: Balancer, then: Callable[[], Any] | None = None
) -> tuple[Outcome, Outcome]:
    """Traffic while the fleet rolls (and then while ``then`` runs); then a few calls more."""
    done = asyncio.Event()

    async def deploy() -> None:
        try:
            await fleet.rolling_deploy(pause=1.0)
            if then is not None:
                await then()
        finally:
            done.set()

    deploying = asyncio.create_task(deploy())
    during = await call_approve(balancer.url, until=done)
    await deploying
    after = await call_approve(balancer.url, count=4)
    return during, after


@dataclass
class Run:
    """What one McpServer's traffic met: calls during the rollout (and rotation), after it,
    and where every round went."""

    during: Outcome
    after: Outcome
    rounds: Rounds

    @property
    def calls(self) -> int:
        return self.during.calls + self.after.calls

    @property
    def failures(self) -> list[str]:
        return self.during.failures + self.after.failures

    def outcome(self) -> str:
        retries, crossed = self.rounds.crossings()
        return f"{len(self.failures)} failed; {crossed} of {retries} retries reached another pod"


def _run(
    name: str,
    request_state: str,
    kube_access: KubeAccess,
    namespace: str,
    tmp_path: Path,
    service: EpochServiceProcess,
    then: Callable[[], Any] | None = None,
) -> Run:
    """An McpServer of the demo replica with ``--request-state``, behind a per-request
    balancer, rolled under multi-round-trip traffic."""
    workdir = tmp_path / name
    workdir.mkdir(parents=True)

    async def scenario() -> Run:
        balancer, rounds = Balancer("request"), Rounds()
        balancer.on_request = rounds.record
        await balancer.start()
        fleet = KubernetesFleet(
            "epoch",
            balancer,
            kube_access,
            namespace,
            workdir,
            replica_token=service.replica_token,
            name=name,
            min_ready=1,
            replica_args=("--request-state", request_state),
            env={ENV_RING_REFRESH: "0.3"},
            log=print,
        )
        try:
            await fleet.start(REPLICAS)
            during, after = await _through_a_rollout(fleet, balancer, then)
        finally:
            await fleet.close()
            await balancer.stop()
        return Run(during, after, rounds)

    return asyncio.run(scenario())


def test_retries_cross_pods_through_a_rollout_and_a_ring_rotation_on_kubernetes(
    k8s_cluster: Cluster,
    e2e_operator: OperatorProcess,
    e2e_service: EpochServiceProcess,
    kube_access: KubeAccess,
    demo_namespace: str,
    tmp_path: Path,
) -> None:
    name = "mrtr-ring"

    def ring_state() -> dict[str, Any]:
        found = k8s_cluster.kubectl_json("get", "mcpserver", name, "-n", demo_namespace)
        return dict((found.get("status") or {}).get("requestState") or {})

    async def rotate() -> None:
        before = ring_state()["revision"]
        await kube_access.run_kubectl(
            "annotate", "mcpserver", name, "-n", demo_namespace,
            f"{ROTATE_ANNOTATION}=mid-traffic", "--overwrite",
        )  # fmt: skip
        # The operator steps the rotation as the pods report; it ends one TTL after they all
        # sealed with the new key. Watched through the McpServer's status, as a person would.
        deadline = asyncio.get_running_loop().time() + 90
        while (state := await asyncio.to_thread(ring_state)).get("revision") != before + 3:
            assert asyncio.get_running_loop().time() < deadline, state
            await asyncio.sleep(0.3)
        assert state["phase"] == "steady" and state["rotationRequest"] == "mid-traffic"

    run = _run(name, "ring", kube_access, demo_namespace, tmp_path, e2e_service, rotate)
    retries, crossed = run.rounds.crossings()
    print(
        f"mcp-epoch ring: {run.calls} calls through a rollout and a rotation "
        f"(TTL {RING_TTL_SECONDS:g}s), {run.outcome()}"
    )
    assert run.failures == []
    assert run.during.calls >= 10, "the rollout and the rotation outran the traffic"
    # During the rollout the balancer's set changes size, so a few retries may come back to
    # the pod that sealed them; the rest crossed, and none of them failed.
    assert retries == run.calls and crossed > retries // 2
    events = k8s_cluster.kubectl_json(
        "get", "events", "-n", demo_namespace, "--field-selector", f"involvedObject.name={name}"
    )
    reasons = {e["reason"] for e in events["items"]}
    assert {"RequestStateRotationStarted", "RequestStateRotated"} <= reasons, reasons
    assert "RequestStateRotationStalled" not in reasons


def test_the_control_with_ephemeral_keys_fails_every_crossing_retry_on_kubernetes(
    e2e_operator: OperatorProcess,
    e2e_service: EpochServiceProcess,
    kube_access: KubeAccess,
    demo_namespace: str,
    tmp_path: Path,
) -> None:
    name = "mrtr-ephemeral"

    run = _run(name, "ephemeral", kube_access, demo_namespace, tmp_path, e2e_service)
    retries, crossed = run.rounds.crossings()
    calls, failed = run.calls, len(run.failures)
    print(f"control (ephemeral keys): {calls} calls through a rollout, {run.outcome()}")
    # Exactly the retries that reached another pod fail: a key of one process opens nowhere
    # else. (The few that came back to their own pod succeed.)
    assert retries == calls and crossed > retries // 2
    assert failed == crossed, run.failures
    assert all("Invalid or expired requestState" in f for f in run.failures), run.failures
