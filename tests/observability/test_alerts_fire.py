"""Each alert of the chart goes from silent to firing when its fault is made for real.

The components are real processes on loopback: the epoch service (``mcp-epoch serve``) on a
PostgreSQL of its own, MCP servers wrapped by the library (``examples/epoch_server.py``), and
the sidecar (``mcp-epoch proxy``) in front of an SDK server. Their ``/metrics`` are scraped
into :mod:`tests.observability.tsdb` and every alert's expression is evaluated there
(:mod:`tests.observability.promql`), first in the healthy state (it must return nothing),
then after each fault (it must return the faulty component). A test waits for what it can
observe of the fault (a readiness answer, a counter that moved) before it scrapes.

"Fires" means the expression is non-empty; the rules' ``for:`` timers are Prometheus's and
are not checked. The operator's alerts need the API server: tests/e2e/test_alerts_cluster.py.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServiceFactory
from tests.observability.harness import AlertWatch, metric_sum
from tests.observability.promql import Element
from tests.observability.rules import SERVICE_JOB
from tests.observability.tsdb import Target
from tests.operator.support import wait_for
from tests.replica.conftest import RawSession
from tests.replica.replicas import NS, SERVER, Replica, launch
from tests.sidecar.upstreams import start_sidecar, start_upstream
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.ports import free_port
from tests.support.postgres import PostgresServer

#: The replica PodMonitor's job for the release ``mcp-epoch`` in ``mcp-epoch-system``.
REPLICA_JOB = "mcp-epoch-system/mcp-epoch-replicas"

SERVICE_ALERTS = (
    "McpEpochServiceDown",
    "McpEpochServiceErrors",
    "McpEpochLedgerStoreUnavailable",
    "McpEpochServiceRefusingCredentials",
    "McpEpochDrainsHitDeadline",
)
REPLICA_ALERTS = (
    "McpEpochReplicaCredentialsRefused",
    "McpEpochReplicaFallbackEpoch",
    "McpEpochSidecarUpstreamDown",
)


def service_target(svc: EpochServiceProcess) -> Target:
    """As the chart's ServiceMonitor scrapes the epoch service."""
    return Target(SERVICE_JOB, f"{svc.url}/metrics", {"namespace": "mcp-epoch-system"})


def replica_target(pod: str, port: int) -> Target:
    """As the chart's replica PodMonitor scrapes an MCP server pod."""
    labels = {"namespace": NS, "pod": pod, "server": SERVER}
    return Target(REPLICA_JOB, f"http://127.0.0.1:{port}/metrics", labels)


def problems(port: int) -> str:
    """What the process's ``/readyz`` says is wrong (empty when ready)."""
    answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    return " ".join(answer.json().get("problems") or [])


def pods(elements: list[Element]) -> set[str]:
    return {e.metric.get("pod", "") for e in elements}


