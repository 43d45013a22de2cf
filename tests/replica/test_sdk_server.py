"""Real example-server processes on loopback, spoken to over HTTP."""

from __future__ import annotations

from typing import Any

import httpx

from tests.replica.conftest import RawSession, ServerProc, progress_of


def test_resume_same_process_replays_exactly_the_missed_events(
    server: ServerProc, http: httpx.Client
) -> None:
    s = RawSession(server.url, http).initialize()
    first = s.countdown(10, close_after=3, delay=0.02)
    seen = progress_of(first)
    # The SDK closes the stream asynchronously: 1..3 notifications made it out before it.
    assert seen == list(range(1, len(seen) + 1)) and 1 <= len(seen) <= 3
    cursor = [e.id for e in first if e.id][-1]
    assert cursor.startswith(server.epoch + ":")
    # Resume at once, while the tool is still running: the resumed stream carries the events
    # missed so far and then every later one, up to the response.
    r, replay = s.resume(cursor)
    assert r.status_code == 200
    # Exactly the missing suffix: no loss, no duplicate, in order.
    assert progress_of(replay) == list(range(len(seen) + 1, 11))
    last = replay[-1].message
    assert last is not None and last["result"]["content"][0]["text"] == "done 10"
    ids = [int(e.id.rsplit(":", 1)[1]) for e in replay if e.id and e.data]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # Resuming from the middle of the replay gives exactly the rest.
    mid = next(e.id for e in replay if e.data and progress_of([e]) == [7])
    assert mid is not None
    r2, rest = s.resume(mid)
    assert r2.status_code == 200 and progress_of(rest) == [8, 9, 10]


def test_evicted_continuation_is_a_gap(server_factory: Any, http: httpx.Client) -> None:
    srv = server_factory({"MCP_RESUME_BUFFER_EVENTS": "8"})
    s = RawSession(srv.url, http).initialize()
    first = s.countdown(30, close_after=2, delay=0.005)
    cursor = [e.id for e in first if e.id][-1]
    # A second call read to its end puts 10 events after the cursor into the 8-event buffer,
    # however far the first call has got: the cursor's continuation is evicted.
    assert len(progress_of(s.countdown(10, delay=0))) == 10
    r, events = s.resume(cursor)
    assert r.status_code == 404
    assert r.headers["mcp-resumption-rejected"] == "gap"
    assert r.json()["error"]["data"]["reason"] == "gap"
    assert events == []


def test_cursor_from_another_process_is_rejected_with_reason(
    server: ServerProc, server_factory: Any, http: httpx.Client
) -> None:
    a = RawSession(server.url, http).initialize()
    first = a.countdown(3, close_after=1)
    cursor = [e.id for e in first if e.id][-1]
    other = server_factory()
    b = RawSession(other.url, http).initialize()
    r, events = b.resume(cursor)
    assert r.status_code == 404 and events == []
    # Both processes fell back (no epoch service): the ledger never issued either epoch.
    assert r.headers["mcp-resumption-rejected"] == "unknown"
    body = r.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["data"]["reason"] == "unknown"


def test_session_a_never_receives_session_b_events(server: ServerProc, http: httpx.Client) -> None:
    a = RawSession(server.url, http).initialize()
    b = RawSession(server.url, http).initialize()
    # Same JSON-RPC request id in both sessions: the SDK names both streams "7".
    ea = a.countdown(6, close_after=1, delay=0.02, request_id=7)
    eb = b.countdown(4, close_after=1, delay=0.02, request_id=7)
    ca = [e.id for e in ea if e.id][-1]
    cb = [e.id for e in eb if e.id][-1]
    # B presenting A's cursor in B's session: rejected, nothing of A's is sent.
    r, events = b.resume(ca)
    assert r.status_code == 404 and events == []
    assert r.headers["mcp-resumption-rejected"] == "unknown"
    # Each resumes its own stream and gets only its own progress tokens.
    ra, eva = a.resume(ca)
    rb, evb = b.resume(cb)
    assert ra.status_code == rb.status_code == 200
    pa, pb = progress_of(ea), progress_of(eb)
    assert pa + progress_of(eva) == [1, 2, 3, 4, 5, 6]
    assert pb + progress_of(evb) == [1, 2, 3, 4]
    toks_a = {
        e.message["params"]["progressToken"] for e in eva if e.message and "params" in e.message
    }
    toks_b = {
        e.message["params"]["progressToken"] for e in evb if e.message and "params" in e.message
    }
    assert toks_a == {"tok-7"} and toks_b == {"tok-7"}
    assert eva[-1].message and eva[-1].message["result"]["content"][0]["text"] == "done 6"
    assert evb[-1].message and evb[-1].message["result"]["content"][0]["text"] == "done 4"


def test_malformed_cursor_gets_400(server: ServerProc, http: httpx.Client) -> None:
    s = RawSession(server.url, http).initialize()
    for bad in [
        "nope",
        f"{server.epoch}:0",
        f"{server.epoch}:01",
        f"{server.epoch}: 1",
        f"{server.epoch}:-1",
        "x" * 500,
        f"{server.epoch}",
    ]:
        r, events = s.resume(bad)
        assert r.status_code == 400, bad
        body = r.json()
        assert body["jsonrpc"] == "2.0" and "Last-Event-ID" in body["error"]["message"]
        assert events == []


def test_unknown_seq_of_own_epoch_is_rejected_not_an_empty_200(
    server: ServerProc, http: httpx.Client
) -> None:
    s = RawSession(server.url, http).initialize()
    r, _ = s.resume(f"{server.epoch}:999999999")
    assert r.status_code == 404 and r.headers["mcp-resumption-rejected"] == "unknown"


def test_2026_07_28_requests_pass_untouched(server: ServerProc, http: httpx.Client) -> None:
    # A malformed cursor would be a 400 from the guard; in the 2026 era the SDK owns the request.
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "last-event-id": "garbage",
    }
    r = http.get(server.url, headers=headers)
    assert "mcp-resumption-rejected" not in r.headers
    assert r.status_code != 400 or "Last-Event-ID" not in r.text
