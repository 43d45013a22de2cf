"""The pod runner's readiness prober: probes resolved as a kubelet resolves them, verdicts
against a real loopback server, and the status it writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.e2e.prober import (
    Probe,
    ProbeError,
    ReadinessProber,
    probe_of,
    probe_once,
    with_readiness,
)

CONTAINER = {"name": "mcp", "ports": [{"name": "mcp", "containerPort": 8080}]}


def test_probe_resolves_a_named_port_and_the_kubelets_defaults() -> None:
    spec = {**CONTAINER, "readinessProbe": {"httpGet": {"path": "/readyz", "port": "mcp"}}}
    assert probe_of(spec, "198.18.0.4") == Probe("198.18.0.4", 8080, "/readyz")
    tcp = {**CONTAINER, "readinessProbe": {"tcpSocket": {"port": 9000}, "periodSeconds": 2}}
    assert probe_of(tcp, "10.0.0.1") == Probe("10.0.0.1", 9000, None, period=2.0)
    assert probe_of(CONTAINER, "10.0.0.1") is None


@pytest.mark.parametrize(
    "probe",
    [
        {"exec": {"command": ["true"]}},
        {"grpc": {"port": 8080}},
        {"httpGet": {"path": "/", "port": "nope"}},
        {"httpGet": {"path": "/", "port": 8080, "scheme": "HTTPS"}},
    ],
)
def test_a_probe_it_cannot_run_is_refused_not_passed(probe: dict[str, Any]) -> None:
    with pytest.raises(ProbeError):
        probe_of({**CONTAINER, "readinessProbe": probe}, "10.0.0.1")


STATUS: dict[str, Any] = {
    "phase": "Running",
    "podIP": "198.18.0.4",
    "conditions": [
        {"type": "Initialized", "status": "True", "lastTransitionTime": "t0"},
        {"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
        {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"},
    ],
    "containerStatuses": [{"name": "mcp", "ready": False, "state": {"running": {}}}],
}


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_readiness_follows_the_container_and_keeps_the_rest_of_the_status() -> None:
    ready = with_readiness(STATUS, "mcp", True)
    conditions = _conditions(ready)
    assert conditions["Ready"]["status"] == conditions["ContainersReady"]["status"] == "True"
    assert "reason" not in conditions["Ready"] and conditions["Ready"]["lastTransitionTime"]
    assert conditions["Initialized"] == STATUS["conditions"][0]
    assert ready["containerStatuses"] == [{"name": "mcp", "ready": True, "state": {"running": {}}}]
    assert ready["podIP"] == "198.18.0.4"
    assert STATUS["containerStatuses"][0]["ready"] is False  # the input is not changed
    again = with_readiness(ready, "mcp", True)  # no change: the transition time stays
    assert _conditions(again)["Ready"] == conditions["Ready"]
    back = _conditions(with_readiness(ready, "mcp", False))
    assert back["Ready"]["status"] == "False" and back["Ready"]["reason"] == "ContainersNotReady"


def test_one_container_not_ready_keeps_the_pod_not_ready() -> None:
    two = {**STATUS, "containerStatuses": [*STATUS["containerStatuses"], {"name": "side"}]}
    assert _conditions(with_readiness(two, "mcp", True))["Ready"]["status"] == "False"


@asynccontextmanager
async def server(answers: list[int], served: list[int] | None = None) -> AsyncIterator[int]:
    """A loopback HTTP server answering request n with ``answers[n]`` (the last one repeats)
    and appending n to ``served``; yields its port."""
    count = served if served is not None else []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        code = answers[min(len(count), len(answers) - 1)]
        count.append(len(count) + 1)
        head = f"HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        writer.write(head.encode())
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with srv:
        yield srv.sockets[0].getsockname()[1]


def test_probe_once_passes_on_2xx_3xx_and_fails_on_errors_and_silence() -> None:
    async def main() -> None:
        for code, want in ((200, True), (302, True), (404, False), (503, False)):
            async with server([code]) as port:
                assert await probe_once(Probe("127.0.0.1", port, "/readyz")) is want
            async with server([code]) as port:
                assert await probe_once(Probe("127.0.0.1", port, None)) is True  # TCP opens
        # Nothing listens there any more.
        assert await probe_once(Probe("127.0.0.1", port, "/readyz")) is False
        assert await probe_once(Probe("127.0.0.1", port, None)) is False

    asyncio.run(main())


def test_prober_reports_each_change_after_its_threshold() -> None:
    """503 twice, 200 twice (successThreshold 2), then 503 (failureThreshold 2): the pod turns
    Ready at the 4th probe and not ready at the 6th."""

    async def main() -> list[tuple[bool, int]]:
        reports: list[tuple[bool, int]] = []
        served: list[int] = []
        both = asyncio.Event()
        async with server([503, 503, 200, 200, 503], served) as port:

            async def report(ready: bool) -> bool:
                reports.append((ready, len(served)))
                if len(reports) == 2:
                    both.set()
                return True

            probe = Probe(
                "127.0.0.1", port, "/", period=0.01, success_threshold=2, failure_threshold=2
            )
            task = asyncio.create_task(ReadinessProber(probe, report).run())
            await asyncio.wait_for(both.wait(), 30)
            task.cancel()
        return reports

    assert asyncio.run(main()) == [(True, 4), (False, 6)]


def test_prober_without_a_probe_reports_ready_once() -> None:
    reports: list[bool] = []

    async def report(ready: bool) -> bool:
        reports.append(ready)
        return True

    prober = ReadinessProber(None, report)
    asyncio.run(prober.run())
    assert reports == [True] and prober.ready


def test_prober_stops_when_the_pod_is_gone() -> None:
    async def main() -> None:
        async with server([200]) as port:

            async def gone(_ready: bool) -> bool:
                return False

            prober = ReadinessProber(Probe("127.0.0.1", port, "/", period=0.01), gone)
            await asyncio.wait_for(prober.run(), 30)  # returns: nothing left to report to
            assert not prober.ready

    asyncio.run(main())
