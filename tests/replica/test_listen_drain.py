"""A draining replica ends its ``subscriptions/listen`` streams (MCP 2026-07-28) with the
revision's completion result, so a client re-listens at once instead of holding a connection
to a process that is going away; the streams no longer hold the drain to its deadline. Real
SDK on both sides: the demo replica (``MCPServer`` under ``epoch_safe_app``), stopped with
SIGTERM as a kubelet stops a pod, and ``mcp.Client`` pinned to 2026-07-28."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from epochsvc.demo.balancer import Balancer
from epochsvc.demo.fleet import LocalProcessFleet, drain_report
from epochsvc.demo.service import EpochService

pytestmark = pytest.mark.anyio
#: The replica's drain deadline (the fleet gives it the grace period less one second).
DRAIN_DEADLINE = 9.0


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[LocalProcessFleet]:
    service = EpochService(tmp_path)
    await asyncio.to_thread(service.start)
    balancer = Balancer("request")
    await balancer.start()
    fleet = LocalProcessFleet("epoch", balancer, tmp_path, service=service)
    try:
        await fleet.start(1)
        yield fleet
    finally:
        await fleet.close()
        await balancer.stop()
        service.stop()


async def test_sigterm_ends_listen_streams_gracefully_and_the_drain_is_not_held(
    fleet: LocalProcessFleet,
) -> None:
    (replica,) = fleet.replicas()
    assert replica.proc is not None
    url = f"http://{replica.backend.host}:{replica.backend.port}/mcp"
    async with (
        Client(url, mode="2026-07-28") as first,
        Client(url, mode="2026-07-28") as second,
        first.listen(tools_list_changed=True) as a,
        second.listen(resources_list_changed=True) as b,
    ):
        began = time.monotonic()
        replica.proc.send_signal(signal.SIGTERM)

        async def until_ended(sub: object) -> list[object]:
            return [event async for event in sub]  # type: ignore[attr-defined]

        # A graceful end finishes the loop; a dropped stream would raise SubscriptionLost.
        ended = await asyncio.wait_for(
            asyncio.gather(until_ended(a), until_ended(b)), DRAIN_DEADLINE
        )
        assert ended == [[], []]
        assert time.monotonic() - began < DRAIN_DEADLINE / 2
    output = await asyncio.to_thread(replica.proc.communicate, timeout=DRAIN_DEADLINE + 5)
    report = drain_report(output[0])
    assert report, output
    assert report["abandoned"] == 0
    assert report["drained"] < DRAIN_DEADLINE / 2, report
