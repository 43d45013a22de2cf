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

import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from mcp_epoch._internal.answer import SESSION_HEADER as SESSION_HEADER
from mcp_epoch._internal.answer import Answer, CallKey, with_close
from mcp_epoch._internal.body import BodyTooLarge, read_body
from mcp_epoch._internal.decision import ReplayPlan, TailPlan, classify, decide_handed
from mcp_epoch._internal.errors import Reason, ResumptionRejected
from mcp_epoch._internal.eventid import EventId
from mcp_epoch._internal.forward import (
    MAX_MOVES,
    MISDIRECTED,
    NOT_THE_OWNER_HEADER,
    Forwarder,
    OwnerLost,
    OwnerMoved,
    OwnerUnreachable,
    Route,
    live_peers,
    route_for,
    successor_of,
)
from mcp_epoch._internal.inflight import InFlight
from mcp_epoch._internal.postbody import read_post
from mcp_epoch._internal.replies import INVALID_REQUEST as INVALID_REQUEST
from mcp_epoch._internal.replies import RequestId as RequestId
from mcp_epoch._internal.replies import error_body as error_body
from mcp_epoch._internal.replies import respond as respond
from mcp_epoch._internal.replies import send_rejection as send_rejection
from mcp_epoch._internal.resume import ResumeState, current_resume
from mcp_epoch._internal.sessionid import SessionId
from mcp_epoch._internal.sessions import SessionRegistry, SessionTag, current_session
from mcp_epoch._internal.snapshot import EpochSnapshot
from mcp_epoch._internal.unfinished import UNFINISHED
from mcp_epoch.contract import (
    CALL_STREAM_HEADER,
    FORWARDED_TO_HEADER,
    MOVED_TO_HEADER,
    SERVED_BY_HEADER,
    TAIL_OF_HEADER,
    ProcessEpoch,
)

if TYPE_CHECKING:
    from mcp_epoch._internal.handoff import Handoff

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LAST_EVENT_ID_HEADER: Final = b"last-event-id"
PROTOCOL_HEADER: Final = b"mcp-protocol-version"
# Revisions with sessions and Last-Event-ID resumption (no header: the spec's default, 2025-03-26).
RESUMABLE_REVISIONS: Final = frozenset({"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"})
_RESUMABLE: Final = frozenset(r.encode() for r in RESUMABLE_REVISIONS)
#: How long a request sent on to where its session moved waits for this process's copy of
#: the ledger to know that process.
MOVE_WAIT: Final = 3.0
#: The header names the guard reads or writes on every request, encoded once.
_FORWARDED_TO: Final = FORWARDED_TO_HEADER.encode()
WaitView = Callable[[Callable[[EpochSnapshot], bool], float], Awaitable[bool]]
#: The SDK's stream ID for a session's standalone GET stream (every other stream is a call's).
STANDALONE_STREAM: Final = "_GET_stream"


class ResumeAuthority(Protocol):
    """What the guard needs from the store (``EpochEventStore`` satisfies it)."""

    @property
    def epoch(self) -> ProcessEpoch: ...

    #: ``str(epoch)`` and ``str(epoch.pod)``, made once.
    epoch_text: str
    pod_text: str

    def snapshot(self) -> EpochSnapshot: ...

    def decide(self, cursor: str | EventId, owner: SessionTag | None) -> ReplayPlan: ...

    def is_zombie(self) -> bool: ...


