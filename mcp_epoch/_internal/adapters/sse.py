"""Server-sent events read from bytes as they arrive, and written back out.

The sidecar reads its upstream's SSE from the lean HTTP hop of :mod:`mcp_epoch._internal.upstream`
chunk by chunk, so it needs a push parser over bytes; the SSE decoders of the HTTP clients at
hand read their own response objects (httpx2's is private). This is the parsing algorithm of
the HTML standard (9.2.6), restricted to what an MCP stream uses: lines end in LF, CRLF or CR
(a CR at the end of a chunk waits for the next one, which may bring its LF), a blank line
dispatches, ``:`` starts a comment, and the fields are ``event``, ``data``, ``id`` and ``retry``.
"""

from __future__ import annotations

from typing import Final, NamedTuple

#: The largest event accepted from an upstream (a tool's result may carry an image).
MAX_EVENT_BYTES: Final = 16 * 1024 * 1024


class EventTooLarge(ValueError):
    """An event grew past :data:`MAX_EVENT_BYTES` before its blank line."""


class Event(NamedTuple):
    """One dispatched event: ``data`` is None when no ``data`` field came (nothing to deliver,
    such as a bare ``id:`` or ``retry:``), ``""`` for an empty one (an MCP priming event)."""

    data: str | None
    id: str | None
    event: str
    retry: int | None


class Parser:
    """Feed bytes, get the events they complete; :attr:`last_id` is the stream's cursor."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._pending = b""
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None
        self._size = 0
        #: The last ``id`` the stream set, across events (the cursor a client would resume from).
        self.last_id: str | None = None

    def feed(self, chunk: bytes) -> list[Event]:
        data = self._pending + chunk
        # A CR at the very end may be the first half of a CRLF: keep it for the next chunk.
        hold = data.endswith(b"\r")
        if hold:
            data = data[:-1]
        lines = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._pending = lines.pop() + (b"\r" if hold else b"")
        if len(self._pending) + self._size > self._max:
            raise EventTooLarge(f"an upstream event passed {self._max} bytes")
        out: list[Event] = []
        for line in lines:
            event = self._line(line.decode("utf-8", "replace"))
            if event is not None:
                out.append(event)
        return out

    def _line(self, line: str) -> Event | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        self._size += len(line)
        if self._size > self._max:
            raise EventTooLarge(f"an upstream event passed {self._max} bytes")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
            self.last_id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> Event | None:
        data = "\n".join(self._data) if self._data else None
        event = Event(data, self._id, self._event or "message", self._retry)
        self._data, self._event, self._id, self._retry, self._size = [], "", None, None, 0
        if data is None and event.id is None and event.retry is None:
            return None
        return event


def encode(event_id: str | None, data: str, retry: int | None = None) -> bytes:
    """One ``message`` event as the MCP SDKs write it (a multi-line ``data`` keeps its lines)."""
    head = b"" if event_id is None else b"id: %s\n" % event_id.encode()
    if retry is not None:
        head += b"retry: %d\n" % retry
    body = b"".join(b"data: %s\n" % line.encode() for line in data.split("\n"))
    return head + b"event: message\n" + body + b"\n"
