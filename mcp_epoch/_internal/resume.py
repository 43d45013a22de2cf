"""A resumed stream, served from the replay buffer from the cursor to the stream's end.

The buffer is the only source: every event is appended there before the SDK sends it anywhere,
so a follower that replays the missing suffix and then waits on the buffer for the next event
of its (session, stream) has no "replayed" / "live" hand-off for an event to fall through.
It ends after the stream's final response, and not before: a resumed stream that ended early
would leave a client that resumes once (as the SDK does for an explicit resumption) waiting for
an answer that never comes. When eviction overtakes a slow follower it raises
:class:`ResumptionGap` and marks the request broken; the guard then aborts the connection
instead of ending it cleanly, so the client reconnects from its last cursor and hears ``gap``.
This module imports neither ``mcp`` nor any I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import anyio

from mcp_epoch._internal.buffer import BufferedEvent, ReplayBuffer
from mcp_epoch._internal.decision import ReplayPlan
from mcp_epoch._internal.errors import ResumptionGap

StreamKey = tuple[Hashable | None, str]


@dataclass(slots=True)
class ResumeState:
    """Set by the guard around an admitted resumption; ``broken`` asks it to abort the wire."""

    broken: bool = False


current_resume: ContextVar[ResumeState | None] = ContextVar("epochsvc_resume", default=None)


def mark_broken() -> None:
    """The resumed stream cannot go on exactly: its connection must not end as if complete."""
    state = current_resume.get()
    if state is not None:
        state.broken = True


class Followers(dict[StreamKey, set[anyio.Event]]):
    """Who waits for the next event of which (session, stream); woken on every append. A
    dict, so that "anyone waiting?", asked for every event stored, is no call into Python."""

    __slots__ = ()

    def wake(self, key: StreamKey) -> None:
        for event in self.pop(key, ()):
            event.set()

    def register(self, key: StreamKey) -> anyio.Event:
        event = anyio.Event()
        self.setdefault(key, set()).add(event)
        return event

    def discard(self, key: StreamKey, event: anyio.Event) -> None:
        waiting = self.get(key)
        if waiting is not None:
            waiting.discard(event)
            if not waiting:
                del self[key]


async def follow(
    buffer: ReplayBuffer,
    followers: Followers,
    plan: ReplayPlan,
    owner: Hashable | None,
    send: Callable[[BufferedEvent], Awaitable[None]],
) -> None:
    """Send ``plan.events``, then every later event of the plan's stream, until a final one.

    The check for new events and the registration as a waiter run without an await between
    them, and appends happen on the same event loop, so no append can slip between the two.
    """
    cursor = buffer.get(plan.cursor.seq)
    if cursor is not None and cursor.final:
        return  # the client already has the final response: nothing follows it
    await follow_from(buffer, followers, plan.events, plan.upto, owner, plan.stream_id, send)


async def follow_from(
    buffer: ReplayBuffer,
    followers: Followers,
    events: Sequence[BufferedEvent],
    pos: int,
    owner: Hashable | None,
    stream_id: str,
    send: Callable[[BufferedEvent], Awaitable[None]],
) -> None:
    """Send ``events``, then every event of (``owner``, ``stream_id``) from seq ``pos`` on,
    until a final one. With no ``events`` and ``pos`` the buffer's next seq, that is a stream
    followed from now (a standalone stream opened without a cursor)."""
    key: StreamKey = (owner, stream_id)
    while True:
        for ev in events:
            await send(ev)
            if ev.final:
                return
        while True:
            events = _ours_from(buffer, pos, owner, stream_id)
            pos = buffer.next_seq
            if events:
                break
            waiter = followers.register(key)
            try:
                await waiter.wait()
            finally:
                followers.discard(key, waiter)


def _ours_from(
    buffer: ReplayBuffer, pos: int, owner: Hashable | None, stream_id: str
) -> list[BufferedEvent]:
    """The stream's events from seq ``pos`` on; raise if one of them may have been evicted."""
    if buffer.is_evicted(pos):
        raise ResumptionGap(f"event {pos} was evicted before the resumed stream could send it")
    return buffer.matching(pos - 1, owner, stream_id)
