"""Three of the chart's alerts fire on the loopback control plane when their faults are made
for real: the epoch service stops, the service refuses a replica's credentials, and the
webhook refuses a pod. The real operator (its webhook registered with the API server), the
real epoch service and an ``McpServer``'s pod (a demo replica, run by the pod runner on its pod
IP) are scraped on their real ``/metrics`` and the alerts evaluated over those scrapes
(``tests.observability``), before each fault (silent) and after it (firing).

The operator going away is made too (``McpEpochOperatorDown``), and the webhook's refusals
with the service down take its retry budget, which is what ``McpEpochWebhookSlow`` reads.
Everything stopped is started again (same ports), for the tests that share these fixtures.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from mcp_epoch import api
from tests.cluster.harness import Cluster
from tests.e2e.kube_fleet import KubernetesFleet
from tests.e2e.podrunner import KubeAccess, PodProcess
from tests.e2e.test_status_cluster import Unrouted
from tests.observability.harness import AlertWatch
from tests.observability.rules import OPERATOR_JOB, SERVICE_JOB
from tests.observability.tsdb import Target
from tests.operator.support import SERVER_LABEL, OperatorProcess, wait_for
from tests.support.epochsvc_proc import EpochServiceProcess

pytestmark = pytest.mark.cluster
NAME = "alerts-refused"
#: A server nothing was admitted for: no epochs pooled, so its pods need the service now.
COLD = "alerts-cold"
#: The chart's monitors' jobs and target labels for the release ``mcp-epoch``.
MONITOR_NS = "mcp-epoch-system"
REPLICA_JOB = f"{MONITOR_NS}/mcp-epoch-replicas"
CALLS = "mcp_epoch_operator_epoch_service_calls_total"
STALLED = "mcp_epoch_operator_request_state_rotation_stalled"

HEALTHY = (
    "McpEpochServiceDown",
    "McpEpochServiceUnavailable",
    "McpEpochServiceRefusingCredentials",
    "McpEpochOperatorDown",
    "McpEpochWebhookRefusing",
    "McpEpochWebhookSlow",
    "McpEpochReplicaCredentialsRefused",
)


def operator_target(operator: OperatorProcess) -> Target:
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    return Target(OPERATOR_JOB, url, {"namespace": MONITOR_NS, "pod": "mcp-epoch-operator-0"})


def service_target(service: EpochServiceProcess) -> Target:
    return Target(SERVICE_JOB, f"{service.url}/metrics", {"namespace": MONITOR_NS})


def pod_target(pod: PodProcess, namespace: str) -> Target:
    assert pod.backend is not None
    url = f"http://{pod.backend.host}:{pod.backend.port}/metrics"
    return Target(REPLICA_JOB, url, {"namespace": namespace, "pod": pod.pod, "server": NAME})


def labelled_pod(name: str, server: str = NAME) -> dict[str, Any]:
    """A pod of a server: the webhook must give it an epoch or refuse it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {SERVER_LABEL: server}},
        "spec": {"containers": [{"name": "mcp", "image": "registry.invalid/mcp:1"}]},
    }