class ResumptionGuard:
    """Wrap the SDK's Streamable HTTP ASGI app: ``ResumptionGuard(app, store)``.

    Per request it decides, in this order: a forwarded request meant for another process is
    refused (421); a request of a session this process holds is served here, or sent on to
    where it moved if this process handed it on; a request whose session or cursor belongs to
    another process goes to whoever holds that session now (the owner while it is live or
    draining, else the process the ledger's handoff rule names) and is rejected when no one
    does; a new session on a draining process goes to a live peer; a new call on a draining
    process's own session waits for the session to be handed on, then follows it (it is
    rejected before it starts when the session cannot move); the rest is served here.
    """

    def __init__(
        self,
        app: ASGIApp,
        store: ResumeAuthority,
        *,
        inflight: InFlight | None = None,
        forwarder: Forwarder | None = None,
        sessions: SessionRegistry | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.sessions = sessions if sessions is not None else SessionRegistry()
        self.inflight = inflight if inflight is not None else InFlight()
        self.forwarder = forwarder if forwarder is not None else Forwarder()
        #: Set when this process drains (SIGTERM); the ledger saying ``draining`` counts too.
        self.draining = False
        #: Hands this process's sessions on while it drains (None: sessions end with it).
        self.handoff: Handoff | None = None
        #: Waits (bounded) until this process's copy of the ledger satisfies a predicate.
        self.wait_view: WaitView | None = None
        #: Requests served on sessions taken from a draining peer, and cursors of an earlier
        #: owner served from the tail it handed over, since start (``/metrics``).
        self.served_handed = 0
        self.tail_replays = 0

    def is_draining(self) -> bool:
        if self.draining:
            return True
        view = self.store.snapshot()
        rec = view.epochs.get(self.store.pod_text)
        return rec is not None and rec.state == "draining"

    def closing(self, send: Send) -> Send:
        """While draining, every answer says ``Connection: close``: no client or peer keeps an
        idle connection to this process, so none sends a request on a connection the process
        is closing as it exits (it would be lost unanswered, and unknowable as "not run").
        The app's own answers get it from :class:`Answer` instead, one layer fewer on each
        of their chunks."""

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start" and self.is_draining():
                message = {**message, "headers": with_close(message.get("headers", ()))}
            await send(message)

        return closing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.handle(scope, receive, send)

    def handle(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The request's handling, for the caller to await (``EpochSafeApp`` does, one
        coroutine fewer around every step the app takes). A request of a session held here,
        with nothing to route (no cursor, not forwarded, not moving), goes straight to
        :meth:`_serve`; every other request takes :meth:`_route`."""
        if scope["type"] != "http":
            return self.app(scope, receive, send)
        # Read as the app behind reads them (Starlette's ``Headers``): names as the server
        # gives them (ASGI servers lower-case them), and the first of a repeated field counts
        # (reversed, it is the last one written). Built in one step: this runs per request.
        raw_headers = scope["headers"]
        headers = dict(reversed(raw_headers if isinstance(raw_headers, list) else [*raw_headers]))
        revision = headers.get(PROTOCOL_HEADER)
        if revision is not None and revision not in _RESUMABLE:
            return self.app(scope, receive, self.closing(send))  # 2026-07-28 and later: not ours
        method = scope.get("method")
        raw_sid = headers.get(SESSION_HEADER)
        if raw_sid is not None and _FORWARDED_TO not in headers:
            held = self.sessions.held(raw_sid.decode("latin-1"))
            if (
                held is not None
                and held.moved_to is None
                and not (method == "GET" and headers.get(LAST_EVENT_ID_HEADER))
                and (self.handoff is None or not self.handoff.is_moving(held))
            ):
                request = _Request(scope, None, receive, send, method, False, revision, raw_sid)
                return self._serve(request, held, held.session_id, None)
        return self._route(scope, receive, send, headers, method, revision)

    async def _route(
        self,
        scope: Scope,
        receive: Receive,
        raw_send: Send,
        headers: dict[bytes, bytes],
        method: str | None,
        revision: bytes | None,
    ) -> None:
        send = self.closing(raw_send)
        own = self.store.epoch
        forwarded_to = headers.get(_FORWARDED_TO)
        if forwarded_to is not None and forwarded_to.decode("latin-1") != str(own):
            refusal = error_body(f"this is process {own}, not {forwarded_to.decode('latin-1')!r}")
            mark = (NOT_THE_OWNER_HEADER.encode(), str(own).encode())
            await respond(send, MISDIRECTED, refusal, [mark])
            return
        forwarded = forwarded_to is not None

        raw_cursor = headers.get(LAST_EVENT_ID_HEADER)
        cursor: EventId | None = None
        if method == "GET" and raw_cursor:
            try:
                cursor = EventId.decode(raw_cursor.decode("latin-1"))
            except ValueError as exc:
                await respond(send, 400, error_body(f"Malformed Last-Event-ID: {exc}"))
                return
        raw_sid = headers.get(SESSION_HEADER)
        held: SessionTag | None = None  # a session this process holds, whoever minted it
        sid: SessionId | None = None
        if raw_sid is not None:
            held = self.sessions.held(raw_sid.decode("latin-1"))
            if held is None:
                try:
                    sid = SessionId.decode(raw_sid.decode("latin-1"))
                except ValueError as exc:
                    await send_rejection(send, "unknown", str(exc))
                    return

        owner = sid.owner if sid is not None else None
        if owner is None and held is None and cursor is not None:
            owner = cursor.epoch
        elsewhere = owner is not None and owner != own
        body: bytes | None = None
        if method == "POST" or elsewhere:
            body = await self._read_body(receive, send)
            if body is None:
                return
        if elsewhere:
            assert owner is not None and body is not None
            if await self._to_owner(scope, body, receive, send, owner, forwarded=forwarded):
                return
            # The session's chain of holders led here: it was handed here while this request
            # was on its way (its old owner said "moved" to this process).
            held = self.sessions.held(raw_sid.decode("latin-1")) if raw_sid else None
            if held is None:
                await self._reject_lost(send, owner, body, tried=True)
                return
        if held is not None:
            if self.handoff is not None:
                await self.handoff.settled(held)  # a hand-on under way decides where it goes
            if held.moved_to is not None:
                moved = held.moved_to
                await self._to_moved(scope, body or b"", receive, send, moved, forwarded)
                return
        elif sid is None and method == "POST":
            assert body is not None
            if self.store.is_zombie():
                await send_rejection(send, "retired", "this process's epoch is retired")
                return
            if not forwarded and self.is_draining():
                peer = self.forwarder.pick(live_peers(self.store.snapshot(), own))
                if peer is not None and await self._forward(scope, body, receive, send, peer):
                    return  # a live peer took the new session; otherwise it is served here
        if held is None and sid is not None:
            held = self.sessions.get(sid.local)
        local = held.session_id if held is not None else sid.local if sid is not None else None
        request = _Request(scope, body, receive, raw_send, method, forwarded, revision, raw_sid)
        await self._serve(request, held, local, cursor)

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        """The request's body, read once, before deciding anything (see
        mcp_epoch._internal.body for why); None when it was answered (413) or the client left
        before its request arrived (nothing ran)."""
        try:
            body, early = await read_body(receive)
        except BodyTooLarge as exc:
            await respond(self.closing(send), 413, error_body(str(exc)))
            return None
        return body if early is None else None

    async def _to_owner(
        self,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
        owner: ProcessEpoch,
        *,
        forwarded: bool,
    ) -> bool:
        """Send a request of another process's session to whoever holds that session now:
        the owner while it lives (it sends on what it handed over), then the process its
        handoff rule names. A forwarded request is never forwarded again (hop limit: one),
        but an owner's "moved to" answer is followed from here. True when answered (or
        rejected); False when the chain of holders leads to this very process."""
        view = self.store.snapshot()
        own = self.store.epoch
        target: ProcessEpoch | None = None if forwarded else owner
        tried = False
        for _ in range(MAX_MOVES):
            route = None if target is None else route_for(view, target)
            if route is not None and route.epoch == own:
                return False
            if route is None:
                break
            try:
                if await self._forward(scope, body, receive, send, route):
                    return True
            except OwnerMoved as moved:
                target, tried = moved.to, True  # the owner is not where the session is
                view = await self._view_knowing(target)
                continue
            tried = True
            # The ledger says it lives but it did not answer: it may have exited just after
            # handing its sessions on, before the ledger retired it.
            target = successor_of(view, route.epoch)
        await self._reject_lost(send, owner, body, tried=tried or forwarded)
        return True

    async def _view_knowing(self, target: ProcessEpoch) -> EpochSnapshot:
        """This process's copy of the ledger, once it routes to ``target``: a draining owner
        names the peer it handed a session to as soon as the peer took it, and the peer may
        have joined the ledger a moment before this copy heard of it (bounded wait)."""
        if route_for(self.store.snapshot(), target) is None and self.wait_view is not None:
            await self.wait_view(lambda view: route_for(view, target) is not None, MOVE_WAIT)
        return self.store.snapshot()

    async def _reject_lost(
        self, send: Send, owner: ProcessEpoch, body: bytes, *, tried: bool
    ) -> None:
        """No process holds this session of ``owner``. Once a holder was tried (it did not
        answer, or the session was sent here as to its holder and is not held here), the
        session ended with a process that could not hand it on: ``retired``."""
        reason: Reason = "retired" if tried else classify(self.store.snapshot(), owner)
        log.info("request for session of %s rejected: %s", owner, reason)
        await send_rejection(
            send, reason, f"the session's process {owner} is not here", read_post(body).single_id
        )

    async def _to_moved(
        self,
        scope: Scope,
        body: bytes,
        receive: Receive,
        send: Send,
        to: ProcessEpoch,
        forwarded: bool,
    ) -> None:
        """A request of a session this process handed on: a forwarding replica is told where
        it went (421 with ``Mcp-Epoch-Moved-To``: nothing ran here, so it may send it there),
        and a request that came straight here is sent there from here."""
        if forwarded:
            own = str(self.store.epoch).encode()
            marks = [
                (NOT_THE_OWNER_HEADER.encode(), own),
                (MOVED_TO_HEADER.encode(), str(to).encode()),
            ]
            await respond(send, MISDIRECTED, error_body(f"the session moved to {to}"), marks)
            return
        if not await self._to_owner(scope, body, receive, send, to, forwarded=False):
            await self._reject_lost(send, to, body, tried=True)

    async def _forward(
        self, scope: Scope, body: bytes, receive: Receive, send: Send, route: Route
    ) -> bool:
        """True when the owner answered (the answer went to the client); False: unreachable.
        The relays a drain waits for count in :attr:`inflight` (see ``Forwarder.forward``);
        :class:`OwnerMoved` goes to the caller."""
        try:
            await self.forwarder.forward(scope, body, receive, send, route, self.inflight.relaying)
        except OwnerUnreachable as exc:
            # Routine in a rolling deploy (a drained owner exits before the ledger retires
            # it); the caller tries where its sessions went, and logs any rejection.
            log.info("owner unreachable: %s", exc)
            return False
        except OwnerLost as exc:
            body_ = error_body(
                f"the owning process {route.epoch} went away: {exc}",
                request_id=read_post(body).single_id,
            )
            await respond(send, 502, body_)
        return True

    async def _serve(
        self, request: _Request, tag: SessionTag | None, local: str | None, cursor: EventId | None
    ) -> None:
        scope, receive, method = request.scope, request.receive, request.method
        call_stream = False  # a forwarded resumption of a call's stream: the relay says so
        if tag is not None:
            if request.revision is not None:
                tag.protocol_version = request.revision.decode("latin-1")
            if tag.tails:
                self.served_handed += 1
        keys: list[CallKey] = []  # the calls whose stream this is: its chunks may deliver them
        calls: Iterable[str] = ()
        if cursor is not None:
            if tag is not None and tag.tails and cursor.epoch != self.store.epoch:
                await self._replay_handed(request, tag, cursor)
                return
            plan = await self._admit_resumption(cursor, tag, request)
            if plan is None:
                return
            keys.append((tag, plan.stream_id))
            call_stream = request.forwarded and plan.stream_id != STANDALONE_STREAM
        if method == "POST":
            body = request.body
            if body is None:
                body = request.body = await self._read_body(receive, request.send)
                if body is None:
                    return
            post = read_post(body)
            calls = post.calls
            if post.work and local is not None and self.is_draining():
                await self._refuse_or_hand_on(request, tag)
                return
            receive = _Replay(body, receive)  # the SDK reads the body the guard has read
            for rid in post.cancelled:
                self.inflight.forget((tag, rid))
            if post.log_level is not None and tag is not None:
                tag.log_level = post.log_level
        fresh = tag is None and local is None
        if fresh:
            tag = SessionTag()
            if method == "POST":  # what a handoff replays to open the session elsewhere
                tag.initialize = request.body
                tag.path = str(scope.get("path", ""))
                host = dict(scope["headers"]).get(b"host")
                tag.host = None if host is None else bytes(host).decode("latin-1")
        assert tag is not None or local is not None
        for rid in calls:
            key = (tag, rid)
            self.inflight.started(key)
            keys.append(key)
        if local is not None:
            scope = dict(scope, headers=_with_session(scope["headers"], request.raw_sid, local))
        resume = None if cursor is None else ResumeState()
        answer = Answer(
            self, self.store.epoch_text, request.send, tag, fresh, resume, keys, call_stream
        )
        token = current_session.set(tag)
        # Set only when there is one (a request's context starts without): a set is a new
        # context mapping, which the SDK's tasks keep until the collector frees them.
        resume_token = None if resume is None else current_resume.set(resume)
        try:
            await self.app(scope, receive, answer.send)
        finally:
            if resume_token is not None:
                current_resume.reset(resume_token)
            current_session.reset(token)
            if answer.cut:
                UNFINISHED.expect()
        if method == "DELETE" and tag is not None:
            self.inflight.forget_session(tag)

    async def _refuse_or_hand_on(self, request: _Request, tag: SessionTag | None) -> None:
        """A new call on a session of this draining process: once the session has nothing in
        flight it moves to a live peer and the call follows it there; only a session that
        cannot move refuses the call, before it starts."""
        moved = None
        if self.handoff is not None and tag is not None:
            moved = await self.handoff.hand_on_when_idle(tag)
        if moved is not None:
            r = request
            body = r.body or b""
            await self._to_moved(r.scope, body, r.receive, self.closing(r.send), moved, r.forwarded)
            return
        await send_rejection(
            self.closing(request.send),
            "retired",
            "this process is draining: the call was not started, start a new session",
            read_post(request.body or b"").single_id,
        )

    async def _replay_handed(self, request: _Request, tag: SessionTag, cursor: EventId) -> None:
        """A cursor of an earlier owner of a session handed to this process: served from that
        owner's own tail, under its own IDs, or rejected (see ``decide_handed``). A call's
        stream ends with its answer; the standalone stream goes on live from here."""
        try:
            plan = decide_handed(cursor, tag.tails)
        except ResumptionRejected as exc:
            log.info("resumption of a handed-over session rejected: %s", exc)
            await send_rejection(self.closing(request.send), exc.reason, exc.detail)
            return
        self.tail_replays += 1
        send = self.closing(request.send)
        standalone = plan.stream_id == STANDALONE_STREAM
        headers = [
            (b"content-type", b"text/event-stream"),
            (b"cache-control", b"no-cache, no-transform"),
            (SESSION_HEADER, (tag.public_id or "").encode("latin-1")),
            (TAIL_OF_HEADER.encode(), str(plan.tail.epoch).encode()),
            (SERVED_BY_HEADER.encode(), str(self.store.epoch).encode()),
        ]
        if request.forwarded and not standalone:
            headers.append((CALL_STREAM_HEADER.encode(), b"1"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": _events(plan), "more_body": standalone})
        if standalone and tag.session_id is not None:
            await self._follow_standalone(request, tag, tag.session_id)

    async def _follow_standalone(self, request: _Request, tag: SessionTag, local: str) -> None:
        """After an old owner's tail, the session's standalone stream here (this process's
        IDs): the SDK's own GET, its head dropped (the client has ours already)."""
        headers = [
            (k, v)
            for k, v in _with_session(request.scope["headers"], request.raw_sid, local)
            if bytes(k).lower() != LAST_EVENT_ID_HEADER
        ]
        scope = dict(request.scope, headers=headers)
        refused = False
        send = self.closing(request.send)

        async def body_only(message: Message) -> None:
            nonlocal refused
            if message["type"] == "http.response.start":
                refused = message.get("status", 200) >= 300
                return
            if not refused:
                await send(message)

        token = current_session.set(tag)
        try:
            await self.app(scope, request.receive, body_only)
        finally:
            current_session.reset(token)
        if refused:  # e.g. the session already has a standalone stream: end this one cleanly
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _admit_resumption(
        self, cursor: EventId, tag: SessionTag | None, request: _Request
    ) -> ReplayPlan | None:
        send = self.closing(request.send)
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


