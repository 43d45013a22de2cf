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

import json
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio

Call = tuple[Hashable, str]  # (session tag, JSON-RPC request id as the SDK's stream id)


class InFlight:
    """Calls started and not yet delivered, and an event for "none left"."""

    def __init__(self) -> None:
        self._calls: dict[Call, bool] = {}  # call -> answered
        self._relays: dict[object, str] = {}  # relay -> the process it goes to
        self._idle: anyio.Event | None = None  # made on the event loop, by the first call
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

    def _busy(self) -> None:
        if self._idle is None or self._idle.is_set():
            self._idle = anyio.Event()

    def started(self, call: Call) -> None:
        self._busy()
        self._calls.setdefault(call, False)

    @contextmanager
    def relaying(self, to: str) -> Iterator[None]:
        """Count a forwarded request as in flight while its relay runs."""
        token = object()
        self._busy()
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
        while len(self) and self._idle is not None:
            await self._idle.wait()


#: Requests a draining process refuses on its own sessions: those that start work of
#: unbounded length. Everything else is answered at once, and clients need it to finish the
#: calls they have (the SDK client lists tools to check a call's result, pings a session).
WORK_METHODS = frozenset({"tools/call"})


def requests_in(body: bytes) -> tuple[list[str], list[str], bool]:
    """(ids of JSON-RPC requests, ids named by ``notifications/cancelled``, whether a request
    starts work (see :data:`WORK_METHODS`)) in a POST body.

    Ids are given as the SDK names a request's stream (``str(id)``). A body that is not JSON-RPC
    yields nothing: the SDK answers it, and there is no call to wait for.
    """
    try:
        parsed: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return [], [], False
    requests: list[str] = []
    cancelled: list[str] = []
    work = False
    for item in _items(parsed):
        method = item.get("method")
        if not isinstance(method, str):
            continue
        if "id" in item and isinstance(item["id"], str | int) and not isinstance(item["id"], bool):
            requests.append(str(item["id"]))
            work = work or method in WORK_METHODS
        elif method == "notifications/cancelled":
            params = item.get("params")
            rid = params.get("requestId") if isinstance(params, dict) else None
            if isinstance(rid, str | int) and not isinstance(rid, bool):
                cancelled.append(str(rid))
    return requests, cancelled, work


def _items(parsed: Any) -> Iterator[dict[str, Any]]:
    for item in parsed if isinstance(parsed, list) else [parsed]:
        if isinstance(item, dict):
            yield item


def request_id_of(body: bytes) -> str | int | None:
    """The id of the one JSON-RPC request in a POST body, as sent (for an error answer to
    echo); None for anything else."""
    try:
        parsed: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    rid = parsed.get("id") if isinstance(parsed, dict) and "method" in parsed else None
    return rid if isinstance(rid, str | int) and not isinstance(rid, bool) else None


def log_level_in(body: bytes) -> str | None:
    """The level of a ``logging/setLevel`` request in a POST body (it moves with a session)."""
    if b"logging/setLevel" not in body:
        return None
    level = None
    try:
        parsed: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    for item in _items(parsed):
        params = item.get("params")
        if item.get("method") == "logging/setLevel" and isinstance(params, dict):
            value = params.get("level")
            level = value if isinstance(value, str) and len(value) <= 32 else level
    return level
