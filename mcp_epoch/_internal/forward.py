"""The forward path: hand a request to the process that owns its session, over the network.

Where the owner is comes from the ledger's live view (the operator writes each epoch's pod
address from the API server; a client never names an address). A forwarded request carries
``Mcp-Epoch-Forwarded-To: <owner's process epoch>``; the receiver serves it only if that is its
own epoch (an address reused by another pod answers 421 and the request is rejected, never
served by a stranger) and never forwards it again. A request body (one JSON-RPC message, read
whole by the guard within its bound) is sent on with its length; the answer streams through
unbuffered with the ASGI server's backpressure; a client that goes away cancels the forwarded
request; an owner that dies mid-stream cuts the client's stream as a direct drop would, so the
client resumes from the last event it really got.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final

import anyio

from mcp_epoch._internal import upstream
from mcp_epoch._internal.snapshot import EpochSnapshot
from mcp_epoch._internal.unfinished import UNFINISHED
from mcp_epoch.contract import (
    CALL_STREAM_HEADER,
    FORWARDED_BY_HEADER,
    FORWARDED_TO_HEADER,
    MOVED_TO_HEADER,
    PodEpoch,
    ProcessEpoch,
)

log = logging.getLogger(__name__)
#: Holds this process's drain while a relay goes on (``InFlight.relaying``), by owner.
Hold = Callable[[str], AbstractContextManager[None]]


def _no_hold(_owner: str) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

#: Never copied between hops (RFC 9110 section 7.6.1), plus what the next hop sets itself.
#: ``Host`` is kept, as proxies keep it: the owner checks it as the first replica did (the
#: SDK's DNS-rebinding protection answers 421 to a host it does not expect).
HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        FORWARDED_TO_HEADER.encode(),
        FORWARDED_BY_HEADER.encode(),
        CALL_STREAM_HEADER.encode(),
    }
)
MISDIRECTED: Final = 421
#: On the guard's own 421: "I am not that process" (any other 421 is the owner's answer).
NOT_THE_OWNER_HEADER: Final = "mcp-epoch-not-owner"


@dataclass(frozen=True, slots=True)
class Route:
    """Where a process epoch serves, according to the ledger."""

    epoch: ProcessEpoch
    address: str  # host:port ([v6]:port for IPv6)


def route_to(view: EpochSnapshot, target: ProcessEpoch) -> Route | None:
    """The owner's address if the ledger says that very process is live or draining."""
    if view.ledger8 is None or target.is_fallback or target.pod.ledger8 != view.ledger8:
        return None
    rec = view.epochs.get(str(target.pod))
    if rec is None or rec.state not in ("live", "draining") or rec.address is None:
        return None
    if rec.incarnation != target.incarnation:
        return None
    return Route(target, rec.address)


#: The longest chain of handoffs followed for one session (each move is one drained process).
MAX_MOVES: Final = 16


def successor_of(view: EpochSnapshot, epoch: ProcessEpoch) -> ProcessEpoch | None:
    """The process the ledger's handoff rule says took the sessions of ``epoch``, if any."""
    rec = view.epochs.get(str(epoch.pod))
    if rec is None or rec.successor is None or rec.successor_of != epoch.incarnation:
        return None
    try:
        return ProcessEpoch.parse(rec.successor)
    except ValueError:
        return None


def route_for(view: EpochSnapshot, owner: ProcessEpoch) -> Route | None:
    """Where a session minted by ``owner`` is served now: by the owner while it is live or
    draining (it sends on what it handed over); after it, by the process its handoff rule
    names, and so on down the chain."""
    target = owner
    for _ in range(MAX_MOVES):
        route = route_to(view, target)
        if route is not None:
            return route
        nxt = successor_of(view, target)
        if nxt is None:
            return None
        target = nxt
    return None


def live_peers(view: EpochSnapshot, own: ProcessEpoch) -> list[Route]:
    """Other processes of this server that take new sessions (live, address known)."""
    peers = []
    for rec in view.epochs.values():
        if rec.state != "live" or rec.address is None or rec.incarnation is None:
            continue
        try:
            epoch = ProcessEpoch(PodEpoch.parse(rec.epoch), rec.incarnation)
        except ValueError:
            continue
        if epoch.pod != own.pod:
            peers.append(Route(epoch, rec.address))
    return sorted(peers, key=lambda r: r.epoch)


