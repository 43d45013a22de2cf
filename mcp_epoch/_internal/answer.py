"""The app's answer on its way to the client: what the guard changes in it and learns from it.

The guard hands the app behind it :meth:`Answer.send` in place of the server's ``send``. The
answer's start gets the session ID as the client holds it, this process's name, the relay's
"call stream" mark and, while draining, ``Connection: close``. Its chunks tell the drain when a
call is delivered, and a stream that must not look complete (a session a drain ends, a resumed
stream that lost events) is cut before its last chunk.

Every chunk of every answer passes here (fourteen for a tool call with ten progress
notifications), so :meth:`Answer.send` does the fewest steps it can for a body chunk and
leaves the rest to the start and the last chunk. An answer is one slotted object per request
whose bound method the app gets: its state in one place rather than a closure's dozen cells
(which measured the same speed, ``python -m bench guard``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final, Protocol

from mcp_epoch._internal.inflight import InFlight
from mcp_epoch._internal.replies import send_rejection
from mcp_epoch._internal.resume import ResumeState
from mcp_epoch._internal.sessions import SessionRegistry, SessionTag
from mcp_epoch.contract import CALL_STREAM_HEADER, SERVED_BY_HEADER, SESSION_SEPARATOR

log = logging.getLogger(__name__)

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]
#: A call's key in :class:`InFlight`: (session tag, JSON-RPC request id as a stream name).
CallKey = tuple[SessionTag | None, str]

SESSION_HEADER: Final = b"mcp-session-id"
_SERVED_BY: Final = SERVED_BY_HEADER.encode()
_CALL_STREAM: Final = (CALL_STREAM_HEADER.encode(), b"1")
_JSON: Final = b"application/json"


class Guarding(Protocol):
    """What an answer needs of the guard that serves it."""

    sessions: SessionRegistry
    inflight: InFlight

    def is_draining(self) -> bool: ...

    def closing(self, send: Send) -> Send: ...


def with_close(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``Connection: close`` in place of any ``Connection`` field."""
    return [h for h in headers if bytes(h[0]).lower() != b"connection"] + [
        (b"connection", b"close")
    ]


class Answer:
    """One request's answer, from the app to the server's ``send`` (see the module)."""

    __slots__ = (
        "_call_stream",
        "_fresh",
        "_guard",
        "_is_answered",
        "_keys",
        "_own",
        "_resume",
        "_send",
        "_swallowing",
        "_tag",
        "_whole",
        "cut",
    )

    def __init__(
        self,
        guard: Guarding,
        own: str,
        send: Send,
        tag: SessionTag | None,
        fresh: bool,
        resume: ResumeState | None,
        keys: list[CallKey],
        call_stream: bool,
    ) -> None:
        self._guard = guard
        self._is_answered = guard.inflight.is_answered
        self._own = own
        self._send = send
        self._tag = tag
        self._fresh = fresh
        self._resume = resume
        #: The calls whose stream this is: a chunk may deliver them.
        self._keys = keys
        #: A forwarded resumption of a call's stream: the relay is told so.
        self._call_stream = call_stream
        self._swallowing = False
        self._whole = False  # a JSON (not SSE) answer: its end delivers the call
        #: The stream was cut on purpose: the guard tells uvicorn's log so once the app has
        #: returned, in the task uvicorn logs from (the task that sends may be another).
        self.cut = False

    def send(self, message: Message) -> Awaitable[None]:
        """The app's ``send``. A plain function, not a coroutine: a chunk with more to follow
        and no call of its stream answered yet teaches nothing, and goes to the server's
        ``send`` as it is, with no frame of this layer around it (most chunks: progress and
        other notifications). Other chunks take :meth:`_deliver`, the start :meth:`_start`."""
        kind = message["type"]
        if kind == "http.response.body":
            if message.get("more_body", False):
                is_answered = self._is_answered
                for key in self._keys:
                    if is_answered(key, False):
                        break
                else:
                    if not self._swallowing:
                        return self._send(message)
            return self._deliver(message)
        if kind == "http.response.start":
            return self._start(message)
        return self._other(message)

    async def _deliver(self, message: Message) -> None:
        if self._swallowing:
            return
        more = message.get("more_body", False)
        if not more and self._cut():
            return
        await self._send(message)
        # A chunk written once the call's answer was stored carries that answer (it is the
        # last message of its stream): the call is delivered. Clients often close a stream
        # once they have the answer, before its final empty chunk.
        inflight = self._guard.inflight
        for key in self._keys:
            if self._whole and not more:
                inflight.delivered_whole(key)
            elif inflight.is_answered(key, False):
                inflight.sent_after(key)

    async def _other(self, message: Message) -> None:
        """Any other message (an extension's): as it is, unless the answer is swallowed."""
        if not self._swallowing:
            await self._send(message)

    def _cut(self) -> bool:
        """Whether the stream ends without its last chunk."""
        tag = self._tag
        if tag is not None and tag.ending:
            # A drain that ran out of time ends this session: its streams are cut, not
            # ended, so the client comes back (and hears the session is gone) instead of
            # waiting for an answer on a stream that looks complete.
            self.cut = True
            return True
        resume = self._resume
        if resume is not None and resume.broken:
            # Never end a resumed stream that lost events as if it were complete: without its
            # last chunk the server closes the connection, and the client reconnects from the
            # cursor it really has (and is told ``gap``).
            log.warning("resumed stream overtaken by eviction; aborting its connection")
            return True
        return False

    async def _start(self, message: Message) -> None:
        status = message.get("status", 200)
        if self._resume is not None and status >= 500:
            # The app failed after the guard accepted (e.g. the store raised): translate.
            self._swallowing = True
            await send_rejection(
                self._guard.closing(self._send), "unknown", "the server could not replay"
            )
            return
        headers, is_json = self._outgoing(message)
        if self._guard.is_draining():
            headers = with_close(headers)
        if self._call_stream:
            headers.append(_CALL_STREAM)
        if self._resume is None and status >= 400:
            for key in self._keys:  # refused by the app (e.g. an ended session): no call
                self._guard.inflight.forget(key)
        self._whole = status < 300 and is_json
        await self._send(dict(message, headers=headers))

    def _outgoing(self, start: Message) -> tuple[list[tuple[bytes, bytes]], bool]:
        """Response headers with the session ID shown as the client holds it (the tag's public
        ID, minted here as ``<own epoch>_<app's id>`` when the session opened here) and this
        process named as the one that answered; and whether the body is JSON (not SSE)."""
        own, tag = self._own, self._tag
        out = [(_SERVED_BY, own.encode())]
        is_json = False
        for header in start.get("headers", ()):
            key, value = header
            name = key.lower()  # bytes, or a bytearray, which compares equal to bytes
            if name == SESSION_HEADER:
                shown = None if self._fresh or tag is None else tag.public_id
                if not shown:
                    local = bytes(value).decode("latin-1")
                    shown = f"{own}{SESSION_SEPARATOR}{local}"
                    if self._fresh and tag is not None:
                        self._guard.sessions.bind(local, tag, shown)
                header = (key, shown.encode("latin-1"))
            elif name == b"content-type":
                # A slice, not ``startswith``: Python 3.11 parses that method's arguments
                # through a format string on every call.
                is_json = value[: len(_JSON)] == _JSON
            out.append(header)
        return out, is_json
