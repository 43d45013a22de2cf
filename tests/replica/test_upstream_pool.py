"""The sidecar's kept-alive connections to the server beside it (``upstream.Pool``).

A real asyncio HTTP/1.1 server on loopback counts the connections it accepts and can close an
idle one, as a server whose keep-alive timeout ran out does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from mcp_epoch._internal import upstream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class KeepAliveServer:
    """Answers every request ``200 ok`` with a length, keeping the connection open."""

    def __init__(self) -> None:
        self.accepted = 0
        self.writers: list[asyncio.StreamWriter] = []
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
async def server() -> AsyncIterator[KeepAliveServer]:
    srv = KeepAliveServer()
    listener = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    srv.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield srv


async def _get(srv: KeepAliveServer, pool: upstream.Pool) -> bytes:
    answer = await upstream.exchange(
        f"127.0.0.1:{srv.port}",
        "POST",
        b"/mcp",
        [(b"host", b"x")],
        b"{}",
        connect_timeout=2,
        write_timeout=2,
        pool=pool,
    )
    body = await answer.read(1 << 20)
    answer.close()
    answer.close()  # a second close must not give the connection back twice
    return body


async def test_an_answer_read_to_its_end_leaves_its_connection_for_the_next(
    server: KeepAliveServer,
) -> None:
    pool = upstream.Pool(f"127.0.0.1:{server.port}")
    assert [await _get(server, pool) for _ in range(5)] == [b"ok"] * 5
    assert server.accepted == 1
    # Two at once need two connections (one was never handed out twice).
    assert await asyncio.gather(_get(server, pool), _get(server, pool)) == [b"ok", b"ok"]
    assert server.accepted == 2
    pool.close()


async def test_a_connection_the_server_closed_is_not_reused(server: KeepAliveServer) -> None:
    pool = upstream.Pool(f"127.0.0.1:{server.port}")
    assert await _get(server, pool) == b"ok"
    server.writers[0].close()  # its keep-alive timeout ran out
    await server.writers[0].wait_closed()
    assert await _get(server, pool) == b"ok"
    assert server.accepted == 2
    pool.close()


async def test_a_connection_idle_too_long_is_not_reused(
    server: KeepAliveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = upstream.Pool(f"127.0.0.1:{server.port}")
    monkeypatch.setattr(upstream.Pool, "IDLE_SECONDS", 0.0)  # every connection is too old
    assert await _get(server, pool) == b"ok"
    assert await _get(server, pool) == b"ok"
    assert server.accepted == 2
    pool.close()


def test_a_request_head_is_written_as_received_with_its_framing() -> None:
    head = upstream.request_head("POST", b"/mcp?x=1", [(b"host", b"a:1"), (b"x-a", b"b")], 7)
    assert head == (
        b"POST /mcp?x=1 HTTP/1.1\r\nhost: a:1\r\nx-a: b\r\n"
        b"content-length: 7\r\nconnection: close\r\n\r\n"
    )
    kept = upstream.request_head("GET", b"/", [], 0, keep=True)
    assert kept == b"GET / HTTP/1.1\r\ncontent-length: 0\r\nconnection: keep-alive\r\n\r\n"


@pytest.mark.parametrize(
    "header",
    [
        (b"x-a", b"b\r\nx-smuggled: 1"),
        (b"x-a", b"b\nx-smuggled: 1"),
        (b"x-a", b"b\r"),
        (b"x-a\r\nx-b", b"c"),
        (b"x-a: b\r\nx-b", b"c"),
        (b"x:a", b"b"),
    ],
)
def test_a_header_that_would_break_the_framing_is_never_sent(header: tuple[bytes, bytes]) -> None:
    with pytest.raises(upstream.Refused, match="cannot be sent"):
        upstream.request_head("POST", b"/mcp", [(b"host", b"a"), header], 0)
