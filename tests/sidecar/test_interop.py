"""The interop checks the library passes, passed by servers nobody here wrote, behind the sidecar.

Each upstream (:mod:`tests.sidecar.upstreams`: TypeScript SDK with and without its example
store, Go SDK, unwrapped Python SDK) runs as a real process with ``mcp-epoch proxy`` in front of
it, and a raw client speaks 2025-11-25 to the sidecar with exact control over cursors: a
dropped stream resumes exactly, a cursor of another process or of another session is
rejected with its reason, an evicted one is a ``gap``, and 2026-07-28 requests pass as they
are. The SDK clients of three languages then make calls through it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from epochsvc.demo.checker import Token
from tests.clients.probes import probe_calls
from tests.replica.conftest import Sse, parse_sse
from tests.sidecar.upstreams import KINDS, Proc, Sidecar, start_sidecar, start_upstream

PROTOCOL = "2025-11-25"


@pytest.fixture(scope="module", params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def fronted(kind: str) -> Iterator[tuple[Proc, Sidecar]]:
    up = start_upstream(kind)
    sidecar = start_sidecar(up.port)
    yield up, sidecar
    sidecar.stop()
    up.stop()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(20.0)) as client:
        yield client


class Session:
    """One session spoken by hand, to the sidecar (2025-11-25 unless told)."""

    def __init__(self, url: str, http: httpx.Client, protocol: str = PROTOCOL) -> None:
        self.url = url
        self.http = http
        self.protocol = protocol
        self.id: str | None = None
        self.next_id = 1
        self.raw: list[str] = []  # the last call's stream, line by line

    def headers(self, **extra: str) -> dict[str, str]:
        h = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": self.protocol,
        }
        if self.id:
            h["mcp-session-id"] = self.id
        h.update({k.replace("_", "-"): v for k, v in extra.items()})
        return h

    def body(self, method: str, params: dict[str, Any], rid: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        if not method.startswith("notifications/"):
            out["id"] = self.next_id if rid is None else rid
            self.next_id += 1
        return out

    def initialize(self) -> Session:
        params = {
            "protocolVersion": self.protocol,
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "raw", "version": "0"},
        }
        r = self.http.post(self.url, json=self.body("initialize", params), headers=self.headers())
        assert r.status_code == 200, r.text
        self.id = r.headers["mcp-session-id"]
        r = self.http.post(
            self.url, json=self.body("notifications/initialized", {}), headers=self.headers()
        )
        assert r.status_code == 202, r.text
        return self

    def work(self, steps: int, interval: float, *, drop_after: int = 0, **more: int) -> list[Sse]:
        """Call ``work``; read the stream to its end, or drop it after ``drop_after``
        progress notifications (the client's connection closes mid-stream)."""
        rid = self.next_id
        args = {"uid": "raw", "call": f"c{rid}", "steps": steps, "interval": interval, **more}
        params = {"name": "work", "arguments": args, "_meta": {"progressToken": f"tok-{rid}"}}
        lines: list[str] = []
        with self.http.stream(
            "POST", self.url, json=self.body("tools/call", params), headers=self.headers()
        ) as r:
            assert r.status_code == 200, r.read()
            seen = 0
            for line in r.iter_lines():
                lines.append(line)
                if line.startswith("data:") and "notifications/progress" in line:
                    seen += 1
                    if drop_after and seen >= drop_after:
                        break
        self.raw = lines
        return parse_sse(lines)

    def resume(self, cursor: str) -> tuple[httpx.Response, list[Sse]]:
        headers = self.headers(last_event_id=cursor)
        headers["accept"] = "text/event-stream"
        with self.http.stream("GET", self.url, headers=headers) as r:
            lines: list[str] = []
            if r.status_code == 200:
                lines = list(r.iter_lines())
            else:
                r.read()
        return r, parse_sse(lines)


def progress_of(events: list[Sse]) -> list[float]:
    return [
        e.message["params"]["progress"]
        for e in events
        if e.message and e.message.get("method") == "notifications/progress"
    ]


def last_id(events: list[Sse]) -> str:
    return [e.id for e in events if e.id][-1]


def result_text(events: list[Sse]) -> str:
    message = events[-1].message
    assert message is not None and "result" in message, events[-1]
    return str(message["result"]["content"][0]["text"])


def test_a_dropped_stream_resumes_exactly_from_the_sidecars_buffer(
    fronted: tuple[Proc, Sidecar], http: httpx.Client
) -> None:
    _, sidecar = fronted
    s = Session(sidecar.url, http).initialize()
    first = s.work(12, 0.05, drop_after=3)
    assert progress_of(first) == [1, 2, 3]
    cursor = last_id(first)
    epoch, _, seq = cursor.rpartition(":")
    assert epoch and seq.isdigit(), cursor  # the sidecar's ID, not the upstream's
    # The client left; the upstream's stream was read on. The resumption gets exactly the rest.
    r, rest = s.resume(cursor)
    assert r.status_code == 200
    assert progress_of(rest) == list(range(4, 13))
    token = Token.parse(result_text(rest))
    assert token is not None and token.kind == "done" and token.n == 12
    assert all(e.id and e.id.startswith(epoch + ":") for e in rest)


def test_priming_only_for_clients_that_parse_it_and_retry_for_every_client(
    fronted: tuple[Proc, Sidecar], http: httpx.Client
) -> None:
    """A 2025-11-25 client's stream opens with a priming event (an ID, empty data, the
    sidecar's ``retry``); a 2025-06-18 client, which cannot parse an empty event, gets none,
    and the ``retry`` rides on its first real event instead."""
    _, sidecar = fronted
    new = Session(sidecar.url, http).initialize()
    new.work(2, 0.0)
    assert new.raw[:3] == [new.raw[0], "retry: 100", "data: "], new.raw[:4]
    assert new.raw[0].startswith("id: ")
    old = Session(sidecar.url, http, "2025-06-18").initialize()
    events = old.work(2, 0.0)
    assert all(e.data for e in events)  # no empty event
    assert "retry: 100" in old.raw[: old.raw.index("")]  # on the first event


def test_a_cursor_of_another_process_is_rejected(
    fronted: tuple[Proc, Sidecar], http: httpx.Client
) -> None:
    up, sidecar = fronted
    other = start_sidecar(up.port)
    try:
        a = Session(other.url, http).initialize()
        foreign = last_id(a.work(2, 0.01))
    finally:
        other.stop()
    s = Session(sidecar.url, http).initialize()
    r, events = s.resume(foreign)
    assert r.status_code == 404 and events == []
    # Both sidecars fell back (no epoch service): the ledger issued neither epoch.
    assert r.headers["mcp-resumption-rejected"] == "unknown"
    assert r.json()["error"]["data"]["reason"] == "unknown"


def test_a_cursor_of_another_session_is_rejected(
    fronted: tuple[Proc, Sidecar], http: httpx.Client
) -> None:
    _, sidecar = fronted
    a = Session(sidecar.url, http).initialize()
    b = Session(sidecar.url, http).initialize()
    ea = a.work(6, 0.02, drop_after=2)
    r, events = b.resume(last_id(ea))
    assert r.status_code == 404 and events == []
    assert "mcp-resumption-rejected" in r.headers
    # A still gets its own rest.
    r, rest = a.resume(last_id(ea))
    assert r.status_code == 200 and progress_of(rest) == [3, 4, 5, 6]


def test_2026_07_28_requests_pass_as_they_are(
    fronted: tuple[Proc, Sidecar], http: httpx.Client
) -> None:
    """The same 2026-07-28 request, straight to the upstream and through the sidecar, gets the
    same answer (a server that does not speak that revision refuses it the same way), with no
    event ID of the sidecar's in it, and a malformed cursor is not the sidecar's business."""
    up, sidecar = fronted
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "hi"}},
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "echo",
        "last-event-id": "garbage",
    }
    direct = http.post(f"http://127.0.0.1:{up.port}/mcp", json=body, headers=headers)
    through = http.post(sidecar.url, json=body, headers=headers)
    assert through.status_code == direct.status_code
    assert "mcp-resumption-rejected" not in through.headers
    assert _messages(through) == _messages(direct)
    assert "id:" not in through.text or through.text.count("id:") == direct.text.count("id:")


