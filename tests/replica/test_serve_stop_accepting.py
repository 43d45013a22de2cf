"""``DrainingServer`` stopping to accept, on a real uvicorn server on loopback: a connection
that never began a request is reset, so a peer whose forwarded request was on its way learns
it was never read; a connection that was answered is closed cleanly, so its answer is kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
import uvicorn

from mcp_epoch._internal.app import EpochSafeApp
from mcp_epoch._internal.serve import DrainingServer

pytestmark = pytest.mark.anyio
ANSWER = b"answered"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    length = [(b"content-length", str(len(ANSWER)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": length})
    await send({"type": "http.response.body", "body": ANSWER})


class Connections(set[Any]):
    """uvicorn's set of open connections, telling a waiter when it changes."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    def add(self, item: Any) -> None:
        super().add(item)
        self.changed.set()

    def discard(self, item: Any) -> None:
        super().discard(item)
        self.changed.set()

    async def until(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self) != count:
                self.changed.clear()
                await self.changed.wait()


def _connections(server: DrainingServer) -> Connections:
    return cast(Connections, server.server_state.connections)


@pytest.fixture
async def server() -> AsyncIterator[DrainingServer]:
    config = uvicorn.Config(_app, host="127.0.0.1", port=0, lifespan="off", log_level="error")
    # _stop_accepting never touches the app it drains.
    config.load()
    running = DrainingServer(config, cast(EpochSafeApp, None))
    running.lifespan = config.lifespan_class(config)
    running.server_state.connections = Connections()
    await running.startup()  # serving on this loop, without uvicorn's signal handlers
    yield running
    await running.shutdown()


async def test_a_connection_with_no_request_yet_is_reset_and_an_answered_one_closed(
    server: DrainingServer,
) -> None:
    port = server.servers[0].sockets[0].getsockname()[1]
    answered_r, answered_w = await asyncio.open_connection("127.0.0.1", port)
    answered_w.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await answered_r.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
    assert await answered_r.readexactly(len(ANSWER)) == ANSWER  # kept alive, now idle
    fresh_r, fresh_w = await asyncio.open_connection("127.0.0.1", port)
    await _connections(server).until(2)  # both taken by uvicorn

    server._stop_accepting()
    await _connections(server).until(0)  # both closed on its side before the request goes

    with pytest.raises(ConnectionResetError):
        fresh_w.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await fresh_w.drain()
        await fresh_r.read()
    assert await answered_r.read() == b""  # a clean close after its answer
    for writer in (fresh_w, answered_w):
        writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)  # the listener is closed
