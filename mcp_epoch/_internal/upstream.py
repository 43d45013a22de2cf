"""One HTTP/1.1 exchange with a session's owner, on a connection of its own.

A forward is the one request of the library whose cost a client feels on every call of a
session that lives elsewhere. httpx spent about half of a forwarding replica's CPU per
request on what a forward never needs (URL and header models, a pool, timeouts through anyio),
and h11, its pure-Python engine, still ~0.2 ms on parsing one small answer; so the hop is an
asyncio protocol here, with httptools (the C parser uvicorn serves with) reading the answer.
The request is written as received: its method, target and headers come from the ASGI server,
which parsed and checked them. Every exchange opens a connection and closes it: an idle
pooled connection that its owner closes as a request crosses it would lose that request
unanswered, unknowable as "not run".

What went wrong is told apart by what the owner's end did, because that decides whether the
request may have run:

* :class:`Refused`: no connection, or the owner reset it before answering. TCP resets a
  connection closed with data still unread (RFC 9293, 3.6.1), which a process that read the
  whole request never does: the request did not run.
* :class:`Broken`: the owner took the request and the connection ended (a clean close, a
  malformed answer, a timeout) before a complete answer: it may have run.
"""

from __future__ import annotations

import asyncio
import select
from collections import deque
from collections.abc import Sequence
from typing import Final, cast

import httptools

Headers = Sequence[tuple[bytes, bytes]]

#: Answer bytes held for a relay that has not taken them yet, before the socket is paused:
#: a slow client slows its owner down instead of filling this process's memory.
MAX_PENDING: Final = 256 * 1024
#: An answer of at most this declared length is read through without watching the client.
SMALL_BODY: Final = 64 * 1024


class Refused(Exception):
    """The owner did not take the request: it did not run there."""


class Broken(Exception):
    """The connection ended before a complete answer, after the owner may have read the
    request."""