@pytest.fixture
def database() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own: the test kills it."""
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture
def started() -> Iterator[list[Replica]]:
    """The replicas a test launches, stopped at its end."""
    replicas: list[Replica] = []
    yield replicas
    for replica in replicas:
        replica.srv.stop()


def test_the_service_and_replica_alerts_fire_on_their_faults(
    database: PostgresServer,
    service_factory: ServiceFactory,
    started: list[Replica],
    tmp_path: Path,
) -> None:
    svc = service_factory(database.new_database())
    metrics = f"{svc.url}/metrics"

    def replica(name: str, **env: str) -> Replica:
        found = launch(svc, name, log=tmp_path / f"{name}.log", **env)
        started.append(found)
        watch.add(replica_target(name, found.srv.port))
        return found

    watch = AlertWatch([service_target(svc)])
    good = replica("good")
    wait_for(lambda: problems(good.srv.port) == "", 15, "the healthy replica to be ready")
    watch.scrape()
    watch.scrape()
    watch.quiet(*SERVICE_ALERTS, *REPLICA_ALERTS)

    # A replica whose token the service does not accept: refused at registration (so it
    # runs on a fallback epoch) and at every poll of the ledger.
    refused = replica("refused", MCP_EPOCH_SERVICE_TOKEN="not-the-replica-token")
    wait_for(lambda: "refuses" in problems(refused.srv.port), 15, "the refusal to show")
    watch.scrape()
    assert pods(watch.fires("McpEpochReplicaCredentialsRefused")) == {"refused"}
    watch.scrape_until_fires(
        "McpEpochServiceRefusingCredentials", metrics, "epochsvc_auth_refused_total"
    )
    watch.fires("McpEpochServiceRefusingCredentials", job=SERVICE_JOB)

    # A replica that cannot reach the service at start: a fallback epoch.
    unreachable = f"http://127.0.0.1:{free_port()}"
    replica("fallback", MCP_EPOCH_SERVICE_URL=unreachable)
    watch.scrape()
    assert pods(watch.fires("McpEpochReplicaFallbackEpoch")) == {"refused", "fallback"}
    assert pods(watch.firing("McpEpochReplicaCredentialsRefused")) == {"refused"}

    # The ledger's database goes away: the store is down, requests are answered 503. The
    # readiness probe (a kubelet's, every few seconds) is one of those requests.
    database.kill()

    def probe_refused() -> bool:
        return httpx.get(f"{svc.url}/readyz", timeout=5).status_code == 503

    def answered_503() -> float:
        return metric_sum(metrics, "epochsvc_request_duration_seconds_count", status="503")

    wait_for(probe_refused, 15, "the service to see its store gone")
    watch.after_window()
    watch.fires("McpEpochLedgerStoreUnavailable", job=SERVICE_JOB)
    errors = watch.scraped("epochsvc_request_duration_seconds_count", status="503")
    wait_for(lambda: probe_refused() and answered_503() > errors, 15, "the next probe's 503")
    watch.scrape()
    watch.fires("McpEpochServiceErrors", job=SERVICE_JOB)
    watch.quiet("McpEpochServiceDown")  # it answers: down is something else

    # The service itself stops.
    svc.stop()
    watch.scrape()
    watch.fires("McpEpochServiceDown")


def test_the_drain_deadline_alert_fires_when_a_drain_runs_out_of_time(
    epoch_service: EpochServiceProcess, started: list[Replica], tmp_path: Path
) -> None:
    """A call waits for an answer nobody gives; the process is told to stop with 1 s to
    drain, cuts the call at the deadline and reports that to the service before it exits."""
    metrics = f"{epoch_service.url}/metrics"
    watch = AlertWatch([service_target(epoch_service)])
    drainer = launch(
        epoch_service, "drainer", log=tmp_path / "drainer.log", MCP_EPOCH_DRAIN_SECONDS="1"
    )
    started.append(drainer)
    pod = replica_target("drainer", drainer.srv.port)
    watch.add(pod)
    watch.scrape()
    watch.scrape()
    watch.quiet("McpEpochDrainsHitDeadline")
    with httpx.Client(timeout=20) as http:
        session = RawSession(drainer.url, http).initialize()
        ask = {"name": "confirm", "arguments": {"question": "ok?"}}
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": ask}
        with http.stream("POST", drainer.url, json=body, headers=session.headers()) as pending:
            lines = pending.iter_lines()
            next(line for line in lines if "elicitation/create" in line)
            drainer.srv.proc.send_signal(signal.SIGTERM)
            with pytest.raises(httpx.RemoteProtocolError):  # the deadline cuts the call
                for _ in lines:
                    pass
    assert drainer.srv.proc.wait(10) == 0
    watch.remove(pod)  # the pod is gone, and its /metrics with it
    wait_for(
        lambda: metric_sum(metrics, "epochsvc_drains_total", outcome="deadline") == 1,
        5,
        "the drain's report to be counted",
    )
    watch.scrape()
    watch.fires("McpEpochDrainsHitDeadline", server=SERVER, exported_namespace=NS)


def test_the_sidecar_upstream_alert_fires_when_the_server_behind_it_dies(tmp_path: Path) -> None:
    upstream = start_upstream("python")
    sidecar = start_sidecar(upstream.port, log=tmp_path / "sidecar.log")
    try:
        watch = AlertWatch([replica_target("sidecar-0", sidecar.port)])
        watch.scrape()
        watch.quiet("McpEpochSidecarUpstreamDown")
        upstream.proc.send_signal(signal.SIGKILL)
        upstream.proc.wait(10)
        wait_for(lambda: "does not answer" in problems(sidecar.port), 15, "the sidecar to notice")
        watch.scrape()
        assert pods(watch.fires("McpEpochSidecarUpstreamDown")) == {"sidecar-0"}
    finally:
        sidecar.stop()
        upstream.stop()
