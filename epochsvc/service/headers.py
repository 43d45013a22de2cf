"""A bound on the request head, before any of it reaches the app: ``431``, then close.

uvicorn's httptools protocol buffers a request head for as long as it keeps arriving. Eight
unterminated 32 MB headers, sent without credentials, took the service from 77 to 382 MB.
No ASGI middleware can help there: the app sees a request only once its head is complete.

Two counts, because a head can arrive either way:

* **Exact, for a head the parser completes.** The request target and every header field
  (``name: value`` and its line end) are counted as the parser hands them over, so the
  documented limit is the real one whether the head came in one write or in many. The first
  read of a connection is counted like any other: the count belongs to the parser's message,
  not to the read that carried it.
* **Raw, for a head that never ends.** httptools buffers an unfinished header field itself, so
  the bytes read while a head is open are counted too, and once a head still unfinished has
  passed the limit by more than :data:`READ_SLACK` it is refused and nothing more is parsed.
  That keeps memory bounded whatever the sender does.

A refused head gets ``431 Request Header Fields Too Large`` and the connection closes; nothing
of it reaches the app, and the rest of what was read is ignored. If requests pipelined before
it on the connection are still being answered, the ``431`` waits for their answers, so a
refusal never cuts off the answer to a request that ran.
"""

from __future__ import annotations

import json
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

DEFAULT_MAX_HEADER_BYTES = 16 * 1024
#: How far the raw count may pass the limit before an unfinished head is refused: one read
#: of the event loop (64 KiB), which may also carry the end of the previous request's body.
READ_SLACK: Final = 64 * 1024
_FIELD_OVERHEAD: Final = 4  # ": " and CRLF


class BoundedHeadProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` that refuses a request head longer than ``max_header_bytes``."""

    max_header_bytes = DEFAULT_MAX_HEADER_BYTES

    # Slots, not attributes: uvicorn's protocol keeps 27 in its instance dict, and five more
    # took it past the 30 a dict of shared keys holds, to a combined dict of 1.5 KiB for every
    # connection (5.5 times its size; a tenth of what a held long poll keeps).
    __slots__ = ("_head_bytes", "_in_head", "_owed_431", "_raw_bytes", "_refused")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between the end of one message and the end of the next head
        self._head_bytes = 0  # exact: target and fields of the head being parsed
        self._raw_bytes = 0  # read while a head was open
        self._refused = False
        self._owed_431 = False  # refused while earlier requests are still being answered

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._raw_bytes += len(data)  # may include a body after the head: checked below
        super().data_received(data)
        if self._in_head and self._raw_bytes > self.max_header_bytes + READ_SLACK:
            self._refuse()  # a head still unfinished this far in: it is not parsed further

    def on_message_begin(self) -> None:
        if self._refused:
            return
        self._in_head = True
        self._head_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self._count(len(url)):
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._count(len(name) + len(value) + _FIELD_OVERHEAD):
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._in_head = False
        self._raw_bytes = 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._in_head = True
        super().on_message_complete()

    def _count(self, n: int) -> bool:
        """Add ``n`` bytes to the head; False (and the head refused) once it is too long."""
        if self._refused:
            return False
        self._head_bytes += n
        if self._head_bytes > self.max_header_bytes:
            self._refuse()
            return False
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._owed_431 and self._answered_all():
            self._send_431()

    def _answered_all(self) -> bool:
        return not self.pipeline and (self.cycle is None or self.cycle.response_complete)

    def _refuse(self) -> None:
        self._refused = True
        if self._answered_all():
            self._send_431()
        else:
            self._owed_431 = True

    def _send_431(self) -> None:
        self._owed_431 = False
        if self.transport.is_closing():
            return
        body = json.dumps(
            {
                "code": "headers-too-large",
                "message": f"the request head is over {self.max_header_bytes} bytes: "
                "send fewer or shorter headers",
            }
        ).encode()
        head = (
            "HTTP/1.1 431 Request Header Fields Too Large\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\n"
            "connection: close\r\n\r\n"
        ).encode()
        self.transport.write(head + body)
        self.transport.close()


def bounded(max_header_bytes: int) -> type[BoundedHeadProtocol]:
    """The protocol class for uvicorn's ``http=`` option, with this limit."""
    return type("BoundedHead", (BoundedHeadProtocol,), {"max_header_bytes": max_header_bytes})
