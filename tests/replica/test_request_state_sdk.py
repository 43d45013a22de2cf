"""Multi-round-trip requests (MCP 2026-07-28) whose retry lands on another replica, with the
real SDK on both sides: ``mcp.Client`` pinned to 2026-07-28 answers an elicitation through its
callback and retries by itself; two ``MCPServer`` replicas (the demo replica) sit behind the
demo balancer routing every request round-robin, no affinity, so the retry of each call goes
to the other replica than the one that sealed its ``requestState``.

- with the server's ring from the epoch service, every retry is accepted: across two
  replicas, across a rolling deploy, and across a whole key rotation started mid-traffic;
- with the SDK's ephemeral default (the control), every retry is refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import mcp.types as types
import pytest
from mcp import Client

from epochsvc.demo.fleet import NAMESPACE, SERVER, LocalProcessFleet
from epochsvc.demo.proxy import Backend, Balancer
from epochsvc.demo.service import EpochService
from mcp_epoch import api
from mcp_epoch.contract import ENV_RING_REFRESH

pytestmark = pytest.mark.anyio
#: Short, so that a full rotation (it waits one TTL before dropping the old key) fits a test.
TTL = 2.0


@dataclass
class Rounds:
    """Where each round of each call went, from the balancer: (replica, a retry?)."""

    seen: list[tuple[str, bool]] = field(default_factory=list)

    def record(self, backend: Backend, body: bytes) -> None:
        if b'"tools/call"' in body:
            self.seen.append((backend.name, b'"requestState"' in body))

    def crossings(self) -> tuple[int, int]:
        """(retries, retries that reached another replica than the round before them)."""
        retries = crossed = 0
        for (before, _), (now, retry) in zip(self.seen, self.seen[1:], strict=False):
            if retry:
                retries += 1
                crossed += before != now
        return retries, crossed


@dataclass
class Outcome:
    calls: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass
class Scene:
    service: EpochService
    fleet: LocalProcessFleet
    balancer: Balancer
    rounds: Rounds


async def _scene(tmp_path: Path, request_state: str) -> AsyncIterator[Scene]:
    service = EpochService(tmp_path, {"EPOCHSVC_REQUEST_STATE_TTL_SECONDS": str(TTL)})
    await asyncio.to_thread(service.start)
    balancer = Balancer("request")
    rounds = Rounds()
    balancer.on_request = rounds.record
    await balancer.start()
    fleet = LocalProcessFleet(
        "epoch",
        balancer,
        tmp_path,
        service=service,
        request_state=request_state,
        env={ENV_RING_REFRESH: "0.2"},
    )
    try:
        await fleet.start(2)
        yield Scene(service, fleet, balancer, rounds)
    finally:
        await fleet.close()
        await balancer.stop()
        service.stop()


@pytest.fixture
async def ring(tmp_path: Path) -> AsyncIterator[Scene]:
    async for scene in _scene(tmp_path, "ring"):
        yield scene


@pytest.fixture
async def ephemeral(tmp_path: Path) -> AsyncIterator[Scene]:
    async for scene in _scene(tmp_path, "ephemeral"):
        yield scene


async def answer(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"token": params.message})


async def call_approve(scene: Scene, until: asyncio.Event | None = None, count: int = 0) -> Outcome:
    """Sequential calls (so the balancer's alternation sends every retry elsewhere), ``count``
    of them or until ``until`` is set."""
    outcome = Outcome()
    async with Client(scene.balancer.url, mode="2026-07-28", elicitation_callback=answer) as c:
        while (until is not None and not until.is_set()) or outcome.calls < count:
            subject = f"s{outcome.calls}"
            outcome.calls += 1
            try:
                result = await c.call_tool("approve", {"subject": subject})
            except Exception as exc:  # the retry refused: what the control must show
                outcome.failures.append(f"{subject}: {exc!r}")
                continue
            text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
            if result.is_error or json.loads(text).get("subject") != subject:
                outcome.failures.append(f"{subject}: {text}")
    return outcome


def ops(scene: Scene) -> Any:
    return scene.service.client()


async def test_a_retry_on_another_replica_is_accepted_with_the_servers_ring(
    ring: Scene,
) -> None:
    outcome = await call_approve(ring, count=20)
    retries, crossed = ring.rounds.crossings()
    assert outcome.failures == [] and outcome.calls == 20
    assert retries == 20 and crossed == 20, ring.rounds.seen


async def test_the_control_with_the_sdks_ephemeral_keys_refuses_every_such_retry(
    ephemeral: Scene,
) -> None:
    outcome = await call_approve(ephemeral, count=10)
    retries, crossed = ephemeral.rounds.crossings()
    assert crossed == retries == 10
    assert len(outcome.failures) == 10, outcome.failures
    assert all("Invalid or expired requestState" in f for f in outcome.failures), outcome.failures


async def test_retries_survive_a_rolling_deploy(ring: Scene) -> None:
    done = asyncio.Event()

    async def deploy() -> None:
        try:
            await ring.fleet.rolling_deploy(pause=0.5)
        finally:
            done.set()

    deploying = asyncio.create_task(deploy())
    outcome = await call_approve(ring, until=done)
    await deploying
    after = await call_approve(ring, count=5)
    assert outcome.failures == [] and after.failures == []
    assert outcome.calls >= 5, "the deploy outran the traffic"
    assert {name for name, _ in ring.rounds.seen} >= {"epoch-r1", "epoch-r3", "epoch-r4"}


async def test_retries_survive_a_key_rotation_started_mid_traffic(ring: Scene) -> None:
    rotated = asyncio.Event()
    steps: list[api.RingStatus] = []

    async def rotate() -> None:
        async with ops(ring) as client:
            steps.append(await client.send(api.rotate_ring(NAMESPACE, SERVER)))
            # As the operator does: try to step on, and let the service refuse while any pod
            # lags; the rotation ends when the old key has left the ring.
            while steps[-1].phase != "steady":
                await asyncio.sleep(0.2)
                status = await client.send(api.advance_ring(NAMESPACE, SERVER))
                if status.advanced:
                    steps.append(status)
        rotated.set()

    traffic = asyncio.create_task(call_approve(ring, until=rotated))
    started = time.monotonic()
    await asyncio.wait_for(rotate(), 60)
    outcome = await traffic
    assert outcome.failures == [], outcome.failures
    assert outcome.calls >= 10, "the rotation outran the traffic"
    phases = [s.phase for s in steps]
    assert phases[0] == "adding" and phases[-1] == "steady" and "switching" in phases
    assert steps[-1].revision == 4 and time.monotonic() - started >= TTL
    # Every replica follows the ring to its new revision, and says so in /metrics.
    live = [r for r in ring.fleet.replicas() if r.proc is not None and r.proc.poll() is None]
    assert len(live) == 2
    for replica in live:
        url = f"http://{replica.backend.host}:{replica.backend.port}/metrics"
        deadline = time.monotonic() + 10
        while True:
            async with httpx.AsyncClient() as http:
                text = (await http.get(url)).text
            if "mcp_epoch_request_state_ring_revision 4" in text:
                break
            assert time.monotonic() < deadline, text
            await asyncio.sleep(0.1)
        assert 'mcp_epoch_request_state_rejected_total{reason="unknown_key"} 0' in text