def _messages(r: httpx.Response) -> list[Any]:
    """The JSON-RPC messages of an answer, JSON or SSE."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        return [e.message for e in parse_sse(r.text.splitlines()) if e.message]
    try:
        return [r.json()]
    except ValueError:
        return [r.text]


def test_an_evicted_cursor_is_a_gap(kind: str, tmp_path: Path, http: httpx.Client) -> None:
    up = start_upstream(kind)
    sidecar = start_sidecar(up.port, {"MCP_RESUME_BUFFER_EVENTS": "8"})
    try:
        s = Session(sidecar.url, http).initialize()
        cursor = last_id(s.work(4, 0.01, drop_after=1))
        s.work(12, 0.0)  # the session's next call pushes the first one's events out
        r, events = s.resume(cursor)
        assert r.status_code == 404 and events == []
        assert r.headers["mcp-resumption-rejected"] == "gap"
    finally:
        sidecar.stop()
        up.stop()


def test_an_upstream_that_closes_its_stream_is_resumed_from_its_own_cursor(
    http: httpx.Client,
) -> None:
    """The TypeScript server with its example store closes a call's stream every 2 steps
    (SEP-1699 polling). The sidecar resumes it from the upstream's own cursor, as a client of
    it would; its own client sees one unbroken stream."""
    up = start_upstream("ts-example-store")
    sidecar = start_sidecar(up.port)
    try:
        s = Session(sidecar.url, http).initialize()
        events = s.work(8, 0.02, close_every=2)
        assert progress_of(events) == list(range(1, 9))
        token = Token.parse(result_text(events))
        assert token is not None and token.kind == "done" and token.n == 8
        assert sidecar.metric("mcp_epoch_upstream_lost_calls_total") == 0
    finally:
        sidecar.stop()
        up.stop()


def test_the_sdk_clients_of_three_languages_call_through_the_sidecar(
    fronted: tuple[Proc, Sidecar],
) -> None:
    """The TypeScript and Go SDK clients (their probes: calls with progress, back to back,
    until their stdin closes) and the Python SDK client (an elicitation answered mid-call),
    all through the sidecar at once."""
    _, sidecar = fronted
    pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    procs = {
        "ts": subprocess.Popen(probe_calls("ts", sidecar.url, 5), **pipes),
        "go": subprocess.Popen(probe_calls("go", sidecar.url, 5), **pipes),
    }
    token = anyio.run(_python_client_call, sidecar.url)
    assert (token.uid, token.call, token.kind, token.n) == ("py", "e1", "done", 4)
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=60)  # closes stdin: one more call, then the report
        assert proc.returncode == 0, name
        calls = json.loads(out.strip().splitlines()[-1])["calls"]
        assert calls and all(c["ok"] and c["progress"] == 5 for c in calls), (name, calls)


async def _python_client_call(url: str) -> Token:
    from mcp.client.session import ClientRequestContext
    from mcp_types import ElicitRequestParams, ElicitResult

    async def elicit(_ctx: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="accept", content={"token": params.message})

    async with Client(url, mode="legacy", elicitation_callback=elicit) as client:
        args = {"uid": "py", "call": "e1", "steps": 4, "interval": 0.01, "ask_every": 2}
        result = await client.call_tool("work", args)
    token = Token.parse(result.content[0].text)  # type: ignore[union-attr]
    assert token is not None, result
    return token
