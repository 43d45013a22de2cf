"""The forward path: hand a request to the process that owns its session, over the network.

Where the owner is comes from the ledger's live view (the operator writes each epoch's pod
address from the API server; a client never names an address). A forwarded request carries
``Mcp-Epoch-Forwarded-To: <owner's process epoch>``; the receiver serves it only if that is its
own epoch (an address reused by another pod answers 421 and the request is rejected, never
served by a stranger) and never forwards it again. Bodies and responses stream through
unbuffered with the ASGI server's backpressure; a client that goes away cancels the forwarded
request; an owner that dies mid-stream cuts the client's stream as a direct drop would, so the
client resumes from the last event it really got.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final

import anyio
import httpx

from mcp_epoch._internal.snapshot import EpochSnapshot
from mcp_epoch._internal.unfinished import UNFINISHED
from mcp_epoch.contract import (
    CALL_STREAM_HEADER,
    FORWARDED_BY_HEADER,
    FORWARDED_TO_HEADER,
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
_HOP_BY_HOP: Final = frozenset(
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


class OwnerLost(Exception):
    """The owner took the request and then went away before answering: it may have run."""


class Forwarder:
    """One HTTP client for every forward of this process, a connection per request."""

    def __init__(self, *, connect_timeout: float = 2.0) -> None:
        self._timeout = httpx.Timeout(connect=connect_timeout, read=None, write=30.0, pool=5.0)
        self._client: httpx.AsyncClient | None = None
        self._rr = itertools.count()
        self._relays: set[anyio.CancelScope] = set()
        self.forwarded = 0

    def pick(self, peers: list[Route]) -> Route | None:
        return peers[next(self._rr) % len(peers)] if peers else None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self._timeout,
                # No connection is kept for reuse: an owner that starts draining closes its
                # idle connections, and a request sent on one at that moment is lost
                # unanswered, unknowable as "not run". A fresh connection costs ~0.1 ms here.
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
                trust_env=False,  # the cluster network, never a proxy from the environment
                follow_redirects=False,
            )
        return self._client

    def cut_relays(self) -> int:
        """End every relay still running as a dropped connection would end it (no final
        chunk, so its client resumes from its cursor elsewhere), rather than leave them to be
        cancelled by the ASGI server's shutdown. Returns how many were cut."""
        for scope in self._relays:
            scope.cancel()
        return len(self._relays)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def forward(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        route: Route,
        hold: Hold | None = None,
    ) -> None:
        """Send the request to ``route`` and stream its answer back. Raises
        :class:`OwnerUnreachable` when nothing reached the owner (and nothing was sent to the
        client), :class:`OwnerLost` when the owner took the request and went away unanswered.

        ``hold(owner)`` is held for the relays a drain of this process must wait for: a POST
        from the start until its relay ends (its length is the owner's answer), a GET only
        while relaying a replay the owner marks as a call's stream. Any other GET is the
        standalone stream, of unbounded length: a drain does not wait for it, and a client cut
        off resumes it elsewhere from its cursor.
        """
        held = hold or _no_hold
        if scope.get("method") == "POST":
            with held(str(route.epoch)):
                await self._forward(scope, receive, send, route, _no_hold)
        else:
            await self._forward(scope, receive, send, route, held)

    async def _forward(
        self, scope: Scope, receive: Receive, send: Send, route: Route, call_stream: Hold
    ) -> None:
        headers = [(k, v) for k, v in scope["headers"] if bytes(k).lower() not in _HOP_BY_HOP]
        headers.append((FORWARDED_TO_HEADER.encode(), str(route.epoch).encode()))
        path = scope.get("raw_path") or scope["path"].encode()
        url = f"http://{route.address}{bytes(path).decode('latin-1')}"
        if scope.get("query_string"):
            url += "?" + bytes(scope["query_string"]).decode("latin-1")
        request = self._http().build_request(
            scope["method"], url, headers=headers, content=_request_body(receive)
        )
        try:
            response = await self._http().send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # Nothing was sent: the request certainly did not run.
            raise OwnerUnreachable(f"{route.epoch} at {route.address}: {exc!r}") from None
        except httpx.TransportError as exc:
            if reset_unread(exc):
                # The owner closed with the request unread (it stopped accepting as the
                # request arrived): it cannot have run, so the client may be sent elsewhere.
                raise OwnerUnreachable(
                    f"{route.epoch} at {route.address} reset the connection unread: {exc!r}"
                ) from None
            # Sent, but no answer: it may have run, so the client must not be told "retry".
            log.warning("forward to %s lost its connection: %r", route.epoch, exc)
            raise OwnerLost(repr(exc)) from None
        try:
            if response.status_code == MISDIRECTED and NOT_THE_OWNER_HEADER in response.headers:
                said = (await response.aread())[:200].decode("utf-8", "replace")
                raise OwnerUnreachable(f"{route.address} is no longer {route.epoch}: {said}")
            self.forwarded += 1
            marked = CALL_STREAM_HEADER in response.headers
            with call_stream(str(route.epoch)) if marked else contextlib.nullcontext():
                await self._relay(response, receive, send, route)
        finally:
            await response.aclose()

    async def _relay(
        self, response: httpx.Response, receive: Receive, send: Send, route: Route
    ) -> None:
        # Raw bytes are relayed, so an upstream Content-Length stays true; chunked framing is
        # hop-by-hop and the ASGI server redoes it.
        out = [(k.lower(), v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]
        out.append((FORWARDED_BY_HEADER.encode(), str(route.epoch).encode()))
        await send({"type": "http.response.start", "status": response.status_code, "headers": out})
        ended = _Ended.CUT
        with anyio.CancelScope() as relay:
            self._relays.add(relay)
            try:
                ended = await self._stream(response, receive, send, route)
            finally:
                self._relays.discard(relay)
        if ended is _Ended.COMPLETE:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif ended is _Ended.CUT:
            # Left without its last chunk on purpose, for a client still there: not an error.
            UNFINISHED.expect()

    async def _stream(
        self, response: httpx.Response, receive: Receive, send: Send, route: Route
    ) -> _Ended:
        """Relay the body until it ends, the owner goes away, or the client does (or the
        relay is cut from outside, which cancels this)."""
        ended = _Ended.CUT
        async with anyio.create_task_group() as tg:

            async def client_gone() -> None:
                nonlocal ended
                while (await receive())["type"] != "http.disconnect":
                    pass
                ended = _Ended.CLIENT_LEFT
                tg.cancel_scope.cancel()  # the client left: stop the owner's side too

            tg.start_soon(client_gone)
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                ended = _Ended.COMPLETE
            except httpx.TransportError as exc:
                # The owner went away mid-answer: cut the client's stream as a drop would
                # (no final chunk), so it resumes from the last event it really received.
                log.info("forwarded stream from %s broke: %r", route.epoch, exc)
            tg.cancel_scope.cancel()
        return ended


class _Ended(enum.Enum):
    """How a relay ended."""

    COMPLETE = "complete"
    CUT = "cut"  # the owner went away, or this process cut it: the client's stream is cut
    CLIENT_LEFT = "client-left"


def reset_unread(exc: BaseException) -> bool:
    """True when a request failed because the owner's end reset the connection before any
    answer: TCP resets a connection closed with data still unread (RFC 9293, 3.6.1), which
    a process that read the whole request never does, so the owner cannot have run it. A
    clean close (FIN) stays ambiguous: the owner may have read it, run it, and died."""
    seen: BaseException | None = exc
    for _ in range(8):  # httpx -> httpcore -> anyio -> OSError
        if seen is None:
            return False
        if isinstance(seen, ConnectionResetError | BrokenPipeError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


async def _request_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise OwnerUnreachable("the client left before its request was sent")
        yield bytes(message.get("body", b""))
        if not message.get("more_body", False):
            return