def test_stopping_the_service_refusing_credentials_and_the_webhook_refusing_fire_alerts(
    k8s_cluster: Cluster,
    e2e_operator: OperatorProcess,
    e2e_service: EpochServiceProcess,
    kube_access: KubeAccess,
    demo_namespace: str,
    tmp_path: Path,
) -> None:
    ns = demo_namespace
    watch = AlertWatch([service_target(e2e_service), operator_target(e2e_operator)])
    service_metrics = f"{e2e_service.url}/metrics"
    operator_metrics = operator_target(e2e_operator).url

    def refused_create(name: str) -> str:
        """``kubectl create`` of a pod of a server with nothing pooled; the API server's
        refusal (the webhook's)."""
        pod = labelled_pod(name, COLD)
        done = k8s_cluster.kubectl(
            "create", "-n", ns, "-f", "-", stdin=json.dumps(pod), check=False
        )
        assert done.returncode != 0, f"pod {name} was admitted with the service down"
        return done.stderr

    def admitted_dry_run(name: str) -> None:
        done = k8s_cluster.kubectl(
            "create", "-n", ns, "--dry-run=server", "-f", "-", stdin=json.dumps(labelled_pod(name))
        )
        assert done.returncode == 0, done.stderr

    async def scenario() -> None:
        step = asyncio.to_thread  # blocking work off the loop the pod runner lives on
        fleet = KubernetesFleet(
            "epoch",
            Unrouted(),
            kube_access,
            ns,
            tmp_path,
            replica_token="not-the-replica-token",
            name=NAME,
            min_ready=1,
        )
        replica: Target | None = None
        try:
            # Healthy: between two scrapes a pod is admitted (a server-side dry run through
            # the webhook) and the operator calls the service.
            await step(watch.scrape)
            await step(admitted_dry_run, "alerts-healthy")
            await step(watch.scrape_when_grown, operator_metrics, CALLS, outcome="ok")
            watch.quiet(*HEALTHY)

            # 2. The epoch service refuses the replica's credentials (its token Secret holds
            # a token the service does not accept): the pod runs, on a fallback epoch, and
            # every poll of the ledger is refused.
            await fleet.start(1)
            (pod,) = fleet.pods()
            replica = pod_target(pod, ns)
            watch.add(replica)
            readyz = replica.url.removesuffix("/metrics") + "/readyz"
            await step(
                wait_for,
                lambda: "refuses" in " ".join(httpx.get(readyz, timeout=5).json()["problems"]),
                30,
                "the replica to report its credentials refused",
            )
            await step(watch.scrape)
            watch.fires("McpEpochReplicaCredentialsRefused", pod=pod.pod, namespace=ns)
            await step(
                watch.scrape_until_fires,
                "McpEpochServiceRefusingCredentials",
                service_metrics,
                "epochsvc_auth_refused_total",
            )
            watch.fires("McpEpochServiceRefusingCredentials", job=SERVICE_JOB)

            # 1. The epoch service stops. The operator's calls to it (its resyncs of the
            # server above) find nobody.
            e2e_service.stop()
            await step(watch.after_window)
            watch.fires("McpEpochServiceDown")
            await step(
                watch.scrape_until_fires,
                "McpEpochServiceUnavailable",
                operator_metrics,
                CALLS,
                outcome="unavailable",
            )
            watch.fires("McpEpochServiceUnavailable", job=OPERATOR_JOB)

            # 3. The webhook refuses: a server with nothing pooled needs an epoch issued now,
            # it cannot have one, and the webhook fails closed. Two pod creates with a scrape
            # between them (a rate needs two samples that differ).
            why = await step(refused_create, "alerts-refused-a")
            assert "denied the request" in why, why
            await step(watch.scrape)
            await step(refused_create, "alerts-refused-b")
            await step(watch.scrape)
            watch.fires("McpEpochWebhookRefusing", job=OPERATOR_JOB)
            # Each refusal waited out the webhook's retry budget for the service.
            watch.fires("McpEpochWebhookSlow", job=OPERATOR_JOB)
        finally:
            if e2e_service.proc is None:
                await step(e2e_service.start)
            await fleet.close()
            if replica is not None:
                watch.remove(replica)

    try:
        asyncio.run(scenario())
        watch.scrape()
        watch.quiet("McpEpochServiceDown")

        # The operator goes away (and comes back, for the tests after this one).
        e2e_operator.stop()
        watch.scrape()
        watch.fires("McpEpochOperatorDown")
    finally:
        if e2e_service.proc is None:
            e2e_service.start()
        if e2e_operator.proc is None:
            e2e_operator.start()
    watch.scrape()
    watch.quiet("McpEpochOperatorDown", "McpEpochServiceDown")


def test_a_rotation_that_a_pod_never_follows_fires_the_stall_alert(
    k8s_cluster: Cluster,
    e2e_operator: OperatorProcess,
    e2e_service: EpochServiceProcess,
    kube_access: KubeAccess,
    demo_namespace: str,
    tmp_path: Path,
) -> None:
    """A pod whose server seals its request state with a key of its own (``--request-state
    ephemeral``) never loads the server's ring, so it never reports a revision: a rotation
    begun on that server waits for it, and the operator (with its stall threshold at 1 s)
    says so in the gauge the stall alert reads."""
    name = "alerts-stall"
    stall = OperatorProcess(
        k8s_cluster,
        e2e_service,
        e2e_operator.port,
        tmp_path / "operator-stall.log",
        rotation_stall_seconds=1.0,
    )
    watch = AlertWatch([operator_target(stall)])

    async def scenario() -> None:
        step = asyncio.to_thread
        fleet = KubernetesFleet(
            "epoch",
            Unrouted(),
            kube_access,
            demo_namespace,
            tmp_path,
            replica_token=e2e_service.replica_token,
            name=name,
            min_ready=1,
            replica_args=("--request-state", "ephemeral"),
        )
        try:
            await fleet.start(1)
            await step(watch.scrape)
            watch.quiet("McpEpochRequestStateRotationStalled")
            begun = await step(e2e_service.send, api.rotate_ring(demo_namespace, name))
            assert begun.phase == "adding" and len(begun.behind) == 1, begun
            await step(
                wait_for,
                lambda: stall.metric(STALLED, namespace=demo_namespace, server=name) == 1,
                60,
                "the operator to call the rotation stalled",
            )
            await step(watch.scrape)
            watch.fires("McpEpochRequestStateRotationStalled", job=OPERATOR_JOB)
        finally:
            await fleet.close()

    e2e_operator.stop()
    try:
        stall.start()
        asyncio.run(scenario())
    finally:
        stall.stop()
        e2e_operator.start()
