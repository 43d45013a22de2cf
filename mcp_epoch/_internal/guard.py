"""``ResumptionGuard``: ASGI middleware that applies the resume decision before the SDK does.

Left alone, the SDK answers an unknown ``Last-Event-ID`` with an empty 200 stream (the client
waits forever) and a failing store with a 500 (the client retries the same dead cursor). The
guard answers instead: 400 for a malformed cursor, and for a rejected one a 404, which makes
spec-following clients re-initialize, with a JSON-RPC error whose ``data.reason`` says why and a
``Mcp-Resumption-Rejected`` header. It also tags every request with its session (see
:mod:`mcp_epoch._internal.sessions`) and, when this process is a zombie, refuses new sessions.
Requests of the 2026-07-28 revision (no sessions, no resumption) pass through untouched.
This module does not import ``mcp``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Final, Protocol

from mcp_epoch._internal.decision import ReplayPlan
from mcp_epoch._internal.errors import Reason, ResumptionRejected
from mcp_epoch._internal.eventid import EventId
from mcp_epoch._internal.resume import ResumeState, current_resume
from mcp_epoch._internal.sessions import SessionRegistry, SessionTag, current_session
from mcp_epoch.contract import REJECTED_HEADER

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


class ResumeAuthority(Protocol):
    """What the guard needs from the store (``EpochEventStore`` satisfies it)."""

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
    """Wrap the SDK's Streamable HTTP ASGI app: ``ResumptionGuard(app, store)``."""

    def __init__(self, app: ASGIApp, store: ResumeAuthority) -> None:
        self.app = app
        self.store = store
        self.sessions = SessionRegistry()

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

        raw_sid = headers.get(SESSION_HEADER)
        sid = None if raw_sid is None else raw_sid.decode("latin-1")
        tag = None if sid is None else self.sessions.get(sid)
        method = scope.get("method")
        cursor = headers.get(LAST_EVENT_ID_HEADER)
        resuming = method == "GET" and bool(cursor)

        if resuming:
            assert cursor is not None
            if not await self._admit_resumption(cursor.decode("latin-1"), tag, send):
                return
        elif sid is None and method == "POST" and self.store.is_zombie():
            await send_rejection(send, "retired", "this process's epoch is retired")
            return

        fresh = tag is None and sid is None
        if fresh:
            tag = SessionTag()
        resume = ResumeState() if resuming else None
        token = current_session.set(tag)
        resume_token = current_resume.set(resume)
        try:
            await self.app(scope, receive, self._wrap_send(send, tag if fresh else None, resume))
        finally:
            current_resume.reset(resume_token)
            current_session.reset(token)

    async def _admit_resumption(self, cursor: str, tag: SessionTag | None, send: Send) -> bool:
        try:
            self.store.decide(cursor, tag)
        except ValueError as exc:
            await respond(send, 400, error_body(f"Malformed Last-Event-ID: {exc}"))
            return False
        except ResumptionRejected as exc:
            log.info("resumption rejected: %s", exc)
            await send_rejection(send, exc.reason, exc.detail)
            return False
        except Exception:
            # A failing decision must not become a 500 the client would retry forever.
            log.exception("resume decision failed; rejecting")
            await send_rejection(send, "unknown", "the server could not check the cursor")
            return False
        return True

    def _wrap_send(self, send: Send, fresh: SessionTag | None, resume: ResumeState | None) -> Send:
        if fresh is None and resume is None:
            return send
        swallowing = False

        async def wrapped(message: Message) -> None:
            nonlocal swallowing
            if message["type"] == "http.response.start":
                if resume is not None and message.get("status", 200) >= 500:
                    # The SDK failed after we accepted (e.g. the store raised): translate.
                    swallowing = True
                    await send_rejection(send, "unknown", "the server could not replay")
                    return
                if fresh is not None:
                    for key, value in message.get("headers", ()):
                        if bytes(key).lower() == SESSION_HEADER:
                            self.sessions.bind(bytes(value).decode("latin-1"), fresh)
                            break
            elif swallowing:
                return
            elif resume is not None and resume.broken and not message.get("more_body", False):
                # Never end a resumed stream that lost events as if it were complete: without
                # its last chunk the server closes the connection, and the client reconnects
                # from the cursor it really has (and is told ``gap``).
                log.warning("resumed stream overtaken by eviction; aborting its connection")
                return
            await send(message)

        return wrapped
