"""Forwarding to the owner and graceful drain, between real server processes.

Two example servers (``examples/epoch_server.py``) share a real epoch service; each is bound in
the ledger with its loopback address as the operator binds a pod with its IP. A request sent
to the replica that does not own its session must reach the owner, streams included; a drained
owner must finish its calls, hand its sessions on and send new sessions to a live peer (the
handoff itself: ``test_handoff``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from mcp_epoch import api
from mcp_epoch.contract import FORWARDED_BY_HEADER, FORWARDED_TO_HEADER, REJECTED_HEADER
from tests.replica.conftest import RawSession, parse_sse, progress_of
from tests.replica.replicas import Replica, launch, slow_countdown, until
from tests.support.epochsvc_proc import EpochServiceProcess

#: What uvicorn logs at ERROR for a response an app ends without its last chunk.
UNFINISHED_LINE = "ASGI callable returned without completing response"


def test_every_request_of_a_session_reaches_its_owner(
    pair: tuple[Replica, Replica], http: httpx.Client
) -> None:
    a, b = pair
    s = RawSession(a.url, http).initialize()
    assert s.session_id is not None and s.session_id.startswith(a.srv.epoch + "_")
    # A whole call through B: its SSE response streams from A, exactly.
    s.url = b.url
    events = s.countdown(5, request_id=7)
    assert progress_of(events) == [1, 2, 3, 4, 5]
    assert all(e.id is None or e.id.startswith(a.srv.epoch + ":") for e in events)
    # A call whose stream A closes (polling), resumed through B from its cursor.
    s.url = a.url
    first = s.countdown(6, close_after=2, request_id=8)
    cursor = [e.id for e in first if e.id][-1]
    s.url = b.url
    r, rest = s.resume(cursor)
    assert r.status_code == 200 and r.headers[FORWARDED_BY_HEADER] == a.srv.epoch
    assert progress_of(first) + progress_of(rest) == [1, 2, 3, 4, 5, 6]
    # DELETE through B ends the session on A.
    d = http.delete(b.url, headers=s.headers())
    assert d.status_code == 200 and d.headers[FORWARDED_BY_HEADER] == a.srv.epoch
    s.url = a.url
    gone, _ = s.post("ping")
    assert gone.status_code == 404


def test_a_request_meant_for_another_process_is_refused(
    pair: tuple[Replica, Replica], http: httpx.Client
) -> None:
    a, b = pair
    s = RawSession(a.url, http).initialize()
    body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    wrong = http.post(a.url, json=body, headers={**s.headers(), FORWARDED_TO_HEADER: b.srv.epoch})
    assert wrong.status_code == 421
    right = http.post(a.url, json=body, headers={**s.headers(), FORWARDED_TO_HEADER: a.srv.epoch})
    assert right.status_code == 200
    # The owner sees the Host the client sent (as through any proxy), so its own checks hold:
    # the SDK's DNS-rebinding protection refuses a foreign Host with its own 421, which is the
    # owner's answer and reaches the client as such (not taken for "not the owner").
    evil = http.post(b.url, json=body, headers={**s.headers(), "host": "evil.example"})
    assert evil.status_code == 421 and evil.headers[FORWARDED_BY_HEADER] == a.srv.epoch
    # A forwarded request is never forwarded again (hop limit one): B refuses A's session.
    hop = http.post(b.url, json=body, headers={**s.headers(), FORWARDED_TO_HEADER: b.srv.epoch})
    assert hop.status_code == 404 and hop.headers[REJECTED_HEADER]


def test_a_session_whose_owner_is_gone_is_rejected_not_forwarded(
    pair: tuple[Replica, Replica], http: httpx.Client, epoch_service: EpochServiceProcess
) -> None:
    a, b = pair
    s = RawSession(a.url, http).initialize()
    a.srv.proc.kill()  # no drain: the process is simply gone
    a.srv.proc.wait(5)
    s.url = b.url
    r, _ = s.post("ping")
    assert r.status_code == 404 and r.headers[REJECTED_HEADER] == "retired"
    epoch_service.send(api.retire(a.pod_epoch))
    r, _ = s.post("ping")
    assert r.status_code == 404 and r.headers[REJECTED_HEADER] == "retired"


def test_a_draining_owner_finishes_its_calls_hands_the_session_on_and_exits(
    pair: tuple[Replica, Replica], http: httpx.Client
) -> None:
    a, b = pair
    s = RawSession(a.url, http).initialize()
    steps = 30  # 3 s: the call outlasts what the test does while A drains
    _, body = slow_countdown(steps, "long", 50)

    def opened_on_b() -> bool:
        fresh = RawSession(a.url, http).initialize()  # harmless before the drain: idle
        return fresh.session_id is not None and fresh.session_id.startswith(b.srv.epoch + "_")

    with http.stream("POST", b.url, json=body, headers=s.headers()) as call:
        lines = call.iter_lines()
        # The call runs on A (through B): its first progress arrives.
        first = next(line for line in lines if line.startswith("data:") and "progress" in line)
        a.srv.proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        # A drains: a new session sent to A is opened on B ...
        until(opened_on_b)
        # ... and a new call on A's session waits for the call in flight to be delivered,
        # then follows the session to B, which runs it: the client sees no refusal.
        moved, events = s.post("tools/call", {"name": "epoch", "arguments": {}}, request_id=51)
        assert moved.status_code == 200, moved.text
        assert moved.headers[FORWARDED_BY_HEADER] == b.srv.epoch
        assert b.srv.epoch in events[-1].data and '"id":51' in events[-1].data.replace(" ", "")
        # Nobody keeps an idle connection to a draining process (one it would close on exit).
        assert moved.headers["connection"] == "close"
        rest = [first, *lines]
    events = parse_sse(rest)
    assert progress_of(events) == list(range(1, steps + 1))
    assert any('"result"' in e.data for e in events)
    # A exits once its call is delivered and its session handed on, well inside 25 s.
    assert a.srv.proc.wait(10) == 0
    assert time.monotonic() - began < 10


def test_a_draining_process_relays_a_forwarded_call_to_its_end_before_it_exits(
    pair: tuple[Replica, Replica], http: httpx.Client
) -> None:
    a, b = pair
    s = RawSession(b.url, http).initialize()  # B owns the session; A only relays its call
    steps = 20
    _, body = slow_countdown(steps, "relayed", 70)
    with http.stream("POST", a.url, json=body, headers=s.headers()) as call:
        assert call.headers.get(FORWARDED_BY_HEADER) == b.srv.epoch
        lines = call.iter_lines()
        first = next(line for line in lines if line.startswith("data:") and "progress" in line)
        # A has no call of its own in flight: only the relay keeps it from exiting now.
        a.srv.proc.send_signal(signal.SIGTERM)
        rest = [first, *lines]
    events = parse_sse(rest)
    assert progress_of(events) == list(range(1, steps + 1))
    assert any('"result"' in e.data for e in events)
    assert a.srv.proc.wait(10) == 0


def test_a_draining_process_cuts_the_streams_it_relays_as_a_drop_would_and_exits(
    pair: tuple[Replica, Replica], http: httpx.Client, tmp_path: Path
) -> None:
    a, b = pair
    s = RawSession(b.url, http).initialize()
    headers = {**s.headers(), "accept": "text/event-stream"}
    with http.stream("GET", a.url, headers=headers) as stream:  # B's open-ended stream, via A
        assert stream.status_code == 200 and stream.headers[FORWARDED_BY_HEADER] == b.srv.epoch
        a.srv.proc.send_signal(signal.SIGTERM)
        with pytest.raises(httpx.RemoteProtocolError):  # cut: no final chunk
            for _ in stream.iter_bytes():
                pass
    assert a.srv.proc.wait(10) == 0
    log = (tmp_path / "a.log").read_text()
    assert "cut 1 forwarded streams" in log
    assert "Exception in ASGI application" not in log  # not cancelled by uvicorn's shutdown
    assert UNFINISHED_LINE not in log  # cut on purpose: not an error


def test_a_drained_process_ends_its_own_open_streams_at_exit_without_an_error(
    pair: tuple[Replica, Replica], http: httpx.Client, tmp_path: Path
) -> None:
    a, _ = pair
    s = RawSession(a.url, http).initialize()
    headers = {**s.headers(), "accept": "text/event-stream"}
    with http.stream("GET", a.url, headers=headers) as stream:  # A's own open-ended stream
        assert stream.status_code == 200 and FORWARDED_BY_HEADER not in stream.headers
        a.srv.proc.send_signal(signal.SIGTERM)
        with pytest.raises(httpx.RemoteProtocolError):  # ended by the exit: no last chunk
            for _ in stream.iter_bytes():
                pass
    assert a.srv.proc.wait(10) == 0
    log = (tmp_path / "a.log").read_text()
    assert "exit cut 1 open streams" in log
    assert UNFINISHED_LINE not in log


def test_a_relay_whose_owner_dies_is_cut_for_its_client_without_an_error(
    pair: tuple[Replica, Replica], http: httpx.Client, tmp_path: Path
) -> None:
    a, b = pair
    s = RawSession(b.url, http).initialize()  # B owns the session; A relays its call
    _, body = slow_countdown(50, "orphaned", 80)
    with http.stream("POST", a.url, json=body, headers=s.headers()) as call:
        assert call.headers.get(FORWARDED_BY_HEADER) == b.srv.epoch
        lines = call.iter_lines()
        next(line for line in lines if line.startswith("data:") and "progress" in line)
        b.srv.proc.kill()  # the owner dies mid-answer
        with pytest.raises(httpx.RemoteProtocolError):  # passed on as a drop: no last chunk
            for _ in lines:
                pass
    # A logged before it closed the client's connection: its log is complete for this.
    log = (tmp_path / "a.log").read_text()
    assert "relayed stream from" in log
    assert UNFINISHED_LINE not in log


def test_a_draining_process_relays_a_resumed_call_stream_to_its_answer_before_it_exits(
    pair: tuple[Replica, Replica], http: httpx.Client
) -> None:
    a, b = pair
    s = RawSession(a.url, http).initialize()  # A owns the session and runs the call
    steps = 20
    _, body = slow_countdown(steps, "resumed", 80)
    with http.stream("POST", a.url, json=body, headers=s.headers()) as call:
        lines = call.iter_lines()
        first = parse_sse([next(line for line in lines if line.startswith("id:"))])
        cursor = first[0].id
    # The client comes back through B (its balancer picked B): B relays A's replay.
    headers = {**s.headers(last_event_id=cursor), "accept": "text/event-stream"}
    with http.stream("GET", b.url, headers=headers) as replay:
        assert replay.status_code == 200 and replay.headers[FORWARDED_BY_HEADER] == a.srv.epoch
        assert "mcp-epoch-call-stream" not in replay.headers  # between replicas only
        lines = replay.iter_lines()
        head = next(line for line in lines if line.startswith("data:") and "progress" in line)
        # B has no call of its own: only this relay keeps it from exiting now.
        b.srv.proc.send_signal(signal.SIGTERM)
        rest = [head]
        for line in lines:  # a client closes the replay once the answer is in, as SDKs do
            rest.append(line)
            if line.startswith("data:") and '"result"' in line:
                rest.append("")
                break
        events = parse_sse(rest)
    assert progress_of(events)[-1] == steps
    assert any('"result"' in e.data for e in events)
    assert b.srv.proc.wait(10) == 0


def test_the_drain_deadline_bounds_a_call_that_does_not_end(
    epoch_service: EpochServiceProcess, http: httpx.Client
) -> None:
    a = launch(epoch_service, "slow", MCP_EPOCH_DRAIN_SECONDS="0.5")
    try:
        s = RawSession(a.url, http).initialize()
        params = {"name": "countdown", "arguments": {"n": 600, "delay": 0.1}}
        body = {"jsonrpc": "2.0", "id": 60, "method": "tools/call", "params": params}
        with http.stream("POST", a.url, json=body, headers=s.headers()) as call:
            assert call.status_code == 200
            a.srv.proc.send_signal(signal.SIGTERM)
            began = time.monotonic()
            code = a.srv.proc.wait(15)
        assert code == 0 and time.monotonic() - began < 10
    finally:
        a.srv.stop()


def test_a_resumed_call_stream_ends_with_the_calls_answer(
    pair: tuple[Replica, Replica], http: httpx.Client
) -> None:
    """A client that keeps a resumed GET open until the server ends it (the TypeScript and Go
    SDK clients) must see it end after the call's answer, here and through a relay: the SDK
    would otherwise hold it open for the session's life, and a draining relay with it."""
    a, b = pair
    s = RawSession(a.url, http).initialize()
    first = s.countdown(6, close_after=2, request_id=8)
    cursor = [e.id for e in first if e.id][-1]
    for via in (a, b):
        headers = {**s.headers(last_event_id=cursor), "accept": "text/event-stream"}
        with http.stream("GET", via.url, headers=headers) as r:
            assert r.status_code == 200
            lines = list(r.iter_lines())  # to the end of the response: it must end
        events = parse_sse(lines)
        assert progress_of(first) + progress_of(events) == [1, 2, 3, 4, 5, 6]
        assert '"result"' in events[-1].data
