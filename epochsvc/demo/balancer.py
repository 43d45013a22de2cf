"""The load balancer of the scenario: a small asyncio HTTP/1.1 reverse proxy on loopback.

It knows nothing about MCP: it never reads ``Mcp-Session-Id`` and has no session affinity. It
streams responses as they come (SSE included), forwards headers, adds ``X-Demo-Backend`` (which
replica answered, as many balancers do) and routes round-robin over the replica set *of the
moment*, which the fleet driver changes during the rolling deploy.

Two routing policies:

* ``link`` (default): round-robin per client connection, as an L4 balancer such as a
  Kubernetes Service does for a client that multiplexes its requests over one connection. The
  ``X-Demo-Client`` header stands for that connection. The connection is pinned to the replica
  picked when it opened, until the client drops it or the replica leaves the set; the next one
  goes to whichever replica is next in the rotation, wherever the client's session lives.
* ``request``: round-robin per HTTP request. No stateful MCP server can hold a session behind
  that (most requests reach a process that does not hold it), so it is there for comparison.
* ``sticky``: session affinity on the ``Mcp-Session-Id`` header, what users put in front of
  plain SDK servers today (and what Kubernetes MCP operators default to, by client IP or by
  session header). A session is pinned to the replica that answered its ``initialize``; when
  that replica leaves the set, the session's next request goes to the next one in the rotation.

:meth:`Balancer.drop` cuts a client's connections mid-stream, the scenario's network failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

Policy = Literal["link", "request", "sticky"]
SESSION_HEADER = b"mcp-session-id"
CLIENT_HEADER = "x-demo-client"
BACKEND_HEADER = "x-demo-backend"
_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te", b"upgrade"}
)


@dataclass(frozen=True, slots=True)
class Backend:
    name: str
    host: str
    port: int


@dataclass(eq=False)
class _Conn:
    down: asyncio.StreamWriter
    up: asyncio.StreamWriter | None = None

    def abort(self) -> None:
        for w in (self.down, self.up):
            if w is not None:
                w.transport.abort()


@dataclass
class ProxyStats:
    requests: int = 0
    drops: int = 0
    cut_connections: int = 0
    no_backend: int = 0
    upstream_errors: int = 0
    per_backend: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Balancer:
    """Round-robin reverse proxy; ``await start()``, then point clients at :attr:`url`."""

    def __init__(self, policy: Policy = "link", host: str = "127.0.0.1") -> None:
        self.policy: Policy = policy
        self.host = host
        self.port = 0
        self._backends: list[Backend] = []
        self._rr = itertools.count()
        self._pins: dict[str, Backend] = {}
        self._sessions: dict[str, Backend] = {}  # sticky: session id -> its replica
        self._conns: dict[str, set[_Conn]] = defaultdict(set)
        self._server: asyncio.Server | None = None
        self.stats = ProxyStats()
        #: Told of every request routed (the replica, the request body), for a test to see
        #: where each round of a multi-round-trip request went.
        self.on_request: Callable[[Backend, bytes], None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/mcp"

    @property
    def backends(self) -> tuple[Backend, ...]:
        return tuple(self._backends)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, 0, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conns in list(self._conns.values()):
            for c in list(conns):
                c.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    # --- the replica set of the moment --------------------------------------------------

    def add(self, backend: Backend) -> None:
        self._backends.append(backend)

    def remove(self, name: str) -> None:
        """Take a replica out of the rotation. Open connections to it stay (they end when the
        process stops); clients pinned to it are routed anew on their next connection."""
        self._backends = [b for b in self._backends if b.name != name]
        for client, b in list(self._pins.items()):
            if b.name == name:
                del self._pins[client]
        for sid, b in list(self._sessions.items()):
            if b.name == name:
                del self._sessions[sid]

    def drop(self, client: str) -> int:
        """Cut every connection of ``client`` now (mid-stream), as a network failure would."""
        self._pins.pop(client, None)
        conns = list(self._conns.get(client, ()))
        for c in conns:
            c.abort()
        self.stats.drops += 1
        self.stats.cut_connections += len(conns)
        return len(conns)

    def _pick(self, client: str | None, session: str | None = None) -> Backend | None:
        if not self._backends:
            return None
        if self.policy == "sticky":
            if session is not None:
                pinned = self._sessions.get(session)
                if pinned is not None and pinned in self._backends:
                    return pinned
                backend = self._backends[next(self._rr) % len(self._backends)]
                self._sessions[session] = backend
                return backend
            return self._backends[next(self._rr) % len(self._backends)]
        if self.policy == "link" and client is not None:
            pinned = self._pins.get(client)
            if pinned is not None and pinned in self._backends:
                return pinned
        backend = self._backends[next(self._rr) % len(self._backends)]
        if self.policy == "link" and client is not None:
            self._pins[client] = backend
        return backend

    # --- HTTP/1.1 forwarding ------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer)
        client: str | None = None
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
                    return
                request_line, headers = _parse_head(head)
                body = await _read_body(reader, headers)
                client = _header(headers, CLIENT_HEADER.encode()) or client
                if client is not None:
                    self._conns[client].add(conn)
                backend = self._pick(client, _header(headers, SESSION_HEADER))
                if backend is None:
                    self.stats.no_backend += 1
                    writer.write(_simple(503, b"no replica available"))
                    await writer.drain()
                    continue
                self.stats.requests += 1
                self.stats.per_backend[backend.name] += 1
                if self.on_request is not None:
                    self.on_request(backend, body)
                if not await self._forward(conn, backend, request_line, headers, body):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            if client is not None:
                self._conns[client].discard(conn)
                if not self._conns[client]:
                    self._conns.pop(client, None)
            writer.transport.abort() if writer.transport.is_closing() else writer.close()

    async def _forward(
        self,
        conn: _Conn,
        backend: Backend,
        request_line: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> bool:
        """Forward one request; True when the downstream connection can carry another one."""
        down = conn.down
        try:
            up_r, up_w = await asyncio.open_connection(backend.host, backend.port, limit=1 << 20)
        except OSError:
            self.stats.upstream_errors += 1
            down.write(_simple(502, b"replica unreachable"))
            await down.drain()
            return True
        conn.up = up_w
        try:
            out = [request_line]
            out += [k + b": " + v for k, v in headers if k not in _HOP and k != b"content-length"]
            out += [b"connection: close", b"content-length: " + str(len(body)).encode()]
            up_w.write(b"\r\n".join(out) + b"\r\n\r\n" + body)
            await up_w.drain()
            status_line, rheaders = _parse_head(await up_r.readuntil(b"\r\n\r\n"))
            status = int(status_line.split(b" ", 2)[1])
            chunked = b"chunked" in (_header(rheaders, b"transfer-encoding") or "").encode()
            length = _header(rheaders, b"content-length")
            fwd = [status_line]
            fwd += [k + b": " + v for k, v in rheaders if k not in _HOP]
            fwd.append(BACKEND_HEADER.encode() + b": " + backend.name.encode())
            session = _header(rheaders, SESSION_HEADER)
            if self.policy == "sticky" and session is not None:
                self._sessions.setdefault(session, backend)
            if chunked:
                fwd.append(b"transfer-encoding: chunked")
            down.write(b"\r\n".join(fwd) + b"\r\n\r\n")
            await down.drain()
            if status in (204, 304) or 100 <= status < 200:
                return True
            if chunked:
                while True:
                    size_line = await up_r.readline()
                    size = int(size_line.split(b";")[0].strip() or b"x", 16)
                    if size == 0:
                        await up_r.readuntil(b"\r\n")
                        down.write(b"0\r\n\r\n")
                        await down.drain()
                        return True
                    down.write(size_line + await up_r.readexactly(size + 2))
                    await down.drain()
            if length is not None:
                left = int(length)
                while left > 0:
                    data = await up_r.read(min(left, 65536))
                    if not data:
                        raise ConnectionError("replica closed mid-body")
                    down.write(data)
                    left -= len(data)
                await down.drain()
                return True
            while data := await up_r.read(65536):  # close-delimited: so is downstream
                down.write(data)
                await down.drain()
            return False
        except (
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ):
            # The replica went away (or we cut it) mid-response: the client must see a broken
            # connection, never a response that looks complete.
            down.transport.abort()
            return False
        finally:
            conn.up = None
            up_w.transport.abort()


def _parse_head(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    lines = head[:-4].split(b"\r\n")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError(f"malformed header line {line!r}")
        headers.append((name.strip().lower(), value.strip()))
    return lines[0], headers


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    for k, v in headers:
        if k == name:
            return v.decode("latin-1")
    return None


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[bytes, bytes]]) -> bytes:
    te = _header(headers, b"transfer-encoding")
    if te is not None and "chunked" in te.lower():
        parts: list[bytes] = []
        while True:
            size = int((await reader.readline()).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append((await reader.readexactly(size + 2))[:-2])
    length = _header(headers, b"content-length")
    return await reader.readexactly(int(length)) if length else b""


def _simple(status: int, text: bytes) -> bytes:
    reason = {502: b"Bad Gateway", 503: b"Service Unavailable"}.get(status, b"Error")
    return b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        reason,
        len(text),
        text,
    )
