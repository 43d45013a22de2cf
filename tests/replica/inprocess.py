"""The real SDK server in a thread of the test process, its tool held at a gate by the test.

Shared by the tests that need an interleaving forced from outside (what a client holds open,
when the tool may go on), never by timing.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

from mcp_epoch._internal.guard import ResumptionGuard
from mcp_epoch._internal.store import EpochEventStore
from mcp_epoch.contract import PodEpoch, ProcessEpoch
from tests.replica.conftest import PROTOCOL, Sse, parse_sse

EPOCH = ProcessEpoch(PodEpoch("9f2c1a7e", 7), 0)


class Reply(BaseModel):
    text: str


class Gate:
    """How many steps the tool may take; the test thread opens it, the tool waits on it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._allowed = 0

    def allow(self, upto: int) -> None:
        with self._cond:
            self._allowed = max(self._allowed, upto)
            self._cond.notify_all()

    def wait(self, n: int) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._allowed >= n, timeout=30):
                raise TimeoutError(f"step {n} was never allowed")


@dataclass
class Server:
    url: str
    gates: dict[str, Gate]
    store: EpochEventStore


def build(
    gates: dict[str, Gate], capacity: int, store_cls: type[EpochEventStore] = EpochEventStore
) -> tuple[Any, EpochEventStore]:
    mcp = MCPServer("windows")

    @mcp.tool()
    async def gated(name: str, steps: int, ctx: Context = None) -> str:  # type: ignore[assignment]
        for n in range(1, steps + 1):
            await anyio.to_thread.run_sync(gates[name].wait, n)
            await ctx.report_progress(n, steps, f"{name} {n}")
        await anyio.to_thread.run_sync(gates[name].wait, steps + 1)
        return f"{name} done"

    @mcp.tool()
    async def asking(question: str, gate: str, ctx: Context = None) -> str:  # type: ignore[assignment]
        """Ask the client once (an elicitation the tool awaits); answer with its reply once
        the gate allows step 1."""
        result = await ctx.elicit(question, Reply)
        await anyio.to_thread.run_sync(gates[gate].wait, 1)
        data = getattr(result, "data", None)
        return f"got {data.text}" if isinstance(data, Reply) else f"no answer: {result!r}"

    store = store_cls(EPOCH, capacity=capacity)
    return ResumptionGuard(mcp.streamable_http_app(event_store=store), store), store


@contextmanager
def running(
    capacity: int = 64, store_cls: type[EpochEventStore] = EpochEventStore
) -> Iterator[Server]:
    """The gated server on a loopback port, in a thread of this process."""
    gates = {name: Gate() for name in ("a", "b")}
    app, store = build(gates, capacity, store_cls)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(app, log_level="critical", lifespan="on", timeout_graceful_shutdown=1)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:  # the socket listens already: a client's connect waits in its backlog, no polling
        yield Server(f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", gates, store)
    finally:
        for gate in gates.values():
            gate.allow(10_000)
        srv.should_exit = True
        thread.join(10)


class Session:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(timeout=httpx.Timeout(10.0))
        self.sid = ""
        params = {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        }
        r = self.http.post(url, json=self.body("initialize", params, 0), headers=self.headers())
        assert r.status_code == 200, r.text
        self.sid = r.headers["mcp-session-id"]
        body = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        self.http.post(url, json=body, headers=self.headers())

    @staticmethod
    def body(method: str, params: dict[str, Any], rid: int) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}

    def headers(self, **extra: str) -> dict[str, str]:
        h = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": PROTOCOL,
        }
        if self.sid:
            h["mcp-session-id"] = self.sid
        h.update(extra)
        return h

    def call(self, name: str, steps: int, rid: int) -> Stream:
        params = {
            "name": "gated",
            "arguments": {"name": name, "steps": steps},
            "_meta": {"progressToken": f"p{rid}"},
        }
        req = self.http.build_request(
            "POST", self.url, json=self.body("tools/call", params, rid), headers=self.headers()
        )
        return Stream(self.http.send(req, stream=True))

    def resume(self, cursor: str) -> Stream:
        h = self.headers(**{"last-event-id": cursor, "accept": "text/event-stream"})
        request = self.http.build_request("GET", self.url, headers=h)
        return Stream(self.http.send(request, stream=True))


class Stream:
    """An SSE response read a few events at a time, its connection held open in between.

    (Abandoning an ``iter_lines()`` generator would close the connection under it.)
    """

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status_code = response.status_code
        self.headers = response.headers
        self._lines = response.iter_lines()

    def read(self, until: int) -> list[Sse]:
        """The next ``until`` events with data (fewer if the stream ends first)."""
        lines: list[str] = []
        got = 0
        for line in self._lines:
            lines.append(line)
            if line.startswith("data:") and line[5:].strip():
                got += 1
            if line == "" and got >= until:
                break
        return [e for e in parse_sse(lines) if e.data]

    def close(self) -> None:
        self.response.close()


def texts(events: list[Sse]) -> list[str]:
    out = []
    for e in events:
        msg = json.loads(e.data)
        if msg.get("method") == "notifications/progress":
            out.append(msg["params"]["message"])
        elif "result" in msg:
            out.append(msg["result"]["content"][0]["text"])
    return out
