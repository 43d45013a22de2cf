"""Real processes on loopback: example MCP servers. The epoch service fixture is shared
(tests/conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "epoch_server.py"
PROTOCOL = "2025-11-25"


def wait_port(port: int, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {port}")


@dataclass
class ServerProc:
    proc: subprocess.Popen[str]
    port: int
    epoch: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_server(
    env: dict[str, str] | None = None, port: int | None = None, log: Path | None = None
) -> ServerProc:
    """Start the example server; its log (stderr) goes to ``log`` when given."""
    port = port or free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("MCP_")}
    full.update(env or {})
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(log.open("w")) if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--port", str(port)],
            env=full,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(5)
        raise RuntimeError(f"example server exited with {proc.returncode}")
    epoch = json.loads(line)["epoch"]
    wait_port(port, proc)
    return ServerProc(proc, port, epoch)


@pytest.fixture
def server_factory() -> Iterator[Any]:
    started: list[ServerProc] = []

    def make(env: dict[str, str] | None = None, port: int | None = None) -> ServerProc:
        srv = start_server(env, port)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProc]:
    srv = start_server()
    yield srv
    srv.stop()


# --- a minimal raw Streamable HTTP client: exact control over ids and cursors -------------


@dataclass
class Sse:
    id: str | None
    data: str

    @property
    def message(self) -> dict[str, Any] | None:
        return json.loads(self.data) if self.data else None


def parse_sse(lines: list[str]) -> list[Sse]:
    events: list[Sse] = []
    eid: str | None = None
    data: list[str] = []
    seen = False
    for line in [*lines, ""]:
        if line == "":
            if seen:
                events.append(Sse(eid, "\n".join(data)))
            eid, data, seen = None, [], False
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "id":
            eid, seen = value, True
        elif field == "data":
            data.append(value)
            seen = True
        elif field in ("event", "retry"):
            seen = True
    return events


class RawSession:
    """One MCP session spoken by hand (httpx), 2025-11-25 revision."""

    def __init__(self, url: str, client: httpx.Client) -> None:
        self.url = url
        self.http = client
        self.session_id: str | None = None
        self.next_id = 1

    def headers(self, **extra: str) -> dict[str, str]:
        h = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": PROTOCOL,
        }
        if self.session_id:
            h["mcp-session-id"] = self.session_id
        h.update({k.replace("_", "-"): v for k, v in extra.items()})
        return h

    def post(
        self, method: str, params: dict[str, Any] | None = None, request_id: int | None = None
    ) -> tuple[httpx.Response, list[Sse]]:
        body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            body["params"] = params
        if request_id is None and not method.startswith("notifications/"):
            request_id = self.next_id
            self.next_id += 1
        if request_id is not None:
            body["id"] = request_id
        with self.http.stream("POST", self.url, json=body, headers=self.headers()) as r:
            if r.status_code == 200 and r.headers.get("content-type", "").startswith(
                "text/event-stream"
            ):
                lines = list(r.iter_lines())
            else:
                lines = []
                r.read()
        return r, parse_sse(lines)

    def initialize(self) -> RawSession:
        params = {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        }
        r, _ = self.post("initialize", params)
        assert r.status_code == 200, r.text
        self.session_id = r.headers["mcp-session-id"]
        self.post("notifications/initialized")
        return self

    def countdown(
        self, n: int, *, close_after: int = 0, delay: float = 0.01, request_id: int | None = None
    ) -> list[Sse]:
        rid = request_id if request_id is not None else self.next_id
        self.next_id = max(self.next_id, rid + 1)
        params = {
            "name": "countdown",
            "arguments": {"n": n, "delay": delay, "close_after": close_after},
            "_meta": {"progressToken": f"tok-{rid}"},
        }
        r, events = self.post("tools/call", params, request_id=rid)
        assert r.status_code == 200, r.text
        return events

    def resume(self, cursor: str, **extra: str) -> tuple[httpx.Response, list[Sse]]:
        h = self.headers(last_event_id=cursor, **extra)
        h["accept"] = "text/event-stream"
        with self.http.stream("GET", self.url, headers=h) as r:
            lines: list[str] = []
            if r.status_code == 200:
                for line in r.iter_lines():
                    lines.append(line)
                    # The replay of a request stream ends with its response.
                    if line.startswith("data:") and '"result"' in line:
                        break
            if r.status_code != 200:
                r.read()
        return r, parse_sse(lines)


def progress_of(events: list[Sse]) -> list[float]:
    out = []
    for ev in events:
        msg = ev.message
        if msg and msg.get("method") == "notifications/progress":
            out.append(msg["params"]["progress"])
    return out


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(10.0)) as client:
        yield client


@pytest.fixture
def pair(epoch_service: Any, http: httpx.Client, tmp_path: Path) -> Iterator[tuple[Any, ...]]:
    """Two replicas of one server (``tests.replica.replicas``), each able to forward to the
    other."""
    from tests.replica.replicas import replicas

    with replicas(epoch_service, http, tmp_path, ("a", "b")) as (a, b):
        yield a, b