class OwnerUnreachable(Exception):
    """The owner did not take the request (no connection, reset unread, or 421): it did not
    run there."""


class OwnerMoved(Exception):
    """The process asked no longer holds the session: it handed it on to ``to``. Nothing ran
    there, so the request may go to ``to``."""

    def __init__(self, to: ProcessEpoch) -> None:
        super().__init__(f"the session moved to {to}")
        self.to = to


class OwnerLost(Exception):
    """The owner took the request and then went away before answering: it may have run."""


class Forwarder:
    """Forwards requests to their owners, each over a connection of its own
    (:mod:`mcp_epoch._internal.upstream`)."""

    def __init__(self, *, connect_timeout: float = 2.0, write_timeout: float = 30.0) -> None:
        self._connect_timeout = connect_timeout
        self._write_timeout = write_timeout
        self._rr = itertools.count()
        self._relays: set[anyio.CancelScope] = set()
        self.forwarded = 0

    def pick(self, peers: list[Route]) -> Route | None:
        return peers[next(self._rr) % len(peers)] if peers else None

    def cut_relays(self) -> int:
        """End every relay still running as a dropped connection would end it (no final
        chunk, so its client resumes from its cursor elsewhere), rather than leave them to be
        cancelled by the ASGI server's shutdown. Returns how many were cut."""
        for scope in self._relays:
            scope.cancel()
        return len(self._relays)

    async def forward(
        self,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
        route: Route,
        hold: Hold | None = None,
    ) -> None:
        """Send the request, whose ``body`` the caller has read whole, to ``route`` and stream
        its answer back; ``receive`` then only tells that the client left. Raises
        :class:`OwnerUnreachable` when nothing reached the owner (and nothing was sent to the
        client), :class:`OwnerMoved` when it handed the session on (nothing ran, nothing was
        sent), :class:`OwnerLost` when the owner took the request and went away unanswered.

        ``hold(what)`` (the owner and the kind of relay, for the drain's log) is held for
        the relays a drain of this process must wait for: a POST from the start until its
        relay ends (its length is the owner's answer), a GET only while relaying a replay the
        owner marks as a call's stream. Any other GET is the standalone stream, of unbounded
        length: a drain does not wait for it, and a client cut off resumes it elsewhere from
        its cursor.
        """
        held = hold or _no_hold
        if scope.get("method") == "POST":
            with held(f"{route.epoch} (POST)"):
                await self._forward(scope, body, receive, send, route, _no_hold)
        else:
            await self._forward(scope, body, receive, send, route, held)

    async def _forward(
        self,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
        route: Route,
        call_stream: Hold,
    ) -> None:
        try:
            answer = await upstream.exchange(
                route.address,
                scope["method"],
                request_target(scope),
                _request_headers(scope, route),
                body,
                connect_timeout=self._connect_timeout,
                write_timeout=self._write_timeout,
            )
        except upstream.Refused as exc:
            # Nothing reached the owner, or it closed with the request unread (it stopped
            # accepting as the request arrived): it cannot have run, so the client may be
            # sent elsewhere.
            raise OwnerUnreachable(f"{route.epoch} at {route.address}: {exc}") from None
        except upstream.Broken as exc:
            # Sent, but no answer: it may have run, so the client must not be told "retry".
            log.warning("forward to %s lost its connection: %s", route.epoch, exc)
            raise OwnerLost(str(exc)) from None
        try:
            if answer.status == MISDIRECTED and answer.header(NOT_THE_OWNER_HEADER.encode()):
                moved = answer.header(MOVED_TO_HEADER.encode())
                if moved is not None:
                    try:
                        to = ProcessEpoch.parse(moved.decode("latin-1"))
                    except ValueError:
                        to = None
                    if to is not None:
                        raise OwnerMoved(to)
                said = await _said(answer)
                raise OwnerUnreachable(f"{route.address} is no longer {route.epoch}: {said}")
            self.forwarded += 1
            marked = answer.header(CALL_STREAM_HEADER.encode()) is not None
            relay = f"{route.epoch} (resumed call stream)"
            with call_stream(relay) if marked else contextlib.nullcontext():
                await self._relay(answer, receive, send, route)
        finally:
            answer.close()

    async def _relay(
        self, answer: upstream.Exchange, receive: Receive, send: Send, route: Route
    ) -> None:
        # The body's bytes are relayed, so an upstream Content-Length stays true; chunked
        # framing is hop-by-hop and the ASGI server redoes it.
        out = [(k, v) for k, v in answer.headers if k not in HOP_BY_HOP]
        out.append((FORWARDED_BY_HEADER.encode(), str(route.epoch).encode()))
        await send({"type": "http.response.start", "status": answer.status, "headers": out})
        ended = Ended.CUT
        with anyio.CancelScope() as relay:
            self._relays.add(relay)
            try:
                ended = await self._stream(answer, receive, send, route)
            finally:
                self._relays.discard(relay)
        if ended is Ended.COMPLETE:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif ended is Ended.CUT:
            # Left without its last chunk on purpose, for a client still there: not an error.
            UNFINISHED.expect()

    async def _stream(
        self, answer: upstream.Exchange, receive: Receive, send: Send, route: Route
    ) -> Ended:
        """Relay the body until it ends, the owner goes away, or the client does (or the
        relay is cut from outside, which cancels this)."""
        return await stream_answer(answer, receive, send, str(route.epoch))


