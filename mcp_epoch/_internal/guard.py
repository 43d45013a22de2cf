"""``ResumptionGuard``: ASGI middleware in front of the SDK that routes and decides each request.

Left alone, the SDK answers an unknown ``Last-Event-ID`` with an empty 200 stream (the client
waits forever) and a failing store with a 500 (the client retries the same dead cursor). The
guard answers instead: 400 for a malformed cursor, and for a rejected one a 404, which makes
spec-following clients re-initialize, with a JSON-RPC error whose ``data.reason`` says why and a
``Mcp-Resumption-Rejected`` header. Session IDs carry their owner's epoch
(:mod:`mcp_epoch._internal.sessionid`), so a request of another live or draining process's
session is forwarded to it (:mod:`mcp_epoch._internal.forward`) rather than rejected. It also
tags every request with its session (see :mod:`mcp_epoch._internal.sessions`), counts the calls
in flight for a graceful drain, and, when this process is a zombie, refuses new sessions.
Requests of the 2026-07-28 revision (no sessions, no resumption) pass through untouched.
This module does not import ``mcp``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Final, Protocol

from mcp_epoch._internal.body import BodyTooLarge, read_body
from mcp_epoch._internal.decision import ReplayPlan, classify
from mcp_epoch._internal.errors import Reason, ResumptionRejected
from mcp_epoch._internal.eventid import EventId
from mcp_epoch._internal.forward import (
    MISDIRECTED,
    NOT_THE_OWNER_HEADER,
    Forwarder,
    OwnerLost,
    OwnerUnreachable,
    Route,
    live_peers,
    route_to,
)
from mcp_epoch._internal.inflight import InFlight, requests_in
from mcp_epoch._internal.resume import ResumeState, current_resume
from mcp_epoch._internal.sessionid import SessionId
from mcp_epoch._internal.sessions import SessionRegistry, SessionTag, current_session
from mcp_epoch._internal.snapshot import EpochSnapshot
from mcp_epoch.contract import (
    CALL_STREAM_HEADER,
    FORWARDED_TO_HEADER,
    REJECTED_HEADER,
    SESSION_SEPARATOR,
    ProcessEpoch,
)

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_HEADER: Final = b"mcp-session-id"
LAST_EVENT_ID_HEADER: Final = b"last-event-id"
PROTOCOL_HEADER: Final = b"mcp-protocol-version"
# Revisions with sessions and Last-Event-ID resumption (no header: the spec's default, 2025-03-26).
RESUMABLE_REVISIONS: Final = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
INVALID_REQUEST: Final = -32600
#: The SDK's stream ID for a session's standalone GET stream (every other stream is a call's).
STANDALONE_STREAM: Final = "_GET_stream"


class ResumeAuthority(Protocol):
    """What the guard needs from the store (``EpochEventStore`` satisfies it)."""

    @property
    def epoch(self) -> ProcessEpoch: ...

    def snapshot(self) -> EpochSnapshot: ...

    def decide(self, cursor: str | EventId, owner: SessionTag | None) -> ReplayPlan: ...

    def is_zombie(self) -> bool: ...


def error_body(
    message: str, data: dict[str, Any] | None = None, code: int = INVALID_REQUEST
) -> bytes:
    """A JSON-RPC error with no id: what the guard answers instead of the SDK."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()


