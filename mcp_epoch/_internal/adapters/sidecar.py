"""The sidecar adapter: any Streamable HTTP MCP server on ``localhost``, served on the core.

:class:`UpstreamRelay` stands where the SDK's own app stands in the SDK adapter. It sends each
request on to the upstream server (any language, no change, no event store) and translates the
answer into what the core expects of an app on its event store:

* **Every event of an upstream SSE stream is filed in the core's store** before it is sent,
  under the session and stream the SDK would file it under (a call's stream is named by its
  request id, the standalone GET stream ``_GET_stream``), and gets the store's epoch-tagged ID.
  The upstream's own IDs and priming events are dropped, and a client's ``Last-Event-ID`` is
  never sent upstream: a resumption is served from the store, as the SDK serves it.
* **Legacy-era streams outlive their client.** Before MCP 2026-07-28 a disconnect is not a
  cancellation, so a call's stream is read from the upstream to its end whether or not the
  client is still there; the client resumes from the store. Requests of 2026-07-28 and later
  pass through byte for byte, and a client that leaves closes the upstream's side (there, a
  disconnect is a cancellation).
* **Priming and retry.** A client of 2025-11-25 or later gets a priming event (older clients
  cannot parse one), and every client gets the ``retry`` the sidecar is configured with on
  its stream's first event, so the SDK clients' two reconnect attempts wait long enough.
* **A stream that breaks before its answer fails its call** with a JSON-RPC error filed as
  the call's last event, so the client and any resumption of the stream hear it at once,
  instead of waiting for an answer the upstream will never send.
* **A session the upstream lost** (it restarted: it answers 404 for a session this relay
  holds) is opened anew from its recorded ``initialize``, as a handoff opens one
  (:func:`mcp_epoch._internal.adopt.reopen`), and the request that found it gone, which did
  not run, is sent again on the new session. No request is sent into a session the upstream
  no longer has. If it cannot be reopened, the 404 reaches the client.

The upstream is reached with the library's lean HTTP/1.1 hop
(:mod:`mcp_epoch._internal.upstream`), one connection per exchange. This module imports ``mcp``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
from mcp.server.streamable_http import EventMessage
from mcp_types import ErrorData, JSONRPCError

from mcp_epoch._internal import upstream
from mcp_epoch._internal.adapters import sse
from mcp_epoch._internal.adopt import AdoptFailed, reopen
from mcp_epoch._internal.app import EpochSafeApp
from mcp_epoch._internal.body import BodyTooLarge, read_body
from mcp_epoch._internal.errors import ResumptionRejected
from mcp_epoch._internal.forward import HOP_BY_HOP, Ended, request_target, stream_answer
from mcp_epoch._internal.guard import (
    LAST_EVENT_ID_HEADER,
    PROTOCOL_HEADER,
    RESUMABLE_REVISIONS,
    SESSION_HEADER,
    STANDALONE_STREAM,
    Message,
    Receive,
    Scope,
    Send,
    error_body,
    respond,
    send_rejection,
)
from mcp_epoch._internal.postbody import read_post
from mcp_epoch._internal.sessions import SessionRegistry, SessionTag, current_session
from mcp_epoch._internal.store import EpochEventStore, RawMessage
from mcp_epoch._internal.unfinished import UNFINISHED

log = logging.getLogger("mcp_epoch.sidecar")

#: The SSE ``retry`` suggested to clients, in ms: the TypeScript and Python SDK clients try
#: twice, ``retry`` apart, so it must outlast a pod leaving its Service's endpoints.
DEFAULT_RETRY_MS: Final = 1000
#: How often the upstream's port is tried (readiness).
PROBE_SECONDS: Final = 1.0
#: The first revision whose clients parse an empty priming event.
PRIMING_SINCE: Final = "2025-11-25"
#: The revision a request without ``Mcp-Protocol-Version`` speaks (the spec's default).
DEFAULT_REVISION: Final = "2025-03-26"
INTERNAL_ERROR: Final = -32603
#: An upstream that closes a call's stream on purpose is resumed after the ``retry`` it set,
#: at most this long, and given up when this many resumptions in a row bring nothing.
MAX_RESUME_WAIT_MS: Final = 5000
MAX_IDLE_RESUMES: Final = 3
_SSE: Final = b"text/event-stream"
_DROPPED: Final = HOP_BY_HOP | {b"content-length", b"host", LAST_EVENT_ID_HEADER, b"expect"}
#: Answer headers the ASGI server writes itself (one ``Date`` is enough).
_OWN: Final = HOP_BY_HOP | {b"date"}


class _Standalone:
    """A session's standalone stream as the upstream sends it, pumped into the store; every
    client GET of the session follows the store, and ends when this does."""

    __slots__ = ("ended", "task")

    def __init__(self) -> None:
        self.ended = anyio.Event()
        self.task: asyncio.Future[None] | None = None

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
        self.ended.set()


class UpstreamRelay:
    """The ASGI app behind the core in the sidecar: see the module's docstring."""

    def __init__(
        self,
        store: EpochEventStore,
        sessions: SessionRegistry,
        address: str,
        *,
        retry_ms: int = DEFAULT_RETRY_MS,
        connect_timeout: float = 2.0,
        write_timeout: float = 30.0,
    ) -> None:
        upstream.host_port(address)  # a malformed address fails here, not on the first request
        self.store = store
        self.address = address
        self.retry_ms = retry_ms
        self._registry = sessions
        self._pool = upstream.Pool(address)  # the server beside us: connections kept alive
        self._connect_timeout = connect_timeout
        self._write_timeout = write_timeout
        #: The sessions the upstream holds for this relay, held strongly (the registry holds
        #: them weakly), each with its standalone stream if one is open.
        self._held: dict[SessionTag, _Standalone | None] = {}
        self._reopen_lock = asyncio.Lock()
        self._reopening: set[SessionTag] = set()  # a reopening's own requests never reopen
        self._template: Scope | None = None
        #: Since when the upstream has not answered (None: it answers), and why.
        self.down_since: float | None = None
        self.last_error = ""
        #: Calls failed because the upstream's stream broke before their answer, and sessions
        #: the upstream lost and this relay opened anew, since start (``/metrics``).
        self.lost_calls = 0
        self.reopened = 0

    # -- health --------------------------------------------------------------------------

    def problems(self) -> list[str]:
        if self.down_since is None:
            return []
        return [f"the MCP server at {self.address} does not answer: {self.last_error}"]

    def metrics(self) -> list[str]:
        return [
            "# HELP mcp_epoch_upstream_up 1 while the MCP server behind the sidecar answers.",
            "# TYPE mcp_epoch_upstream_up gauge",
            f"mcp_epoch_upstream_up {int(self.down_since is None)}",
            "# HELP mcp_epoch_upstream_lost_calls_total Calls failed because the MCP server's "
            "stream ended before their answer.",
            "# TYPE mcp_epoch_upstream_lost_calls_total counter",
            f"mcp_epoch_upstream_lost_calls_total {self.lost_calls}",
            "# HELP mcp_epoch_upstream_sessions_reopened_total Sessions the MCP server lost "
            "(it restarted) that were opened anew from their initialize.",
            "# TYPE mcp_epoch_upstream_sessions_reopened_total counter",
            f"mcp_epoch_upstream_sessions_reopened_total {self.reopened}",
        ]

    def _down(self, why: str) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("the MCP server at %s does not answer: %s", self.address, why)
        self.last_error = why

    def _up(self) -> None:
        if self.down_since is not None:
            log.warning("the MCP server at %s answers again", self.address)
            self.down_since = None

    async def _watch_upstream(self) -> None:
        """Try the upstream's port every :data:`PROBE_SECONDS`, so readiness follows the
        upstream even when no request arrives (a connection opened and closed: no request)."""
        host, port = upstream.host_port(self.address)
        while True:
            try:
                with anyio.fail_after(self._connect_timeout):
                    stream = await anyio.connect_tcp(host, port)
                await stream.aclose()
                self._up()
            except (OSError, TimeoutError) as exc:
                self._down(f"no connection: {exc!r}")
            await anyio.sleep(PROBE_SECONDS)

    # -- ASGI ----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # nothing but HTTP is served; the ASGI server closes anything else
        if self._template is None:
            self._template = {k: v for k, v in scope.items() if k != "headers"}
        tag = current_session.get()
        method = scope["method"]
        revision = _header(scope, PROTOCOL_HEADER)
        legacy = revision is None or revision.decode("latin-1") in RESUMABLE_REVISIONS
        if not legacy or method not in ("POST", "GET", "DELETE"):
            await self._pass(scope, receive, send, tag)
        elif method == "POST":
            await self._post(scope, receive, send, tag)
        elif method == "DELETE":
            await self._delete(scope, receive, send, tag)
        elif _header(scope, LAST_EVENT_ID_HEADER):
            await self._resume(scope, receive, send, tag)
        else:
            await self._standalone(scope, receive, send, tag)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        watcher: asyncio.Future[None] | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                watcher = asyncio.ensure_future(self._watch_upstream())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if watcher is not None:
                    watcher.cancel()
                for standalone in self._held.values():
                    if standalone is not None:
                        standalone.stop()
                self._pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- one exchange with the upstream --------------------------------------------------

    def _headers(
        self, scope: Scope, session: str | None = None, *, as_sent: bool = False
    ) -> list[tuple[bytes, bytes]]:
        """The client's end-to-end headers, addressed to the upstream (its ``Host``: servers
        on ``localhost`` guard against DNS rebinding by it), without a cursor unless the
        request passes ``as_sent`` (2026-07-28: cursors are not the sidecar's business)."""
        out = [(b"host", self.address.encode())]
        for key, value in scope["headers"]:
            name = bytes(key).lower()
            if name in _DROPPED and not (as_sent and name == LAST_EVENT_ID_HEADER):
                continue
            if name == SESSION_HEADER and session is not None:
                value = session.encode("latin-1")
            out.append((name, bytes(value)))
        return out

    async def _send_up(
        self,
        scope: Scope,
        body: bytes,
        send: Send,
        tag: SessionTag | None,
        *,
        as_sent: bool = False,
    ) -> upstream.Exchange | None:
        """The upstream's answer to the request; None when the client was answered here
        instead (the upstream did not answer). A session the upstream lost is reopened and
        the request sent again on it, once."""
        session = None
        for attempt in range(2):
            try:
                answer = await upstream.exchange(
                    self.address,
                    scope["method"],
                    request_target(scope),
                    self._headers(scope, session, as_sent=as_sent),
                    body,
                    connect_timeout=self._connect_timeout,
                    write_timeout=self._write_timeout,
                    pool=self._pool,
                )
            except upstream.Refused as exc:
                self._down(str(exc))
                msg = f"the MCP server behind this sidecar did not take the request ({exc}); retry"
                await respond(send, 503, error_body(msg, request_id=read_post(body).single_id))
                return None
            except upstream.Broken as exc:
                msg = f"the MCP server closed the connection before it answered ({exc})"
                await respond(send, 502, error_body(msg, request_id=read_post(body).single_id))
                return None
            self._up()
            if attempt or answer.status != 404 or _header(scope, SESSION_HEADER) is None:
                return answer
            renewed = await self._reopened(tag, _header(scope, SESSION_HEADER))
            if renewed is None:
                return answer
            answer.close()
            session = renewed
        raise AssertionError("unreachable")  # pragma: no cover

    async def _reopened(self, tag: SessionTag | None, sent: bytes | None) -> str | None:
        """The upstream answered 404 for a session this relay holds: it lost it. Open it anew
        from its ``initialize`` and return its new ID (None: not ours, or it cannot be)."""
        if tag is None or tag not in self._held or self._template is None:
            return None
        if tag in self._reopening:
            return None
        async with self._reopen_lock:
            local = tag.session_id
            if local is not None and sent is not None and local.encode("latin-1") != sent:
                return local  # another request of the session reopened it meanwhile
            standalone = self._held.get(tag)
            if standalone is not None:
                standalone.stop()
            self._held[tag] = None
            self._reopening.add(tag)
            try:
                await reopen(self, self._template, tag, self._registry, tag.public_id or "")
            except AdoptFailed as exc:
                del self._held[tag]
                log.warning(
                    "the MCP server lost session %s and it cannot be reopened: %s", tag, exc
                )
                return None
            finally:
                self._reopening.discard(tag)
        self.reopened += 1
        log.warning(
            "the MCP server lost session %s (it restarted?): reopened from its initialize as %s",
            tag.public_id,
            tag.session_id,
        )
        return tag.session_id

    # -- requests ------------------------------------------------------------------------

    async def _pass(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        tag: SessionTag | None,
        *,
        as_sent: bool = True,
    ) -> None:
        """A request relayed as it is, its answer too (MCP 2026-07-28: a client that leaves
        closes the upstream's side, which is how the upstream hears of a cancellation)."""
        try:
            body, early = await read_body(receive)
        except BodyTooLarge as exc:
            await respond(send, 413, error_body(str(exc)))
            return
        if early is not None:
            return
        answer = await self._send_up(scope, body, send, tag, as_sent=as_sent)
        if answer is not None:
            await self._relay_whole(answer, receive, send)

    async def _relay_whole(self, answer: upstream.Exchange, receive: Receive, send: Send) -> None:
        try:
            headers = [(k, v) for k, v in answer.headers if k not in _OWN]
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            ended = await stream_answer(answer, receive, send, self.address)
            if ended is Ended.COMPLETE:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            elif ended is Ended.CUT:
                UNFINISHED.expect()  # cut as the upstream cut it: the client sees a drop
        finally:
            answer.close()

    async def _post(
        self, scope: Scope, receive: Receive, send: Send, tag: SessionTag | None
    ) -> None:
        body, early = await read_body(receive)  # the guard has read it within its bound
        if early is not None:
            return
        answer = await self._send_up(scope, body, send, tag)
        if answer is None:
            return
        if tag is not None and answer.status < 300 and answer.header(SESSION_HEADER) is not None:
            self._held.setdefault(tag, None)
        if answer.status != 200 or not _is_sse(answer):
            await self._relay_whole(answer, receive, send)
            return
        post = read_post(body)
        stream_id = next(iter(post.calls), "")
        revision = tag.protocol_version if tag is not None else None
        revision = revision or post.asked_version or DEFAULT_REVISION
        try:
            await self._pump_call(answer, scope, send, stream_id, post.calls, revision)
        finally:
            answer.close()

    async def _pump_call(
        self,
        answer: upstream.Exchange,
        scope: Scope,
        send: Send,
        stream_id: str,
        calls: Mapping[str, str | int],
        revision: str,
    ) -> None:
        """A call's stream: every event filed, then sent while the client is there, to the
        stream's end. uvicorn drops what is sent after the client left, so reading goes on
        without it. An upstream that closes the stream on purpose before its answer (it gave
        event IDs: SEP-1699 polling) is resumed from its own last ID, as any client of it
        would; a stream that breaks, or cannot be resumed, fails the calls left unanswered.

        What is ready is written at once, and only then: the bytes of events that arrived
        together go out in one write, and a stream that ended with them ends in that write
        (a short call's answer is two writes, its head and its body, not one per event)."""
        await send({"type": "http.response.start", "status": 200, "headers": _sse_head(answer)})
        retry: int | None = self.retry_ms
        out = bytearray()
        if revision >= PRIMING_SINCE:
            event_id = await self.store.store_event(stream_id, None)
            out += b"id: %s\nretry: %d\ndata: \n\n" % (event_id.encode(), self.retry_ms)
            retry = None
            if not answer.buffered:  # the client has a cursor before the first event
                await send({"type": "http.response.body", "body": bytes(out), "more_body": True})
                out.clear()
        open_calls = dict(calls)
        why = "the MCP server ended the stream before it answered"
        cursor: str | None = None  # the upstream's own, never a client's
        wait_ms = 0
        idle_resumes = 0
        current: upstream.Exchange | None = answer
        while current is not None:
            parser = sse.Parser()
            delivered = False
            try:
                while (chunk := await current.chunk()) is not None:
                    for event in parser.feed(chunk):
                        if event.retry is not None:
                            wait_ms = event.retry
                        message = _message(event)
                        if message is None:
                            continue
                        delivered = True
                        event_id = await self.store.store_event(stream_id, message)
                        out += sse.encode(event_id, event.data or "", retry)
                        retry = None
                        if message.final:
                            open_calls.pop(str(message.id), None)
                    if out and not current.buffered:  # nothing more to read now: write
                        body = bytes(out)
                        out.clear()
                        await send({"type": "http.response.body", "body": body, "more_body": True})
            except (upstream.Broken, sse.EventTooLarge) as exc:
                why = f"the MCP server's stream broke before it answered: {exc}"
                break
            finally:
                current.close()
            cursor = parser.last_id or cursor
            idle_resumes = 0 if delivered else idle_resumes + 1
            if not open_calls or cursor is None or idle_resumes > MAX_IDLE_RESUMES:
                break
            await anyio.sleep(min(wait_ms, MAX_RESUME_WAIT_MS) / 1000)
            current = await self._resume_upstream(scope, cursor)
        if open_calls:
            out += await self._fail_calls(stream_id, open_calls, why)
        await send({"type": "http.response.body", "body": bytes(out), "more_body": False})

    async def _resume_upstream(self, scope: Scope, cursor: str) -> upstream.Exchange | None:
        """The upstream's stream again from its own ``cursor``, on the session's current ID;
        None when it will not resume it (it lost the session: it restarted)."""
        tag = current_session.get()
        session = None if tag is None else tag.session_id
        headers = [
            (k, v)
            for k, v in self._headers(scope, session)
            if k not in (b"content-type", b"accept")
        ]
        headers += [(b"accept", _SSE), (LAST_EVENT_ID_HEADER, cursor.encode())]
        try:
            answer = await upstream.exchange(
                self.address,
                "GET",
                request_target(scope),
                headers,
                b"",
                connect_timeout=self._connect_timeout,
                write_timeout=self._write_timeout,
                pool=self._pool,
            )
        except (upstream.Refused, upstream.Broken) as exc:
            log.warning("the MCP server's stream could not be resumed: %s", exc)
            return None
        if answer.status == 200 and _is_sse(answer):
            return answer
        log.warning("the MCP server answered %d to resuming its own stream", answer.status)
        answer.close()
        return None

    async def _fail_calls(self, stream_id: str, calls: dict[str, str | int], why: str) -> bytes:
        """File an error as the last event of each call the upstream left unanswered; their
        bytes on the wire."""
        self.lost_calls += len(calls)
        log.warning("%s: failing %d calls (%s)", why, len(calls), ", ".join(calls))
        out = bytearray()
        for rid in calls.values():
            error = JSONRPCError(
                jsonrpc="2.0",
                id=rid,
                error=ErrorData(
                    code=INTERNAL_ERROR,
                    message=f"{why} (it may have restarted); the call's outcome is unknown",
                ),
            )
            event_id = await self.store.store_event(stream_id, error)
            out += sse.encode(event_id, self.store.message_json(error))
        return bytes(out)

    async def _delete(
        self, scope: Scope, receive: Receive, send: Send, tag: SessionTag | None
    ) -> None:
        answer = await self._send_up(scope, b"", send, tag)
        if answer is None:
            return
        if tag is not None and (answer.status < 300 or answer.status == 404):
            standalone = self._held.pop(tag, None)
            if standalone is not None:
                standalone.stop()
        await self._relay_whole(answer, receive, send)

    async def _standalone(
        self, scope: Scope, receive: Receive, send: Send, tag: SessionTag | None
    ) -> None:
        """A standalone GET: the session's upstream GET stream is opened once and pumped into
        the store; this client follows the store from now until it leaves or that ends."""
        if tag is None or tag not in self._held:
            await self._pass(scope, receive, send, tag, as_sent=False)  # the upstream says why
            return
        standalone = self._held[tag]
        since = self.store.buffer.next_seq
        head: list[tuple[bytes, bytes]] = [
            (b"content-type", _SSE),
            (b"cache-control", b"no-cache, no-transform"),
            (SESSION_HEADER, (tag.session_id or "").encode("latin-1")),
        ]
        if standalone is None or standalone.ended.is_set():
            answer = await self._send_up(scope, b"", send, tag)
            if answer is None:
                return
            if answer.status != 200 or not _is_sse(answer):
                await self._relay_whole(answer, receive, send)
                return
            standalone = self._held[tag] = _Standalone()
            standalone.task = asyncio.ensure_future(self._pump_standalone(answer, standalone))
            head = _sse_head(answer)
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await self._follow(
            receive,
            send,
            standalone,
            lambda out: self.store.follow_stream(STANDALONE_STREAM, since, out),
        )

    async def _pump_standalone(self, answer: upstream.Exchange, standalone: _Standalone) -> None:
        try:
            parser = sse.Parser()
            while (chunk := await answer.chunk()) is not None:
                for event in parser.feed(chunk):
                    message = _message(event)
                    if message is not None:
                        await self.store.store_event(STANDALONE_STREAM, message)
        except (upstream.Broken, sse.EventTooLarge) as exc:
            log.info("the MCP server's standalone stream ended: %s", exc)
        finally:
            answer.close()
            standalone.ended.set()

    async def _resume(
        self, scope: Scope, receive: Receive, send: Send, tag: SessionTag | None
    ) -> None:
        """A ``Last-Event-ID`` the guard admitted: served from the store alone, as the SDK
        serves it; a standalone stream's resumption reopens the upstream's stream if it
        ended."""
        cursor = (_header(scope, LAST_EVENT_ID_HEADER) or b"").decode("latin-1")
        try:
            plan = self.store.decide(cursor, tag)
        except ResumptionRejected as exc:
            await send_rejection(send, exc.reason, exc.detail)
            return
        standalone: _Standalone | None = None
        if plan.stream_id == STANDALONE_STREAM and tag is not None and tag in self._held:
            standalone = self._held[tag]
            if standalone is None or standalone.ended.is_set():
                plain = dict(
                    scope,
                    headers=[h for h in scope["headers"] if h[0].lower() != LAST_EVENT_ID_HEADER],
                )
                answer = await self._send_up(plain, b"", _discard, tag)
                if answer is not None and answer.status == 200 and _is_sse(answer):
                    standalone = self._held[tag] = _Standalone()
                    standalone.task = asyncio.ensure_future(
                        self._pump_standalone(answer, standalone)
                    )
                elif answer is not None:
                    answer.close()
        head = [
            (b"content-type", _SSE),
            (b"cache-control", b"no-cache, no-transform"),
            (SESSION_HEADER, ((tag.session_id if tag else None) or "").encode("latin-1")),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await self._follow(
            receive, send, standalone, lambda out: self.store.replay_events_after(cursor, out)
        )

    async def _follow(
        self,
        receive: Receive,
        send: Send,
        standalone: _Standalone | None,
        serve: Callable[[Callable[[EventMessage], Awaitable[None]]], Awaitable[object]],
    ) -> None:
        """Send what ``serve`` gives until it ends, the client leaves, or ``standalone`` (the
        upstream's stream this one follows) ends; then end the response."""
        store = self.store

        async def out(event: EventMessage) -> None:
            data = "" if event.message is None else store.message_json(event.message)
            chunk = sse.encode(event.event_id, data)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        left = False
        async with anyio.create_task_group() as tg:

            async def serving() -> None:
                with contextlib.suppress(ResumptionRejected):
                    await serve(out)
                tg.cancel_scope.cancel()

            async def client_left() -> None:
                nonlocal left
                while (await receive())["type"] != "http.disconnect":
                    pass
                left = True
                tg.cancel_scope.cancel()

            async def upstream_ended() -> None:
                assert standalone is not None
                await standalone.ended.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(serving)
            tg.start_soon(client_left)
            if standalone is not None:
                tg.start_soon(upstream_ended)
        if not left:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _discard(_message: Message) -> None:
    """Where a reopening's own refusals go: the client's stream is served from the store."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if bytes(key).lower() == name:
            return bytes(value)
    return None


def _is_sse(answer: upstream.Exchange) -> bool:
    kind = answer.header(b"content-type")
    return kind is not None and kind.split(b";")[0].strip().lower() == _SSE


def _sse_head(answer: upstream.Exchange) -> list[tuple[bytes, bytes]]:
    """The upstream's head for a stream whose bytes this relay writes anew."""
    return [(k, v) for k, v in answer.headers if k not in _OWN and k != b"content-length"]


def _message(event: sse.Event) -> RawMessage | None:
    """The JSON-RPC message an upstream event carries, as its text; None for a priming or empty
    event, or one that is not a JSON-RPC message (logged: it cannot be resumed, so it is not
    sent either). Only its kind is read: a relay has no use for the SDK's models of it."""
    if not event.data:
        return None
    try:
        parsed: Any = json.loads(event.data)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and parsed.get("jsonrpc") == "2.0":
        if "method" in parsed:
            return RawMessage(event.data, final=False)
        rid = parsed.get("id")
        if ("result" in parsed and isinstance(rid, str | int)) or (
            "error" in parsed and (rid is None or isinstance(rid, str | int))
        ):
            return RawMessage(event.data, final=True, id=rid)
    log.warning("dropped an upstream event that is not a JSON-RPC message: %.200s", event.data)
    return None


def sidecar_app(address: str, *, retry_ms: int = DEFAULT_RETRY_MS, **core: Any) -> EpochSafeApp:
    """The sidecar: the core in front of the MCP server at ``address`` (``host:port`` on this
    pod); ``core`` goes to :class:`EpochSafeApp` (``env``, ``first_sync_timeout``)."""
    relay: UpstreamRelay | None = None

    def build(store: EpochEventStore, sessions: SessionRegistry) -> UpstreamRelay:
        nonlocal relay
        relay = UpstreamRelay(store, sessions, address, retry_ms=retry_ms)
        return relay

    def problems() -> list[str]:
        return [] if relay is None else relay.problems()

    def metrics() -> list[str]:
        return [] if relay is None else relay.metrics()

    return EpochSafeApp(build, problems=problems, metrics=metrics, **core)