async def stream_answer(
    answer: upstream.Exchange, receive: Receive, send: Send, peer: str
) -> Ended:
    """Send ``answer``'s body to the client as it comes, until it ends, ``peer`` (who
    answers, for the log) goes away, or the client does: then ``peer``'s side is closed, which
    is how a peer learns its client left."""
    if answer.small:  # already on its way whole: no watcher for the client
        return await _relay_body(answer, send, peer)
    # A plain task (an anyio task group cost ~0.15 ms per forwarded request here) that
    # ends the owner's side when the client leaves; the relay then ends as it would.
    watcher = asyncio.ensure_future(_client_gone(receive, answer))
    try:
        return await _relay_body(answer, send, peer, watcher.done)
    finally:
        watcher.cancel()


async def _client_gone(receive: Receive, answer: upstream.Exchange) -> None:
    """Return once the client has left, having closed the owner's side of its relay."""
    while (await receive())["type"] != "http.disconnect":
        pass
    answer.close()


async def _relay_body(
    answer: upstream.Exchange,
    send: Send,
    peer: str,
    client_left: Callable[[], bool] = lambda: False,
) -> Ended:
    """Send the answer's body on as it comes; CUT when the owner went away mid-answer: the
    client's stream is then cut as a drop would cut it (no final chunk), so it resumes from
    the last event it really received."""
    try:
        while (chunk := await answer.chunk()) is not None:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except upstream.Broken as exc:
        if client_left():
            return Ended.CLIENT_LEFT
        log.info("relayed stream from %s broke: %s", peer, exc)
        return Ended.CUT
    return Ended.COMPLETE


class Ended(enum.Enum):
    """How a relay ended."""

    COMPLETE = "complete"
    CUT = "cut"  # the owner went away, or this process cut it: the client's stream is cut
    CLIENT_LEFT = "client-left"


def request_target(scope: Scope) -> bytes:
    """The request target as the client sent it (path and query)."""
    path = bytes(scope.get("raw_path") or scope["path"].encode())
    query = bytes(scope.get("query_string") or b"")
    return path + b"?" + query if query else path


def _request_headers(scope: Scope, route: Route) -> list[tuple[bytes, bytes]]:
    """The client's end-to-end headers (its ``Host`` kept, as proxies keep it: the owner
    checks it as the first replica did; its length set anew with the body) and the one
    naming the owner."""
    headers = [
        (bytes(k).lower(), bytes(v))
        for k, v in scope["headers"]
        if bytes(k).lower() not in HOP_BY_HOP and bytes(k).lower() != b"content-length"
    ]
    if not any(k == b"host" for k, _ in headers):  # an HTTP/1.0 client may send none
        headers.append((b"host", route.address.encode()))
    headers.append((FORWARDED_TO_HEADER.encode(), str(route.epoch).encode()))
    return headers


async def _said(answer: upstream.Exchange) -> str:
    """The start of an owner's refusal, for the log."""
    try:
        return (await answer.read(200)).decode("utf-8", "replace")
    except upstream.Broken as exc:
        return str(exc)
