"""The real SDK server on loopback, in the windows where its own live delivery loses a stream.

The server runs in a thread of this process so that the test can hold its tool at a gate; the
interleavings come from what the client holds open, never from timing.

* **Stale registration** (the hung call): a client's SSE connection dies while the server has
  not yet noticed, and the client resumes on a new one. The SDK still holds the old stream for
  that request id, so it does not register the resumed one for live delivery: a store that
  only replays ends the resumed stream at once and the rest of the call reaches nobody.
* **Eviction overtaking a resumed stream**: the connection is aborted, never ended cleanly,
  and the next resumption from the same cursor is told ``gap``.
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
import pytest
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from epochsvc.replica import EpochEventStore, ResumptionGuard
from epochsvc.tokens import PodEpoch, ProcessEpoch
from tests.replica.conftest import PROTOCOL, Sse, parse_sse


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


def build(gates: dict[str, Gate], capacity: int) -> tuple[Any, EpochEventStore]:
    mcp = MCPServer("windows")

    @mcp.tool()
    async def gated(name: str, steps: int, ctx: Context = None) -> str:  # type: ignore[assignment]
        for n in range(1, steps + 1):
            await anyio.to_thread.run_sync(gates[name].wait, n)
            await ctx.report_progress(n, steps, f"{name} {n}")
        await anyio.to_thread.run_sync(gates[name].wait, steps + 1)
        return f"{name} done"

    store = EpochEventStore(ProcessEpoch(PodEpoch("9f2c1a7e", 7), 0), capacity=capacity)
    return ResumptionGuard(mcp.streamable_http_app(event_store=store), store), store


@contextmanager
def running(capacity: int) -> Iterator[Server]:
    """The gated server on a loopback port, in a thread of this process."""
    gates = {name: Gate() for name in ("a", "b")}
    app, store = build(gates, capacity)
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


@pytest.fixture
def server() -> Iterator[Server]:
    with running(capacity=64) as srv:
        yield srv


def test_resume_while_the_old_connection_is_still_held_gets_the_whole_rest(
    server: Server,
) -> None:
    s = Session(server.url)
    gate = server.gates["a"]
    gate.allow(1)
    post = s.call("a", 3, rid=5)
    first = post.read(1)
    assert texts(first) == ["a 1"]
    # The old connection stays open, unread: to the server it is the live stream of id 5.
    resumed = s.resume(first[-1].id or "")
    assert resumed.status_code == 200
    gate.allow(4)  # the rest of the call, after the resumption was admitted
    rest = resumed.read(3)
    assert texts(rest) == ["a 2", "a 3", "a done"]
    resumed.close()
    post.close()


def test_a_resumed_stream_overtaken_by_eviction_is_aborted_then_told_gap() -> None:
    with running(capacity=6) as server:
        a, b = Session(server.url), Session(server.url)
        server.gates["a"].allow(1)
        post = a.call("a", 3, rid=1)
        cursor = post.read(1)[-1].id or ""
        post.close()
        resumed = a.resume(cursor)
        assert resumed.status_code == 200
        # Another session fills the ring past the cursor while "a" is quiet.
        server.gates["b"].allow(20)
        other = b.call("b", 19, rid=1)
        assert texts(other.read(20))[-1] == "b done"
        server.gates["a"].allow(4)  # "a" goes on: its follower finds its position evicted
        with pytest.raises(httpx.RemoteProtocolError):
            resumed.read(3)
        again = a.resume(cursor)
        again.response.read()
        assert again.status_code == 404
        assert again.headers["mcp-resumption-rejected"] == "gap"