def host_port(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` as the ledger records it."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not host:port: {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def request_head(
    method: str, target: bytes, headers: Headers, length: int, *, keep: bool = False
) -> bytes:
    """The request line and headers, with the body's length and ``Connection: close`` (or
    ``keep-alive``, for a :class:`Pool`'s connection). Raises :class:`Refused` for a field
    that would break the framing (the ASGI server already refuses those; this keeps a
    hand-built scope from smuggling one)."""
    fields = b"".join([b"%s: %s\r\n" % (name, value) for name, value in headers])
    # Each field must be one line of one name: as many CRLFs as fields, no other CR or LF,
    # and no colon in a name (checked per field only when the whole block is in doubt).
    if fields.count(b"\n") != len(headers) or fields.count(b"\r") != len(headers):
        raise Refused("the request cannot be sent: a header holds a line break")
    for name, _ in headers:
        if b":" in name:
            raise Refused(f"the request cannot be sent: a bad header {name!r}")
    close = b"keep-alive" if keep else b"close"
    return b"%s %s HTTP/1.1\r\n%scontent-length: %d\r\nconnection: %s\r\n\r\n" % (
        method.encode("ascii"),
        target,
        fields,
        length,
        close,
    )


class _Hop(asyncio.Protocol):
    """The client end of one exchange: writes the request and parses the answer as it
    arrives. The relay reads what it parsed through :class:`Exchange`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, bodiless: bool) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._bodiless = bodiless  # the answer to a HEAD request has no body whatever it says
        self._transport: asyncio.Transport | None = None
        self.status = 0  # set once the final answer's head has arrived
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[None] = loop.create_future()
        self._loop = loop
        self._chunks: deque[bytes] = deque()
        self._pending = 0
        self._paused = False
        self._wakeup: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._framed = False  # a length or chunked framing: the close does not end the body
        self.complete = False
        self.error: Exception | None = None
        self.closed = False  # the connection is gone
        self.reusable = False  # the answer ended and the owner keeps the connection open

    def renew(self, bodiless: bool) -> None:
        """Ready for the next exchange on this (kept-alive) connection."""
        self._bodiless = bodiless
        self.status = 0
        self.headers = []
        self.head = self._loop.create_future()
        self._chunks.clear()
        self._pending = 0
        self._framed = False
        self.complete = False
        self.error = None
        self.reusable = False

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.complete:
            self.reusable = False  # bytes nobody asked for: never reuse this connection
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(Broken(f"a malformed answer: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # the owner is done: close our end too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self.complete or self.error is not None:
            return
        if self.status and exc is None and not self._framed:
            self.on_message_complete()  # the close ends a body of no declared length
        elif isinstance(exc, ConnectionResetError | BrokenPipeError) and not self.status:
            self._fail(Refused(f"reset the connection unread: {exc!r}"))
        elif exc is not None:
            self._fail(Broken(f"the connection broke: {exc!r}"))
        elif not self.status:
            self._fail(Broken("the owner closed the connection before answering"))
        else:
            self._fail(Broken("the connection closed before the answer ended"))

    def pause_writing(self) -> None:
        self._writable = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- httptools callbacks -----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            self.headers = []  # an interim answer (100 Continue): the final one follows
            return
        self.status = status
        self._framed = any(
            k == b"content-length" or (k == b"transfer-encoding" and b"chunked" in v.lower())
            for k, v in self.headers
        )
        self.head.set_result(None)
        if self._bodiless:
            self.on_message_complete()

    def on_body(self, body: bytes) -> None:
        if self.complete:
            return
        self._chunks.append(body)
        self._pending += len(body)
        if self._pending > MAX_PENDING and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.status and not self.complete:  # not the end of an interim (1xx) answer
            self.complete = True
            self.reusable = self._framed and self._parser.should_keep_alive()
            self._wake()

    # -- for Exchange ------------------------------------------------------------------------
    def _fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc
        if not self.head.done():
            self.head.set_result(None)  # with no status: :func:`exchange` raises the error
        self._wake()

    def _wake(self) -> None:
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def take(self) -> bytes | None:
        """Body bytes parsed so far (b"" when none yet), or None at the body's end."""
        if self._chunks:
            data = b"".join(self._chunks)
            self._chunks.clear()
            self._pending = 0
            if self._paused and self._transport is not None:
                self._paused = False
                self._transport.resume_reading()
            return data
        if self.complete:
            return None
        if self.error is not None:
            raise self.error if isinstance(self.error, Broken) else Broken(str(self.error))
        return b""

    async def more(self) -> None:
        self._wakeup = self._loop.create_future()
        await self._wakeup

    def send(self, data: bytes) -> None:
        assert self._transport is not None
        self._transport.write(data)

    @property
    def write_paused(self) -> bool:
        """The transport holds more of the request than its high-water mark (a body of a few
        hundred KiB); it resumes as the owner reads."""
        return self._writable is not None and not self._writable.done()

    async def flushed(self) -> None:
        if self._writable is not None:
            await self._writable

    async def answered(self) -> None:
        """Until the answer's head arrived; raises what ended the exchange before it."""
        await self.head
        if not self.status:
            assert self.error is not None
            raise self.error

    @property
    def buffered(self) -> bool:
        """Body bytes (or the body's end) are here already: reading waits for nothing."""
        return bool(self._chunks) or self.complete

    def idle_and_open(self) -> bool:
        """Nothing is waiting to be read on the kept-alive connection: no close from the
        server that the event loop has not processed yet, and no stray bytes (readable is
        either, and both rule the connection out)."""
        sock = None if self._transport is None else self._transport.get_extra_info("socket")
        if self.closed or sock is None or sock.fileno() < 0:
            return False
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
        return not readable

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class Exchange:
    """An answer whose head has arrived; its body is read with :meth:`body`. Close it."""

    def __init__(self, hop: _Hop, pool: Pool | None = None) -> None:
        self._hop = hop
        self._pool = pool
        self._closed = False
        self.status = hop.status
        #: As received: names lowercased, values untouched.
        self.headers = hop.headers

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    @property
    def small(self) -> bool:
        """A body of declared length up to :data:`SMALL_BODY`, such as a JSON answer: an app
        has it whole when it sends its head (an SSE stream has no length), so it can be read
        through without watching whether the client is still there."""
        length = self.header(b"content-length")
        return length is not None and length.isdigit() and int(length) <= SMALL_BODY

    async def chunk(self) -> bytes | None:
        """The body's next bytes (framing removed), once there are some; None at its end;
        :class:`Broken` when the connection ends first. (A coroutine, not an async
        generator: the event loop keeps a registry of those, a cost on every answer.)"""
        hop = self._hop
        while (data := hop.take()) is not None:
            if data:
                return data
            await hop.more()
        return None

    async def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the body (the rest is left unread)."""
        out = b""
        while (chunk := await self.chunk()) is not None:
            out += chunk
            if len(out) >= limit:
                break
        return out[:limit]

    @property
    def buffered(self) -> bool:
        """More of the body, or its end, can be read without waiting."""
        return self._hop.buffered

    def close(self) -> None:
        """Ends the connection; unread answer bytes make it a reset, which is what an owner
        whose client left should see. A :class:`Pool`'s connection whose answer was read to
        its end goes back to the pool instead. Closing again does nothing: the connection may
        be another exchange's by then."""
        if self._closed:
            return
        self._closed = True
        hop = self._hop
        if self._pool is not None and hop.reusable and not hop._chunks and not hop.closed:
            self._pool.give_back(hop)
            return
        hop.close()


class Pool:
    """Kept-alive connections to one address, for a relay whose peer is on the same pod.

    A forward opens a connection per exchange (see the module's docstring): a peer pod may
    close an idle pooled connection just as a request crosses it, and that request's fate is
    then unknowable. The sidecar's upstream is the server beside it, and opening a connection
    per request cost both sides more than the rest of the hop (``python -m bench proxy``). So a
    connection whose answer was read to its end is kept, but only for :data:`IDLE_SECONDS`,
    far below the idle timeouts HTTP servers keep connections for (5 s in Node.js and uvicorn),
    and only while nothing is waiting to be read on it (a server's close the event loop has
    not seen yet rules it out), so the server does not close one that is about to be reused.
    Should it all the same, it resets the connection with the request unread
    (:class:`Refused`), and the request is sent once more on a new connection: it did not run.
    """

    IDLE_SECONDS: Final = 1.0

    def __init__(self, address: str) -> None:
        self.address = address
        self._idle: deque[tuple[float, _Hop]] = deque()

    def take(self, loop: asyncio.AbstractEventLoop) -> _Hop | None:
        now = loop.time()
        while self._idle:
            since, hop = self._idle.pop()  # the most recently used: the least likely to expire
            if now - since < self.IDLE_SECONDS and hop.idle_and_open():
                return hop
            hop.close()
        return None

    def give_back(self, hop: _Hop) -> None:
        now = hop._loop.time()
        while self._idle and now - self._idle[0][0] >= self.IDLE_SECONDS:
            self._idle.popleft()[1].close()
        self._idle.append((now, hop))

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()


async def exchange(
    address: str,
    method: str,
    target: bytes,
    headers: Headers,
    body: bytes,
    *,
    connect_timeout: float,
    write_timeout: float,
    local_host: str | None = None,
    pool: Pool | None = None,
) -> Exchange:
    """Send one request with its whole ``body`` to ``address`` and wait for the answer's head.

    ``headers`` must hold neither framing nor hop-by-hop fields: ``Content-Length`` and
    ``Connection: close`` are set here. ``local_host``: the address to send from (a hand-on
    is sent from the sender's own pod address, which the receiver checks). ``pool``: take a
    kept-alive connection from it, and give the connection back once the answer was read
    (see :class:`Pool`). Raises :class:`Refused` or :class:`Broken`.
    """
    data = request_head(method, target, headers, len(body), keep=pool is not None) + body
    loop = asyncio.get_running_loop()
    hop = None if pool is None else pool.take(loop)
    if hop is not None:
        hop.renew(method == "HEAD")
        try:
            return await _send(hop, data, write_timeout, pool)
        except Refused:
            pass  # the server closed it as the request arrived, unread: send it once more
    host, port = host_port(address)
    try:
        async with asyncio.timeout(connect_timeout):
            _, hop = await loop.create_connection(
                lambda: _Hop(loop, method == "HEAD"),
                host,
                port,
                local_addr=None if local_host is None else (local_host, 0),
            )
    except (OSError, TimeoutError) as exc:
        raise Refused(f"no connection: {exc!r}") from None
    return await _send(hop, data, write_timeout, pool)


async def _send(hop: _Hop, data: bytes, write_timeout: float, pool: Pool | None) -> Exchange:
    """Write the request on ``hop`` and wait for the answer's head."""
    try:
        hop.send(data)
        if hop.write_paused:
            async with asyncio.timeout(write_timeout):
                await hop.flushed()
        await hop.answered()
    except TimeoutError:
        hop.close()
        raise Broken(f"the owner took no more of the request for {write_timeout:g} s") from None
    except BaseException:
        hop.close()
        raise
    return Exchange(hop, pool)
