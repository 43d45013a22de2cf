"""EpochClient under real connection faults, made by a loopback proxy the test controls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import pytest

from mcp_epoch import EpochClient
from tests.replica.inprocess import running

pytestmark = pytest.mark.anyio


class CutAfterAnswer:
    """A TCP proxy that, once, delivers a client's answer to the server and then cuts the
    connection before the server's ``202 Accepted`` gets back: the answer arrived, the client
    cannot know it."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.cuts = 0
        self.answers = 0
        self.answered_again = asyncio.Event()
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/mcp"

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _serve(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        head = await down_r.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await down_r.readexactly(length) if length else b""
        up_w.write(head + body)
        await up_w.drain()
        answer = b'"result"' in body and b'"method"' not in body
        self.answers += answer
        if self.answers == 2:
            self.answered_again.set()
        if answer and self.cuts == 0:
            self.cuts += 1
            await up_r.readuntil(b"\r\n\r\n")  # the server took the answer and said 202
            down_w.transport.abort()
            up_w.close()
            return
        await asyncio.gather(self._pipe(up_r, down_w), self._pipe(down_r, up_w))

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[CutAfterAnswer]:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        try:
            yield self
        finally:
            self.server.close()


async def test_an_answer_whose_acknowledgement_is_lost_is_sent_again() -> None:
    # The SDK client writes answers one at a time, and a POST that fails kills its writer and
    # with it the session's read side: the call's own stream then receives the result and
    # cannot deliver it (a hung call). The tool here finishes only after the answer was sent
    # again, so the result cannot slip through before the writer dies.
    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"text": "yes"})

    with running() as server:
        port = int(server.url.rsplit(":", 1)[1].split("/")[0])
        proxy = CutAfterAnswer(port)
        async with (
            proxy.serving(),
            EpochClient(proxy.url, elicitation_callback=on_elicit) as client,
            asyncio.TaskGroup() as tg,
        ):
            call = tg.create_task(client.call_tool("asking", {"question": "go?", "gate": "a"}))
            async with asyncio.timeout(10):
                await proxy.answered_again.wait()
            server.gates["a"].allow(1)
            async with asyncio.timeout(10):
                result = await call
            assert proxy.cuts == 1
            assert result.content[0].text == "got yes"  # type: ignore[union-attr]
            assert client.session_number == 1  # the same session carried on
