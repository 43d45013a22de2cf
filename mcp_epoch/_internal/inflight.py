"""Which calls of this process are still in flight: what a graceful drain waits for.

A call is in flight from the POST that carries its JSON-RPC request until its final response
has been *delivered*: stored (the event store sees every message before it is sent) and then
sent on a stream that ended cleanly, the POST's own or a resumed GET of the same stream. A call
whose client was cut off after its answer was stored therefore still counts until the client
comes back for it, so a draining process does not exit with an answer nobody has heard.
A cancelled request (``notifications/cancelled``) or a deleted session is no longer waited for.

A POST this process forwards to another (a call on a peer's session, a new session sent to a
live peer) is in flight too, until its relay ends: a draining process that exits mid-relay cuts
the client off from an owner that is still alive, often before the first event, when the client
has no cursor to resume from and cannot know whether the call ran.
Everything here runs on the server's event loop; nothing blocks.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager

import anyio

Call = tuple[Hashable, str]  # (session tag, JSON-RPC request id as the SDK's stream id)


class InFlight:
    """Calls started and not yet delivered, and an event for "none left"."""

    def __init__(self) -> None:
        self._calls: dict[Call, bool] = {}  # call -> answered
        #: ``is_answered(call, False)``: whether a call in flight has its answer stored. The
        #: dict's own ``get``, so the check made for every chunk sent is no call into Python.
        self.is_answered = self._calls.get
        self._relays: dict[object, str] = {}  # relay -> the process it goes to
        #: Made by a waiter (never on a call's path: an event per call cost ~10 us of each
        #: request), set and dropped once nothing is in flight.
        self._idle: anyio.Event | None = None
        self._changed: anyio.Event | None = None  # set (and dropped) at every call's end
        self.delivered = 0

    def __len__(self) -> int:
        return len(self._calls) + len(self._relays)

    @property
    def relays(self) -> int:
        """Forwarded requests whose relay has not ended."""
        return len(self._relays)

    def pending(self) -> list[tuple[str, bool]]:
        """``(request id, answered)`` of every call still waited for, then ``("relay to
        <epoch>", False)`` per forwarded request (for the drain's log)."""
        calls = [(rid, answered) for (_tag, rid), answered in self._calls.items()]
        return calls + [(f"relay to {to}", False) for to in self._relays.values()]

    def started(self, call: Call) -> None:
        self._calls.setdefault(call, False)

    @contextmanager
    def relaying(self, to: str) -> Iterator[None]:
        """Count a forwarded request as in flight while its relay runs."""
        token = object()
        self._relays[token] = to
        try:
            yield
        finally:
            del self._relays[token]
            self._settle()

    def answered(self, call: Call) -> None:
        if call in self._calls:
            self._calls[call] = True

    def sent_after(self, call: Call) -> None:
        """A chunk of ``call``'s stream was written: the call is delivered if it was answered
        before (the answer is the last message of a stream, so this chunk carried it)."""
        if self._calls.get(call, False):
            self._finish(call)

    def delivered_whole(self, call: Call) -> None:
        """A plain JSON response (the SDK's ``json_response`` mode) carrying the answer ended."""
        self._finish(call)

    def forget(self, call: Call) -> None:
        self._finish(call, count=False)

    def forget_session(self, tag: Hashable) -> None:
        """Wait no more for the calls of ``tag`` (ended by DELETE, or handed on with them)."""
        for call in [c for c in self._calls if c[0] is tag]:
            self._finish(call, count=False)

    def _finish(self, call: Call, *, count: bool = True) -> None:
        if self._calls.pop(call, None) is not None and count:
            self.delivered += 1
        self._settle()

    def _settle(self) -> None:
        self.wake()
        if not self._calls and not self._relays and self._idle is not None:
            self._idle.set()
            self._idle = None

    def working(self, tag: Hashable) -> bool:
        """Whether a call of session ``tag`` is still unanswered. A session moves only when
        none is: an answered call's stream has ended, so the tail handed over with the session
        holds all of it, and the call is delivered from there (:meth:`forget_session`)."""
        return any(call[0] is tag and not answered for call, answered in self._calls.items())

    def wake(self) -> None:
        """Wake every :meth:`changed` waiter without a change (they look again)."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def changed(self) -> None:
        """Return once some call or relay has ended (or been forgotten)."""
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    async def wait_idle(self) -> None:
        while len(self):
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()
