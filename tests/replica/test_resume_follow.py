"""A resumed stream is fed from the buffer until its final response, whatever the SDK does.

These drive ``EpochEventStore.replay_events_after`` exactly as the SDK does (a send callback
that awaits the client), in one event loop, with the interleavings forced by scheduling
(``wait_all_tasks_blocked``) rather than by timing. Before the follower, the store returned as
soon as the replay caught up and left the rest to the SDK's live delivery: these fail there.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from anyio.lowlevel import checkpoint
from mcp.server.streamable_http import EventMessage
from mcp_types import JSONRPCNotification, JSONRPCResponse

from mcp_epoch._internal.errors import ResumptionGap
from mcp_epoch._internal.resume import ResumeState, current_resume
from mcp_epoch._internal.sessions import SessionTag, current_session
from mcp_epoch._internal.store import EpochEventStore
from mcp_epoch.contract import PodEpoch, ProcessEpoch

pytestmark = pytest.mark.anyio


def step(n: int) -> JSONRPCNotification:
    return JSONRPCNotification(
        jsonrpc="2.0", method="notifications/progress", params={"progressToken": 1, "progress": n}
    )


def final(request_id: int = 1) -> JSONRPCResponse:
    return JSONRPCResponse(jsonrpc="2.0", id=request_id, result={"content": []})


class Client:
    """The SDK's send callback, with the wire's order kept for the assertions."""

    def __init__(self) -> None:
        self.got: list[EventMessage] = []

    async def __call__(self, message: EventMessage) -> None:
        await checkpoint()  # sending awaits the client: other tasks run meanwhile
        self.got.append(message)

    @property
    def ids(self) -> list[str | None]:
        return [m.event_id for m in self.got]


def new_store(capacity: int = 64) -> EpochEventStore:
    return EpochEventStore(ProcessEpoch(PodEpoch("9f2c1a7e", 42), 0), capacity=capacity)


async def stored(store: EpochEventStore, owner: SessionTag, stream: str, msg: Any) -> str:
    token = current_session.set(owner)
    try:
        return await store.store_event(stream, msg)
    finally:
        current_session.reset(token)


async def test_events_stored_after_the_replay_caught_up_reach_the_resumed_stream() -> None:
    store, owner, client = new_store(), SessionTag("s1"), Client()
    await stored(store, owner, "1", None)  # the SDK's priming event
    cursor = await stored(store, owner, "1", step(1))
    missed = await stored(store, owner, "1", step(2))
    returned = anyio.Event()

    async def resume() -> None:
        current_session.set(owner)
        await store.replay_events_after(cursor, client)
        returned.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(resume)
        await anyio.wait_all_tasks_blocked()
        # The replay has caught up. This is where the SDK used to take over live delivery.
        assert client.ids == [missed]
        assert not returned.is_set(), "the resumed stream ended before its response"
        later = [await stored(store, owner, "1", step(3))]
        await stored(store, SessionTag("other"), "1", step(99))  # another session, same id
        await stored(store, owner, "7", step(98))  # another stream of the same session
        later.append(await stored(store, owner, "1", step(4)))
        later.append(await stored(store, owner, "1", final()))
        with anyio.fail_after(5):
            await returned.wait()
    assert client.ids == [missed, *later]


async def test_events_stored_while_the_replay_is_sending_are_sent_in_order() -> None:
    store, owner, client = new_store(), SessionTag("s1"), Client()
    cursor = await stored(store, owner, "1", step(1))
    expected = [await stored(store, owner, "1", step(n)) for n in (2, 3)]

    async def producer() -> None:
        for n in (4, 5):
            expected.append(await stored(store, owner, "1", step(n)))
            await checkpoint()
        expected.append(await stored(store, owner, "1", final()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(producer)
        current_session.set(owner)
        with anyio.fail_after(5):
            await store.replay_events_after(cursor, client)
    assert client.ids == expected


async def test_a_cursor_at_the_final_response_ends_at_once() -> None:
    store, owner, client = new_store(), SessionTag("s1"), Client()
    await stored(store, owner, "1", step(1))
    cursor = await stored(store, owner, "1", final())
    current_session.set(owner)
    with anyio.fail_after(5):
        await store.replay_events_after(cursor, client)
    assert client.got == []


async def test_eviction_overtaking_a_waiting_follower_is_a_gap_never_a_skip() -> None:
    store, owner, client = new_store(capacity=4), SessionTag("s1"), Client()
    cursor = await stored(store, owner, "1", step(1))
    state = ResumeState()
    failure: list[BaseException] = []

    async def resume() -> None:
        current_session.set(owner)
        current_resume.set(state)
        try:
            await store.replay_events_after(cursor, client)
        except ResumptionGap as exc:
            failure.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(resume)
        await anyio.wait_all_tasks_blocked()
        await stored(store, owner, "1", step(2))  # ours: woken, but not yet running
        for n in range(4):  # other streams push it out of the ring before the follower runs
            await stored(store, owner, "9", step(100 + n))
        with anyio.fail_after(5):
            while not failure:
                await checkpoint()
    assert client.got == [] and state.broken
    assert "evicted" in str(failure[0])
