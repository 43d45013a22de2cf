"""The client side of a rejection: fail what is pending at once, then start a fresh session.

A rejection (the guard's 404 with ``Mcp-Resumption-Rejected``, or the SDK's plain 404 for a
session the server does not hold) means nothing pending on that session will ever be answered:
the process that owed the answers is gone. :class:`EpochClient` therefore fails every pending
call immediately with :class:`ResumptionRejected` (no waiting for a timeout), opens a new
session with a fresh ``initialize`` and serves the next call from it. A transport error is
different: the server may be fine, so the call is retried with backoff from the same cursor
(``Last-Event-ID``), and only a rejection of that cursor ends it. This module imports ``mcp``.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import httpx2
from anyio.abc import TaskGroup
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ClientMessageMetadata
from mcp_types import (
    CONNECTION_CLOSED,
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    ProgressNotification,
)

from mcp_epoch._internal.errors import REASONS, Reason, ResumptionRejected
from mcp_epoch._internal.resume_transport import ResumeTransport, explicit_resume
from mcp_epoch.contract import REJECTED_HEADER

log = logging.getLogger(__name__)
T = TypeVar("T")
# The SDK's own defaults for Streamable HTTP: streams may stay quiet for minutes.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


_TOKENS = itertools.count(1)
#: How often one call is retried on a fresh session after a refusal before it ran (each
#: refusal means the session's owner was gone or draining; the next session is elsewhere).
MAX_NOT_STARTED_RETRIES = 3


def _call_token(request: httpx2.Request) -> str | None:
    """The progress token of the ``tools/call`` a POST carried, if it carried one."""
    if request.method != "POST":
        return None
    try:
        body = json.loads(request.content)
    except (ValueError, UnicodeDecodeError, httpx2.RequestNotRead):
        return None
    if not isinstance(body, dict) or body.get("method") != "tools/call" or "id" not in body:
        return None
    meta = (body.get("params") or {}).get("_meta") or {}
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if isinstance(token, str) else None


async def _answers(client: Client) -> bool:
    """Whether the SDK session can still send a request and get its answer."""
    try:
        with anyio.fail_after(5):
            await client.send_ping()
    except Exception:
        return False
    return True


@dataclass(eq=False)
class _Attempt:
    """One logical session: its SDK client, its pending calls and how it ended."""

    number: int
    ready: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)
    client: Client | None = None
    error: BaseException | None = None
    rejected: ResumptionRejected | None = None
    rejected_at: float | None = None
    pending: set[anyio.CancelScope] = field(default_factory=set)
    session_id: str | None = None

    def reject(self, reason: Reason, detail: str) -> None:
        if self.rejected is not None:
            return
        self.rejected = ResumptionRejected(reason, detail)
        self.rejected_at = time.monotonic()
        for scope in self.pending:
            scope.cancel()
        self.stop.set()


@dataclass(eq=False)
class _Cursor:
    """The newest cursor of one call's stream, and every older one that led to it."""

    value: str | None = None
    seen: list[str] = field(default_factory=list)


def _copy(exc: ResumptionRejected) -> ResumptionRejected:
    """One exception object per failed caller (tracebacks are per raise)."""
    return ResumptionRejected(exc.reason, exc.detail)