async def respond(
    send: Send, status: int, body: bytes, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """A complete JSON answer, sent by the guard itself."""
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_rejection(send: Send, reason: Reason, detail: str = "") -> None:
    """404 + ``Mcp-Resumption-Rejected``: the client must start a fresh session."""
    data = {"reason": reason, **({"detail": detail} if detail else {})}
    body = error_body(f"Resumption rejected ({reason}): start a new session", data)
    await respond(send, 404, body, [(REJECTED_HEADER.encode(), reason.encode())])


class ResumptionGuard:
    """Wrap the SDK's Streamable HTTP ASGI app: ``ResumptionGuard(app, store)``.

    Per request it decides, in this order: a forwarded request meant for another process is
    refused (421); a request whose session or cursor belongs to another process goes to that
    owner if the ledger says it is live or draining (:mod:`mcp_epoch._internal.forward`), and
    is rejected otherwise; a new session on a draining process goes to a live peer; a new call
    on a draining process's own session is rejected before it starts; the rest is served here.
    """

    def __init__(
        self,
        app: ASGIApp,
        store: ResumeAuthority,
        *,
        inflight: InFlight | None = None,
        forwarder: Forwarder | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.sessions = SessionRegistry()
        self.inflight = inflight if inflight is not None else InFlight()
        self.forwarder = forwarder if forwarder is not None else Forwarder()
        #: Set when this process drains (SIGTERM); the ledger saying ``draining`` counts too.
        self.draining = False

    def is_draining(self) -> bool:
        if self.draining:
            return True
        view = self.store.snapshot()
        rec = view.epochs.get(str(self.store.epoch.pod))
        return rec is not None and rec.state == "draining"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for key, value in scope["headers"]:
            headers.setdefault(bytes(key).lower(), bytes(value))
        revision = headers.get(PROTOCOL_HEADER)
        if revision is not None and revision.decode("latin-1") not in RESUMABLE_REVISIONS:
            await self.app(scope, receive, send)  # 2026-07-28 and later: not ours
            return
        own = self.store.epoch
        forwarded_to = headers.get(FORWARDED_TO_HEADER.encode())
        if forwarded_to is not None and forwarded_to.decode("latin-1") != str(own):
            body = error_body(f"this is process {own}, not {forwarded_to.decode('latin-1')!r}")
            mark = (NOT_THE_OWNER_HEADER.encode(), str(own).encode())
            await respond(send, MISDIRECTED, body, [mark])
            return

        method = scope.get("method")
        raw_cursor = headers.get(LAST_EVENT_ID_HEADER)
        cursor: EventId | None = None
        if method == "GET" and raw_cursor:
            try:
                cursor = EventId.decode(raw_cursor.decode("latin-1"))
            except ValueError as exc:
                await respond(send, 400, error_body(f"Malformed Last-Event-ID: {exc}"))
                return
        raw_sid = headers.get(SESSION_HEADER)
        sid: SessionId | None = None
        if raw_sid is not None:
            try:
                sid = SessionId.decode(raw_sid.decode("latin-1"))
            except ValueError as exc:
                await send_rejection(send, "unknown", str(exc))
                return

        owner = sid.owner if sid is not None else cursor.epoch if cursor is not None else None
        elsewhere = owner is not None and owner != own
        body = b""
        if method == "POST" or elsewhere:
            # Once, before deciding anything (see mcp_epoch._internal.body for why).
            try:
                body, early = await read_body(receive)
            except BodyTooLarge as exc:
                await respond(send, 413, error_body(str(exc)))
                return
            if early is not None:
                return  # the client left before its request arrived: nothing ran
        if elsewhere:
            assert owner is not None
            await self._to_owner(
                scope, body, receive, send, owner, forwarded=forwarded_to is not None
            )
            return
        if sid is None and method == "POST":
            if self.store.is_zombie():
                await send_rejection(send, "retired", "this process's epoch is retired")
                return
            if forwarded_to is None and self.is_draining():
                peer = self.forwarder.pick(live_peers(self.store.snapshot(), own))
                if peer is not None and await self._forward(scope, body, receive, send, peer):
                    return  # a live peer took the new session; otherwise it is served here
        await self._serve(scope, body, receive, send, sid, cursor, method, forwarded_to is not None)

    async def _to_owner(
        self,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
        owner: ProcessEpoch,
        *,
        forwarded: bool,
    ) -> None:
        view = self.store.snapshot()
        route = None if forwarded else route_to(view, owner)  # hop limit: one
        if route is not None and await self._forward(scope, body, receive, send, route):
            return
        # The ledger says the owner lives but it did not answer at its address: for the client
        # that is a process that is gone.
        reason: Reason = "retired" if route is not None else classify(view, owner)
        log.info("request for session of %s rejected: %s", owner, reason)
        await send_rejection(send, reason, f"the session's process {owner} is not here")

    async def _forward(
        self, scope: Scope, body: bytes, receive: Receive, send: Send, route: Route
    ) -> bool:
        """True when the owner answered (the answer went to the client); False: unreachable.
        The relays a drain waits for count in :attr:`inflight` (see ``Forwarder.forward``)."""
        try:
            await self.forwarder.forward(scope, body, receive, send, route, self.inflight.relaying)
        except OwnerUnreachable as exc:
            log.warning("owner unreachable, rejecting instead: %s", exc)
            return False
        except OwnerLost as exc:
            body_ = error_body(f"the owning process {route.epoch} went away: {exc}")
            await respond(send, 502, body_)
        return True

    async def _serve(
        self,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
        sid: SessionId | None,
        cursor: EventId | None,
        method: str | None,
        forwarded: bool = False,
    ) -> None:
        tag = None if sid is None else self.sessions.get(sid.local)
        streams: list[str] = []  # the request streams whose chunks may deliver a call
        call_stream = False  # a forwarded resumption of a call's stream: the relay says so
        if cursor is not None:
            plan = await self._admit_resumption(cursor, tag, send)
            if plan is None:
                return
            streams.append(plan.stream_id)
            call_stream = forwarded and plan.stream_id != STANDALONE_STREAM
        calls: list[str] = []
        if method == "POST":
            receive = _replay(body, receive)  # the SDK reads the body the guard has read
            calls, cancelled, work = requests_in(body)
            if work and sid is not None and self.is_draining():
                await send_rejection(
                    send,
                    "retired",
                    "this process is draining: the call was not started, start a new session",
                )
                return
            for rid in cancelled:
                self.inflight.forget((tag, rid))
        fresh = tag is None and sid is None
        if fresh:
            tag = SessionTag()
        assert tag is not None or sid is not None
        for rid in calls:
            self.inflight.started((tag, rid))
        if sid is not None:
            scope = dict(scope, headers=_with_session(scope["headers"], sid.local))
        resume = ResumeState() if cursor is not None else None
        token = current_session.set(tag)
        resume_token = current_resume.set(resume)
        wrapped = self._wrap_send(send, tag, fresh, resume, streams + calls, call_stream)
        try:
            await self.app(scope, receive, wrapped)
        finally:
            current_resume.reset(resume_token)
            current_session.reset(token)
        if method == "DELETE" and tag is not None:
            self.inflight.forget_session(tag)

    async def _admit_resumption(
        self, cursor: EventId, tag: SessionTag | None, send: Send
    ) -> ReplayPlan | None:
        try:
            return self.store.decide(cursor, tag)
        except ResumptionRejected as exc:
            log.info("resumption rejected: %s", exc)
            await send_rejection(send, exc.reason, exc.detail)
        except Exception:
            # A failing decision must not become a 500 the client would retry forever.
            log.exception("resume decision failed; rejecting")
            await send_rejection(send, "unknown", "the server could not check the cursor")
        return None

    def _wrap_send(
        self,
        send: Send,
        tag: SessionTag | None,
        fresh: bool,
        resume: ResumeState | None,
        streams: list[str],
        call_stream: bool = False,
    ) -> Send:
        own = str(self.store.epoch)
        swallowing = False
        whole = False  # a JSON (not SSE) answer: its end delivers the call

        async def wrapped(message: Message) -> None:
            nonlocal swallowing, whole
            if message["type"] == "http.response.start":
                if resume is not None and message.get("status", 200) >= 500:
                    # The SDK failed after we accepted (e.g. the store raised): translate.
                    swallowing = True
                    await send_rejection(send, "unknown", "the server could not replay")
                    return
                headers = self._outgoing(message, tag, fresh, own)
                if call_stream:
                    headers.append((CALL_STREAM_HEADER.encode(), b"1"))
                message = dict(message, headers=headers)
                if resume is None and message.get("status", 200) >= 400:
                    for rid in streams:  # refused by the SDK (e.g. an ended session): no call
                        self.inflight.forget((tag, rid))
                whole = message.get("status", 200) < 300 and any(
                    bytes(k).lower() == b"content-type" and bytes(v).startswith(b"application/json")
                    for k, v in message["headers"]
                )
            elif swallowing:
                return
            elif resume is not None and resume.broken and not message.get("more_body", False):
                # Never end a resumed stream that lost events as if it were complete: without
                # its last chunk the server closes the connection, and the client reconnects
                # from the cursor it really has (and is told ``gap``).
                log.warning("resumed stream overtaken by eviction; aborting its connection")
                return
            await send(message)
            if message["type"] != "http.response.body" or not streams:
                return
            # A chunk written after the call's answer was stored carries that answer (it is the
            # last message of its stream): the call is delivered. Clients often close a stream
            # once they have the answer, before its final empty chunk.
            for rid in streams:
                if whole and not message.get("more_body", False):
                    self.inflight.delivered_whole((tag, rid))
                else:
                    self.inflight.sent_after((tag, rid))

        return wrapped

    def _outgoing(
        self, start: Message, tag: SessionTag | None, fresh: bool, own: str
    ) -> list[tuple[bytes, bytes]]:
        """Response headers with the session ID shown as ``<own epoch>_<SDK id>``."""
        out = []
        for key, value in start.get("headers", ()):
            if bytes(key).lower() == SESSION_HEADER:
                local = bytes(value).decode("latin-1")
                if fresh and tag is not None:
                    self.sessions.bind(local, tag)
                value = f"{own}{SESSION_SEPARATOR}{local}".encode("latin-1")
            out.append((key, value))
        return out


def _with_session(headers: Sequence[tuple[bytes, bytes]], local: str) -> list[tuple[bytes, bytes]]:
    """The request's headers with the SDK's own session ID instead of the one clients see."""
    return [
        (k, local.encode("latin-1")) if bytes(k).lower() == SESSION_HEADER else (k, v)
        for k, v in headers
    ]


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands out ``body`` whole once, then whatever ``receive`` brings next
    (a disconnect): the app sees the request as the client sent it."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
