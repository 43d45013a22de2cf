"""Two operator replicas: losing one in the middle of a rolling deploy stops nothing.

Every operator replica acts (kopf's standalone mode: all its calls are idempotent, so no
leader is needed) and serves the admission webhook; here both processes serve one port, as a
Service with two endpoints would (``--webhook-share-port``). One of them is killed with
SIGKILL as soon as ``kubectl rollout restart`` has made its first new pod, and the rollout
must finish through the other: every pod admitted has an epoch (fail closed: a pod the
webhook could not give one was never created), no epoch is issued twice, pods admitted after
the kill got theirs from the survivor, and the survivor binds, drains and retires them.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from epochsvc.demo.balancer import Balancer
from mcp_epoch import api
from tests.cluster.harness import Cluster
from tests.e2e.kube_fleet import KubernetesFleet
from tests.e2e.podrunner import KubeAccess
from tests.operator.support import OperatorProcess, ledger_states, wait_for
from tests.support.epochsvc_proc import EpochServiceProcess

pytestmark = [pytest.mark.cluster]

REPLICAS = 3


def test_an_operator_replica_lost_mid_rollout_stops_nothing(
    k8s_cluster: Cluster,
    e2e_operator: OperatorProcess,
    e2e_service: EpochServiceProcess,
    kube_access: KubeAccess,
    demo_namespace: str,
    tmp_path: Path,
) -> None:
    second = OperatorProcess(
        k8s_cluster, e2e_service, e2e_operator.port, tmp_path / "operator-2.log"
    ).start()
    fleet = KubernetesFleet(
        "epoch",
        Balancer(),
        kube_access,
        demo_namespace,
        tmp_path,
        replica_token=e2e_service.replica_token,
        name="demo-ha",
        log=print,
    )
    killed_at: list[float] = []

    async def kill_one() -> None:
        await fleet.runner.wait_until(
            lambda: len(fleet.pods()) > REPLICAS, 60, "the rollout's first new pod"
        )
        killed_at.append(time.time())
        await asyncio.to_thread(e2e_operator.kill)
        print("  killed one operator replica (SIGKILL)")

    async def rollout() -> None:
        try:
            await fleet.start(REPLICAS)
            killing = asyncio.ensure_future(kill_one())
            await fleet.rolling_deploy(2.0)
            await killing
        finally:
            await fleet.close()  # on the loop its pod runner runs on

    try:
        asyncio.run(rollout())
        pods = fleet.pods()
        assert len(pods) == 2 * REPLICAS, [p.pod for p in pods]
        assert not fleet.runner.errors, fleet.runner.errors
        for p in pods:
            assert p.annotated_epoch and p.env_epoch == p.annotated_epoch, p.pod
        issued = [e2e_service.send(api.get_epoch(p.env_epoch)) for p in pods]
        assert len({e.generation for e in issued}) == len(pods), "an epoch issued twice"
        # The survivor's webhook admitted the pods made after the kill.
        after = [e for e in issued if e.created_at > killed_at[0]]
        assert after, "no pod was admitted after the kill: the rollout proved nothing"
        # The survivor reconciles: new pods bound to their own epochs, old ones retired.
        first, second_half = pods[:REPLICAS], pods[REPLICAS:]
        for p in second_half:
            assert e2e_service.send(api.get_epoch(p.env_epoch)).pod_uid == p.uid, p.pod
        wait_for(
            lambda: all(
                ledger_states(e2e_service, demo_namespace, "demo-ha").get(p.env_epoch) == "retired"
                for p in first
            ),
            30,
            "the replaced pods' epochs to be retired by the surviving operator",
        )
    finally:
        second.stop()
        e2e_operator.start()  # the package's other tests keep their operator