def _with_session(
    headers: Sequence[tuple[bytes, bytes]], shown: bytes | None, local: str
) -> list[tuple[bytes, bytes]]:
    """The request's headers with the SDK's own session ID instead of ``shown``, the one the
    client sent: its field is found by value in one step, where a comprehension ran Python
    code per header (fields a server gave in another shape are rewritten one by one)."""
    value = local.encode("latin-1")
    out = list(headers)
    if shown is not None:
        try:
            out[out.index((SESSION_HEADER, shown))] = (SESSION_HEADER, value)
            return out
        except ValueError:
            pass
    return [h if h[0] != SESSION_HEADER else (h[0], value) for h in out]


class _Replay:
    """A ``receive`` that hands out ``body`` whole once, then whatever ``receive`` brings next
    (a disconnect): the app sees the request as the client sent it. One object, not a closure
    and its cells: the SDK's request ends in a reference cycle that holds its ``receive``, and
    everything held there waits for the cyclic collector."""

    __slots__ = ("_body", "_receive")

    def __init__(self, body: bytes, receive: Receive) -> None:
        self._body: bytes | None = body
        self._receive = receive

    async def __call__(self) -> Message:
        body = self._body
        if body is not None:
            self._body = None
            return {"type": "http.request", "body": body, "more_body": False}
        return await self._receive()


@dataclass(slots=True)
class _Request:
    """One request as the guard has read it. Not frozen: a frozen dataclass sets each field
    through ``object.__setattr__``, on every request."""

    scope: Scope
    #: Its body once read (a POST's, or a forwarded request's); None: not read yet.
    body: bytes | None
    receive: Receive
    #: The server's ``send``: the app's answers take :class:`Answer`, the guard's own take
    #: :meth:`ResumptionGuard.closing` (both say ``Connection: close`` while draining).
    send: Send
    method: str | None
    forwarded: bool
    revision: bytes | None  # its Mcp-Protocol-Version
    raw_sid: bytes | None  # its Mcp-Session-Id as sent


def _events(plan: TailPlan) -> bytes:
    """The SSE events a cursor of an earlier owner is owed, under that owner's IDs."""
    out = bytearray()
    for ev in plan.events:
        event_id = plan.tail.event_id(ev.seq).encode()
        out += b"id: %s\nevent: message\ndata: %s\n\n" % (event_id, (ev.data or "").encode())
    return bytes(out)
