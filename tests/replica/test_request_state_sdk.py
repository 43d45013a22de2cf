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
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from epochsvc.demo.balancer import Balancer
from epochsvc.demo.fleet import NAMESPACE, SERVER, LocalProcessFleet
from epochsvc.demo.service import EpochService
from mcp_epoch import api
from mcp_epoch.contract import ENV_RING_REFRESH
from tests.support.mrtr import Rounds, call_approve

pytestmark = pytest.mark.anyio
#: Short, so that a full rotation (it waits one TTL before dropping the old key) fits a test.
TTL = 2.0


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


def ops(scene: Scene) -> Any:
    return scene.service.client()


async def test_a_retry_on_another_replica_is_accepted_with_the_servers_ring(
    ring: Scene,
) -> None:
    outcome = await call_approve(ring.balancer.url, count=20)
    retries, crossed = ring.rounds.crossings()
    assert outcome.failures == [] and outcome.calls == 20
    assert retries == 20 and crossed == 20, ring.rounds.seen


async def test_the_control_with_the_sdks_ephemeral_keys_refuses_every_such_retry(
    ephemeral: Scene,
) -> None:
    outcome = await call_approve(ephemeral.balancer.url, count=10)
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
    outcome = await call_approve(ring.balancer.url, until=done)
    await deploying
    after = await call_approve(ring.balancer.url, count=5)
    assert outcome.failures == [] and after.failures == []
    assert outcome.calls >= 5, "the deploy outran the traffic"
    assert {name for name, _ in ring.rounds.seen} >= {"epoch-r1", "epoch-r3", "epoch-r4"}


async def test_retries_survive_a_key_rotation_started_mid_traffic(ring: Scene) -> None:
    rotated = asyncio.Event()
    steps: list[api.RingStatus] = []

    async def rotate() -> None:
        async with ops(ring) as client:
            steps.append(await client.send(api.rotate_ring(NAMESPACE, SERVER)))
            # As the operator does: the service takes the steps that wait for pods at the last
            # one's report; the operator asks for the drop of the old key, which waits for
            # time, and the rotation ends when that key has left the ring.
            while steps[-1].phase != "steady":
                await asyncio.sleep(0.2)  # the operator's pace, not a synchronisation
                status = await client.send(api.advance_ring(NAMESPACE, SERVER))
                if status.phase != steps[-1].phase:
                    steps.append(status)
        rotated.set()

    traffic = asyncio.create_task(call_approve(ring.balancer.url, until=rotated))
    started = time.monotonic()
    await asyncio.wait_for(rotate(), 60)
    outcome = await traffic
    assert outcome.failures == [], outcome.failures
    assert outcome.calls >= 10, "the rotation outran the traffic"
    phases = [s.phase for s in steps]
    # Revision 4 is steady after adding (2) and switching (3): every phase was passed.
    assert phases[0] == "adding" and phases[-1] == "steady"
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
