"""Sessions outlive their process: the handoff between real server processes.

Example servers (``examples/epoch_server.py``) share a real epoch service. A drained process
hands its sessions to a live peer; the client keeps its session ID and sees no 404; every
cursor is served exactly from the old owner's handed-over tail or rejected, never re-numbered.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import httpx
import pytest

from mcp_epoch import api
from mcp_epoch.contract import (
    FORWARDED_BY_HEADER,
    HANDOFF_FROM_HEADER,
    HANDOFF_PATH,
    REJECTED_HEADER,
)
from tests.replica.conftest import RawSession, Sse, progress_of
from tests.replica.replicas import NS, SERVER, Replica, replicas, slow_countdown
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.metrics import sample


def drain(r: Replica) -> None:
    """SIGTERM, as the kubelet sends it; the process drains and exits 0."""
    r.srv.proc.send_signal(signal.SIGTERM)
    assert r.srv.proc.wait(15) == 0


def served_by(s: RawSession) -> tuple[httpx.Response, str]:
    """Call the ``epoch`` tool: the process epoch that really ran it."""
    r, events = s.post("tools/call", {"name": "epoch", "arguments": {}})
    assert r.status_code == 200, r.text
    result = events[-1].message
    assert result is not None
    return r, str(result["result"]["content"][0]["text"])


def metric(r: Replica, http: httpx.Client, name: str) -> float:
    text = http.get(r.url.removesuffix("/mcp") + "/metrics").text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


def drains_counted(svc: EpochServiceProcess) -> dict[str, float | None]:
    """The epoch service's count of this server's drains, by outcome (None: none yet)."""
    with svc.client() as c:
        text = c.get("/metrics").text
    return {
        outcome: sample(text, "epochsvc_drains_total", namespace=NS, server=SERVER, outcome=outcome)
        for outcome in ("clean", "deadline")
    }


def cursors(events: list[Sse]) -> list[str]:
    return [e.id for e in events if e.id and e.message is not None]


def test_a_drained_process_hands_its_sessions_on_and_every_replica_routes_them(
    epoch_service: EpochServiceProcess, http: httpx.Client, tmp_path: Path
) -> None:
    with replicas(epoch_service, http, tmp_path, ("a", "b", "c")) as (a, b, c):
        s = RawSession(a.url, http).initialize()
        public_id = s.session_id
        assert served_by(s)[1] == a.srv.epoch
        s.post("logging/setLevel", {"level": "warning"})
        drain(a)  # the session is idle: it moves at once, to the newest live peer (c)
        rule = epoch_service.send(api.get_epoch(a.pod_epoch))
        assert (rule.successor, rule.successor_of) == (c.srv.epoch, 0)
        assert drains_counted(epoch_service) == {"clean": 1.0, "deadline": 0.0}
        # s and the probe session the fixture opened on a.
        assert metric(c, http, "mcp_epoch_sessions_adopted_total") == 2

        # Through any replica, under the ID the client holds: no 404, and c runs the calls.
        for via in (c, b):
            s.url = via.url
            r, ran_on = served_by(s)
            assert ran_on == c.srv.epoch and r.headers["mcp-session-id"] == public_id
        # Once the ledger retires a, every replica routes by the handoff rule alone.
        epoch_service.send(api.retire(a.pod_epoch))
        s.url = b.url
        r, ran_on = served_by(s)
        assert ran_on == c.srv.epoch and r.headers[FORWARDED_BY_HEADER] == c.srv.epoch
        assert metric(c, http, "mcp_epoch_handed_session_requests_total") >= 3


def test_cursors_of_a_handed_session_are_served_from_the_tail_or_rejected(
    epoch_service: EpochServiceProcess, http: httpx.Client, tmp_path: Path
) -> None:
    # A 24-event buffer: the first call's early events are evicted by the second call.
    with replicas(
        epoch_service, http, tmp_path, ("a", "b", "c"), MCP_RESUME_BUFFER_EVENTS="24"
    ) as (a, b, c):
        s = RawSession(a.url, http).initialize()
        evicted = cursors(s.countdown(20, request_id=10))
        kept = cursors(s.countdown(10, request_id=11))
        drain(a)  # to c, the newest live peer
        s.url = b.url  # any replica: it routes to the session's holder

        # A cursor inside the handed-over tail: exactly the rest, under a's own IDs.
        r, rest = s.resume(kept[2])
        assert r.status_code == 200 and r.headers[FORWARDED_BY_HEADER] == c.srv.epoch
        assert progress_of(rest) == [4, 5, 6, 7, 8, 9, 10]
        assert cursors(rest) == kept[3:]
        assert all(i.startswith(a.srv.epoch + ":") for i in cursors(rest))
        # One that a evicted before it handed on: a gap, never clamped.
        r, _ = s.resume(evicted[0])
        assert r.status_code == 404 and r.headers[REJECTED_HEADER] == "gap"
        # One a never sent in this session: unknown.
        seq = int(kept[-1].rsplit(":", 1)[1])
        r, _ = s.resume(f"{a.srv.epoch}:{seq + 50}")
        assert r.status_code == 404 and r.headers[REJECTED_HEADER] == "unknown"

        # New events carry the new holder's epoch; then a second handoff (c to b) keeps both
        # owners' tails exact.
        s.url = c.url
        on_c = cursors(s.countdown(4, request_id=12))
        assert all(i.startswith(c.srv.epoch + ":") for i in on_c)
        drain(c)
        s.url = b.url
        r, rest = s.resume(kept[5])
        assert r.status_code == 200 and cursors(rest) == kept[6:]
        r, rest = s.resume(on_c[0])
        assert r.status_code == 200 and cursors(rest) == on_c[1:]
        assert progress_of(rest) == [2, 3, 4]
        assert metric(b, http, "mcp_epoch_tail_replays_total") == 2
        assert served_by(s)[1] == b.srv.epoch


def test_a_crashed_owner_hands_nothing_on(
    epoch_service: EpochServiceProcess, http: httpx.Client, tmp_path: Path
) -> None:
    with replicas(epoch_service, http, tmp_path, ("a", "b")) as (a, b):
        s = RawSession(a.url, http).initialize()
        kept = cursors(s.countdown(5))
        a.srv.proc.kill()  # kill -9: no drain, no handoff
        a.srv.proc.wait(5)
        epoch_service.send(api.retire(a.pod_epoch))
        s.url = b.url
        r, _ = s.resume(kept[1])
        assert r.status_code == 404 and r.headers[REJECTED_HEADER] == "retired"
        r, _ = s.post("ping")
        assert r.status_code == 404 and r.headers[REJECTED_HEADER] == "retired"


def test_with_handoff_off_a_draining_process_refuses_new_calls_echoing_their_id(
    epoch_service: EpochServiceProcess, http: httpx.Client, tmp_path: Path
) -> None:
    with replicas(epoch_service, http, tmp_path, ("a", "b"), MCP_EPOCH_HANDOFF="off") as (a, _):
        s = RawSession(a.url, http).initialize()
        params, body = slow_countdown(20, "long", 50)
        with http.stream("POST", a.url, json=body, headers=s.headers()) as call:
            lines = call.iter_lines()
            next(line for line in lines if "progress" in line)
            a.srv.proc.send_signal(signal.SIGTERM)
            # Refused before it runs, with the request's own id (the Go SDK client fails the
            # whole session on an error it cannot match to a request).
            refused, _ = s.post("tools/call", params, request_id=51)
            assert refused.status_code == 404 and refused.headers[REJECTED_HEADER] == "retired"
            assert refused.json()["id"] == 51
            list(lines)
        assert a.srv.proc.wait(10) == 0
        assert epoch_service.send(api.get_epoch(a.pod_epoch)).successor is None


def test_a_hand_on_is_taken_only_from_the_process_the_ledger_names(
    epoch_service: EpochServiceProcess, http: httpx.Client, tmp_path: Path
) -> None:
    with replicas(epoch_service, http, tmp_path, ("a", "b")) as (a, b):
        url = b.url.removesuffix("/mcp") + HANDOFF_PATH
        forged = {
            "sender": a.srv.epoch,
            "sessions": [
                {
                    "id": f"{a.srv.epoch}_{'0' * 32}",
                    "path": "/mcp",
                    "initialize": '{"jsonrpc":"2.0","id":0,"method":"initialize"}',
                    "tails": [],
                }
            ],
        }
        headers = {HANDOFF_FROM_HEADER: a.srv.epoch}
        # a recorded no rule naming b: refused, whoever sends it.
        r = http.post(url, json=forged, headers=headers)
        assert r.status_code == 403 and "does not say" in r.text
        r = http.post(url, json={**forged, "sender": "x"}, headers=headers)
        assert r.status_code == 422
        r = http.post(url, content=b"{", headers=headers)
        assert r.status_code == 422
        r = http.post(url, json=forged)
        assert r.status_code == 400
        assert metric(b, http, "mcp_epoch_sessions_adopted_total") == 0
        assert epoch_service.send(api.list_server(NS, SERVER)).epochs[0].successor is None


def test_a_drain_that_runs_out_of_time_ends_what_it_keeps_at_once(
    epoch_service: EpochServiceProcess, http: httpx.Client, tmp_path: Path
) -> None:
    """A call waiting for an elicitation nobody answers never ends: the drain runs to its
    deadline, then ends that session. The process exits at once (the SDK's own shutdown waited
    seconds per pending request for a stream nobody reads), and a client still on the call's
    stream sees it cut, not ended: it comes back and is told, instead of waiting."""
    with replicas(epoch_service, http, tmp_path, ("a",), MCP_EPOCH_DRAIN_SECONDS="1") as (a,):
        s = RawSession(a.url, http).initialize()

        def confirm(rid: int) -> dict[str, object]:
            params = {"name": "confirm", "arguments": {"question": "ok?"}}
            return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}

        with http.stream("POST", a.url, json=confirm(4), headers=s.headers()) as gone:
            next(line for line in gone.iter_lines() if "elicitation/create" in line)
        # That client is gone with the question unanswered; this one is still listening.
        with http.stream("POST", a.url, json=confirm(5), headers=s.headers()) as waiting:
            lines = waiting.iter_lines()
            next(line for line in lines if "elicitation/create" in line)
            began = time.monotonic()
            a.srv.proc.send_signal(signal.SIGTERM)
            with pytest.raises(httpx.RemoteProtocolError):
                for _ in lines:
                    pass
        assert a.srv.proc.wait(10) == 0
        assert time.monotonic() - began < 4.0
        log = (tmp_path / "a.log").read_text()
        assert "drain deadline of 1s passed" in log and "('4', False)" in log
        # Told to the epoch service before the exit: what Prometheus sees of the drain.
        assert drains_counted(epoch_service) == {"clean": 0.0, "deadline": 1.0}
        assert "transport write blocked" not in log
        assert "ASGI callable returned without completing response" not in log


def test_a_new_call_does_not_wait_for_a_call_that_may_never_end(
    epoch_service: EpochServiceProcess, http: httpx.Client, tmp_path: Path
) -> None:
    """A session moves only when none of its calls is running. A call waiting for an answer
    nobody will give may never end: a new call on its session waits a few seconds for it,
    then is refused before it runs (with its id), not held to the drain deadline."""
    with replicas(epoch_service, http, tmp_path, ("a", "b")) as (a, _):
        s = RawSession(a.url, http).initialize()
        body = {
            "jsonrpc": "2.0",
            "id": 4,
            "method": "tools/call",
            "params": {"name": "confirm", "arguments": {"question": "ok?"}},
        }
        with http.stream("POST", a.url, json=body, headers=s.headers()) as gone:
            next(line for line in gone.iter_lines() if "elicitation/create" in line)
        a.srv.proc.send_signal(signal.SIGTERM)  # drain deadline: the default 25 s
        began = time.monotonic()
        ready = a.url.replace("/mcp", "/readyz")
        while http.get(ready).status_code == 200:  # until the drain began (its own doing)
            assert time.monotonic() - began < 5, "the replica never began to drain"
        refused, _ = s.post("tools/call", {"name": "epoch", "arguments": {}}, request_id=5)
        waited = time.monotonic() - began
        assert refused.status_code == 404 and refused.headers[REJECTED_HEADER] == "retired"
        assert refused.json()["id"] == 5
        assert 4.0 < waited < 10.0, waited