class EpochClient:
    """An MCP client over Streamable HTTP that survives resumption rejections.

    ``async with EpochClient(url) as c: await c.call_tool(...)``; any SDK call can go through
    :meth:`run`. ``client_kwargs`` go to ``mcp.Client`` (callbacks, timeouts, ...).
    ``on_response(response, session_number, rejected)`` sees every HTTP response, after the
    client has decided whether it rejects its session.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: dict[str, str] | None = None,
        min_backoff: float = 0.1,
        max_backoff: float = 2.0,
        transport_retries: int = 8,
        on_response: Callable[[httpx2.Response, int, bool], None] | None = None,
        **client_kwargs: Any,
    ) -> None:
        self.url = url
        self._on_response_hook = on_response
        self._headers = headers
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._transport_retries = transport_retries
        self._user_message_handler = client_kwargs.pop("message_handler", None)
        self._client_kwargs = client_kwargs
        self._client_kwargs.setdefault("mode", "legacy")
        self._client_kwargs["message_handler"] = self._on_message
        self._progress: dict[str, ProgressFnT] = {}
        self._tg: TaskGroup | None = None
        self._attempt: _Attempt | None = None
        self._lock = anyio.Lock()
        self._count = 0
        self._cursors: dict[str, _Cursor] = {}
        self._not_started: set[str] = set()
        self.rejections: list[ResumptionRejected] = []
        #: Calls retried on a fresh session because the server refused them before they ran.
        self.retried = 0

    async def __aenter__(self) -> EpochClient:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        await self._current()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._tg is not None
        if self._attempt is not None:
            self._attempt.stop.set()
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)

    @property
    def session_number(self) -> int:
        """How many sessions this client has opened (1 until the first rejection)."""
        return self._count

    @property
    def session_id(self) -> str | None:
        """The server's id for the current session (from its ``mcp-session-id`` header)."""
        return None if self._attempt is None else self._attempt.session_id

    async def _on_response(self, att: _Attempt, response: httpx2.Response) -> None:
        sid = response.headers.get("mcp-session-id")
        if sid and response.status_code < 400:
            att.session_id = sid
        if response.status_code != 404:
            return
        header = response.headers.get(REJECTED_HEADER)
        had_session = "mcp-session-id" in response.request.headers
        if header is None and not had_session:
            return  # a 404 before any session exists is not about a session
        token = _call_token(response.request)
        if token is not None:
            self._not_started.add(token)  # the POST of a call was refused: it never ran
        if att.rejected is not None:
            return
        reason: Reason = header if header in REASONS else "unknown"
        detail = "rejected by the server" if header else "session not found"
        log.info(
            "session %d rejected (%s): failing %d pending", att.number, reason, len(att.pending)
        )
        att.reject(reason, detail)
        self.rejections.append(ResumptionRejected(reason, detail))

    async def _on_message(self, message: Any) -> None:
        """Progress of :meth:`call_tool` calls, routed by the call's own token.

        The SDK names a call's progress token after its request id, and a resumption is a new
        request with a new id, so the SDK would drop every progress notification the resumed
        stream carries (the server keeps the original token). Each call therefore carries a
        token of its own, and its progress comes here whichever request it arrives on.
        """
        if isinstance(message, ProgressNotification):
            callback = self._progress.get(str(message.params.progress_token))
            if callback is not None:
                p = message.params
                await callback(p.progress, p.total, p.message)
        if self._user_message_handler is not None:
            await self._user_message_handler(message)

    async def _fresh_cursor(self, request: httpx2.Request) -> None:
        """Resume from the newest cursor, never an older one of the same stream.

        When a resumed stream breaks, the SDK (mcp 2.3) reconnects from the cursor that stream
        was opened with, not from the last event it delivered; the server then replays, exactly
        as asked, events the caller already has (duplicates). Event IDs are unique per process
        epoch, so an older cursor of a call's stream maps to its newest one without ambiguity.
        """
        sent = request.headers.get("last-event-id")
        if sent:
            newest = self._cursors.get(sent)
            if newest is not None and newest.value and newest.value != sent:
                request.headers["last-event-id"] = newest.value

    async def _run_attempt(
        self, att: _Attempt, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        http = httpx2.AsyncClient(
            headers=self._headers, timeout=HTTP_TIMEOUT, transport=ResumeTransport()
        )

        async def hook(response: httpx2.Response) -> None:
            await self._on_response(att, response)
            if self._on_response_hook is not None:
                self._on_response_hook(response, att.number, att.rejected is not None)

        http.event_hooks = {"request": [self._fresh_cursor], "response": [hook]}
        try:
            async with http:
                # A rejected session is gone on the server; deleting it would only 404.
                transport = streamable_http_client(
                    self.url, http_client=http, terminate_on_close=False
                )
                async with Client(transport, **self._client_kwargs) as client:
                    att.client = client
                    att.ready.set()
                    await att.stop.wait()
        except Exception as exc:  # connect/initialize failed: a transport error, retried
            att.error = exc
            log.debug("session %d ended: %r", att.number, exc)
        finally:
            att.ready.set()
            att.stop.set()

    async def _current(self) -> _Attempt:
        """The live session, opening a new one (with backoff on transport errors) if needed."""
        async with self._lock:
            backoff = self._min_backoff
            for _ in range(self._transport_retries + 1):
                att = self._attempt
                if att is not None and att.client is not None and not att.stop.is_set():
                    return att
                assert self._tg is not None
                self._count += 1
                att = _Attempt(self._count)
                self._attempt = att
                await self._tg.start(self._run_attempt, att)
                await att.ready.wait()
                if att.client is not None and not att.stop.is_set():
                    return att
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
            error = None if self._attempt is None else self._attempt.error
            raise ConnectionError(f"cannot open a session at {self.url}: {error!r}")

    async def run(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        """Run one call on the current session; raise ``ResumptionRejected`` if it is rejected."""
        att = await self._current()
        scope = anyio.CancelScope()
        att.pending.add(scope)
        try:
            with scope:
                try:
                    assert att.client is not None
                    return await fn(att.client)
                except Exception as exc:
                    if att.rejected is not None:
                        raise _copy(att.rejected) from exc
                    if (
                        isinstance(exc, MCPError)
                        and exc.code == CONNECTION_CLOSED
                        and not await self._alive(att)
                    ):
                        # The SDK session's own connection is gone (every later request on
                        # it would fail at once): end it, so the next call opens a new one.
                        log.info("session %d lost its connection; a new one comes next", att.number)
                        att.stop.set()
                    raise
        finally:
            att.pending.discard(scope)
        # Only a rejection cancels the scope.
        raise _copy(att.rejected) if att.rejected else RuntimeError("call cancelled")

    @staticmethod
    async def _alive(att: _Attempt) -> bool:
        """Whether the session still answers: a lost stream is not a lost session."""
        if att.client is None or att.stop.is_set():
            return False
        return await _answers(att.client)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        progress_callback: ProgressFnT | None = None,
        read_timeout_seconds: float | None = None,
    ) -> CallToolResult:
        """``tools/call`` that resumes from its cursor on transport errors (with backoff)."""
        cursor: str | None = None
        chain = _Cursor()

        async def on_token(token: str) -> None:
            nonlocal cursor
            cursor = token
            chain.value = token
            chain.seen.append(token)
            self._cursors[token] = chain

        # Every call carries a token of its own: it routes the call's progress, and it tells a
        # refusal of this call's POST (never run, safe to retry) from any other rejection.
        token = f"epoch-{next(_TOKENS)}"
        meta: Any = {"progressToken": token}
        if progress_callback is not None:
            self._progress[token] = progress_callback
        params = CallToolRequestParams(name=name, arguments=arguments, _meta=meta)
        request = CallToolRequest(params=params)

        async def call(client: Client) -> CallToolResult:
            backoff = self._min_backoff
            metadata = ClientMessageMetadata(on_resumption_token_update=on_token)
            for attempt in range(self._transport_retries + 1):
                # Seen by this attempt's resumption GET (the SDK sends it in a copy of this
                # context): an explicit resumption must complete or fail, never just end.
                marker = explicit_resume.set(attempt > 0)
                try:
                    return await client.session.send_request(
                        request,
                        CallToolResult,
                        request_read_timeout_seconds=read_timeout_seconds,
                        metadata=metadata,
                    )
                except MCPError as exc:
                    if exc.code != CONNECTION_CLOSED or cursor is None:
                        raise
                    if attempt == self._transport_retries or not await _answers(client):
                        raise  # a session that cannot send any more cannot resume either
                    log.info("transport error %r; resuming from %s", exc, cursor)
                finally:
                    explicit_resume.reset(marker)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                metadata = ClientMessageMetadata(
                    resumption_token=cursor, on_resumption_token_update=on_token
                )
            raise AssertionError("unreachable")  # pragma: no cover

        try:
            for _ in range(MAX_NOT_STARTED_RETRIES):
                try:
                    return await self.run(call)
                except ResumptionRejected as exc:
                    if token not in self._not_started or cursor is not None:
                        raise  # it may have run: fail fast, never retry blindly
                    self._not_started.discard(token)
                    self.retried += 1
                    log.info("call refused before it ran (%s); retrying on a new session", exc)
            return await self.run(call)
        finally:
            self._not_started.discard(token)
            self._progress.pop(token, None)
            for seen in chain.seen:
                self._cursors.pop(seen, None)
