"""The forwarder against an owner that closes an idle connection as a request arrives on it.

A draining owner closes its idle connections when it stops accepting, and a peer that reuses
a pooled connection at that very moment loses its request unanswered: it cannot tell that
from a crash, so the client gets a 502 for a request that never ran. Hitting that moment with
real processes is a matter of luck, so the owner here is a small loopback server that always
closes an already-used connection when the next request arrives on it. The last two tests
close a fresh connection under its request, unread (what a draining owner does, see
``test_serve_stop_accepting``) and after reading it (an owner that died running it).
"""

from __future__ import annotations

import asyncio
import select
import socket
from typing import Any

import anyio
import pytest

from mcp_epoch._internal.forward import Forwarder, OwnerLost, OwnerUnreachable, Route
from mcp_epoch.contract import ProcessEpoch

pytestmark = pytest.mark.anyio


OWNER = ProcessEpoch.parse("0123abcd-7.0")


class ClosesReusedConnections:
    """Answers the first request of every connection, closes on any later one."""

    def __init__(self) -> None:
        self.answered = 0
        self.closed_under_a_request = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                await _read_body(reader, head)
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            if not first:
                self.closed_under_a_request += 1
                writer.transport.abort()
                return
            first = False
            self.answered += 1
            body = b'{"jsonrpc":"2.0","id":1,"result":{}}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        writer.close()


async def _read_body(reader: asyncio.StreamReader, head: bytes) -> None:
    """Consume a request body: chunked (what the forwarder streams) or by Content-Length."""
    lines = head.lower().split(b"\r\n")
    if b"transfer-encoding: chunked" in lines:
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            await reader.readexactly(size + 2)
        await reader.readuntil(b"\r\n")
        return
    for line in lines:
        if line.startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":", 1)[1]))


async def _forward_one(forwarder: Forwarder, route: Route) -> tuple[int, bytes]:
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "headers": [(b"host", b"x"), (b"content-type", b"application/json")],
    }
    sent = [{"type": "http.request", "body": b'{"jsonrpc":"2.0","id":1,"method":"ping"}'}]
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if sent:
            return sent.pop()
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        out.append(dict(message))

    await forwarder.forward(scope, receive, send, route)
    status = next(m["status"] for m in out if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in out if m["type"] == "http.response.body")


async def test_every_forward_has_a_connection_of_its_own() -> None:
    owner = ClosesReusedConnections()
    server = await asyncio.start_server(owner._serve, "127.0.0.1", 0)
    route = Route(OWNER, f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    forwarder = Forwarder()
    try:
        for _ in range(3):
            status, body = await _forward_one(forwarder, route)
            assert status == 200 and b'"result"' in body
    finally:
        await forwarder.aclose()
        server.close()
    assert owner.answered == 3 and owner.closed_under_a_request == 0


class ClosesUnder:
    """A one-connection owner on a plain socket that closes once the request is in: with it
    unread (the kernel resets the connection) or after reading all of it (a clean close)."""

    def __init__(self, *, read_first: bool) -> None:
        self.read_first = read_first
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.route = Route(OWNER, f"127.0.0.1:{self.listener.getsockname()[1]}")

    def run(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            if self.read_first:
                request = b""
                while not request.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk
                    request += conn.recv(65536)
            else:
                select.select([conn], [], [])  # the request has arrived; leave it unread
        self.listener.close()


async def _forward_to(owner: ClosesUnder) -> BaseException:
    forwarder = Forwarder()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, owner.run)
            with pytest.raises((OwnerUnreachable, OwnerLost)) as raised:
                await _forward_one(forwarder, owner.route)
    finally:
        await forwarder.aclose()
    return raised.value


async def test_an_owner_that_resets_the_request_unread_did_not_take_it() -> None:
    """What a draining owner does to a request arriving as it stops accepting: the forwarder
    may then reject (the client re-initializes elsewhere) instead of answering 502."""
    error = await _forward_to(ClosesUnder(read_first=False))
    assert isinstance(error, OwnerUnreachable), error
    assert "reset the connection unread" in str(error)


async def test_an_owner_that_read_the_request_and_went_away_may_have_run_it() -> None:
    error = await _forward_to(ClosesUnder(read_first=True))
    assert isinstance(error, OwnerLost), error
    assert "RemoteProtocolError" in str(error)  # the client is told what happened
