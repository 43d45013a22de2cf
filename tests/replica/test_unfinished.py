"""uvicorn's "returned without completing response" ERROR, on a real uvicorn on loopback: gone
for a response ended unfinished on purpose, kept for any other (a bug), and counted rather
than logged once the drain has ended."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from mcp_epoch._internal.unfinished import MESSAGE, UNFINISHED, UnfinishedOnPurpose, install

pytestmark = pytest.mark.anyio


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Starts a chunked stream and returns without its last chunk; ``/on-purpose`` says so."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"event", "more_body": True})
    if scope["path"] == "/on-purpose":
        UNFINISHED.expect()


@pytest.fixture
async def port() -> AsyncIterator[int]:
    install()
    config = uvicorn.Config(_app, host="127.0.0.1", port=0, lifespan="off", log_config=None)
    server = uvicorn.Server(config)
    config.load()
    server.lifespan = config.lifespan_class(config)
    await server.startup()  # serving on this loop, without uvicorn's signal handlers
    yield server.servers[0].sockets[0].getsockname()[1]
    await server.shutdown()


async def _cut_stream(port: int, path: str) -> bytes:
    """Everything the server sent before it closed the connection. uvicorn logs the line
    before it closes, so once this returns the log has it or never will."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    async with asyncio.timeout(10):
        received = await reader.read()  # to the server's close
    writer.close()
    return received


def _unfinished_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "uvicorn.error" and r.msg == MESSAGE]


async def test_a_stream_cut_on_purpose_is_not_an_error_and_any_other_still_is(
    port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="uvicorn.error")
    received = await _cut_stream(port, "/on-purpose")
    assert b"event" in received and not received.endswith(b"0\r\n\r\n")  # no last chunk
    assert _unfinished_lines(caplog) == []

    received = await _cut_stream(port, "/bug")
    assert b"event" in received and not received.endswith(b"0\r\n\r\n")
    (line,) = _unfinished_lines(caplog)
    assert line.levelno == logging.ERROR

    await _cut_stream(port, "/on-purpose")  # what one task expected does not carry over
    await _cut_stream(port, "/bug")
    assert len(_unfinished_lines(caplog)) == 2


def _record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, msg, None, None)


def test_after_the_drain_every_unfinished_line_is_counted_until_the_server_stops() -> None:
    quiet = UnfinishedOnPurpose()
    assert quiet.filter(_record(MESSAGE))  # no drain yet: a bug is a bug
    quiet.exiting()
    assert not quiet.filter(_record(MESSAGE))
    assert not quiet.filter(_record(MESSAGE))
    assert quiet.filter(_record("Exception in ASGI application\n"))  # never dropped
    assert quiet.exited() == 2
    assert quiet.exited() == 0
    assert quiet.filter(_record(MESSAGE))  # a server started again logs as before
