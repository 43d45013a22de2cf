"""The upstream dies and comes back (a container restart inside the pod), behind the sidecar.

The sidecar sees every request and answer, so it knows which calls were in flight: a call whose
upstream stream breaks fails at once with a JSON-RPC error on the client's stream (and on any
resumption of it), never a wait. The restarted upstream has lost its sessions; the next
request of a session is not forwarded into a session that no longer exists: the sidecar opens
it anew from its recorded ``initialize`` and the client goes on with the session ID it holds.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from epochsvc.demo.checker import Token
from tests.replica.conftest import parse_sse
from tests.sidecar.test_interop import Session, last_id, progress_of
from tests.sidecar.upstreams import Sidecar, start_sidecar, start_upstream
from tests.support.ports import free_port


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=httpx.Timeout(20.0)) as client:
        yield client


def _wait_ready(sidecar: Sidecar, ready: bool) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # polling a condition the sidecar reaches by itself
        status = httpx.get(f"http://127.0.0.1:{sidecar.port}/readyz").status_code
        if (status == 200) == ready:
            return
        time.sleep(0.05)
    raise AssertionError(f"the sidecar's readiness never became {ready}")


@pytest.mark.parametrize("kind", ["ts", "go", "python"])
def test_a_call_in_flight_fails_at_once_and_the_session_survives_a_restart(
    kind: str, http: httpx.Client, tmp_path: Path
) -> None:
    port = free_port()
    up = start_upstream(kind, "first", port)
    sidecar = start_sidecar(port, log=tmp_path / "sidecar.log")
    try:
        s = Session(sidecar.url, http).initialize()
        held = s.id
        began = time.monotonic()
        with http.stream(
            "POST",
            sidecar.url,
            json=s.body(
                "tools/call",
                {
                    "name": "work",
                    "arguments": {"uid": "f", "call": "k1", "steps": 200, "interval": 0.05},
                    "_meta": {"progressToken": "t1"},
                },
            ),
            headers=s.headers(),
        ) as r:
            lines: list[str] = []
            for line in r.iter_lines():
                lines.append(line)
                progress = line.startswith("data:") and "notifications/progress" in line
                if progress and up.proc.poll() is None:
                    up.proc.send_signal(signal.SIGKILL)  # the upstream dies mid-call
        took = time.monotonic() - began
        events = parse_sse(lines)
        final = events[-1].message
        assert final is not None and final["id"] == s.next_id - 1, final
        assert (
            final["error"]["code"] == -32603 and "outcome is unknown" in final["error"]["message"]
        )
        assert took < 5, took  # told at once: the call would have run for 10 s
        assert 1 <= len(progress_of(events)) < 200
        # A resumption of the failed call's stream hears the same error, and ends.
        cursor = [e.id for e in events if e.id and e.message and "method" in e.message][-1]
        r2, rest = s.resume(cursor)
        assert r2.status_code == 200 and rest[-1].message == final
        assert sidecar.metric("mcp_epoch_upstream_lost_calls_total") == 1
        _wait_ready(sidecar, False)

        up = start_upstream(kind, "second", port)  # the container restarts
        _wait_ready(sidecar, True)
        events = s.work(3, 0.01)
        assert s.id == held  # the client's session ID did not change
        assert progress_of(events) == [1, 2, 3]
        token = Token.parse(events[-1].message["result"]["content"][0]["text"])  # type: ignore[index]
        assert token is not None and token.replica == "second" and token.n == 3
        assert sidecar.metric("mcp_epoch_upstream_sessions_reopened_total") == 1
        assert last_id(events).rpartition(":")[0] == cursor.rpartition(":")[0]
    finally:
        sidecar.stop()
        up.stop()
