"""The sidecar drains on its pod's drain request, while the server behind it still serves.

A kubelet signals a pod's main container first and its native sidecars only once the main
container has exited. So the main container's preStop asks the sidecar to drain
(``GET`` the drain path with the pod's token) and the kubelet waits for the answer: the call in
flight finishes through the sidecar before the server is signalled, and the sidecar, drained,
waits for its own SIGTERM.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx

from mcp_epoch.contract import DRAIN_PATH, DRAIN_TOKEN_HEADER, ENV_DRAIN_TOKEN
from tests.replica.conftest import parse_sse
from tests.sidecar.test_interop import Session, progress_of
from tests.sidecar.upstreams import start_sidecar, start_upstream


def test_a_drain_request_finishes_the_call_in_flight_and_the_sidecar_waits_for_its_signal(
    tmp_path: Path,
) -> None:
    up = start_upstream("ts")
    sidecar = start_sidecar(up.port, {ENV_DRAIN_TOKEN: "pod-secret"}, log=tmp_path / "s.log")
    drain_url = f"http://127.0.0.1:{sidecar.port}{DRAIN_PATH}"
    try:
        with httpx.Client(timeout=30) as http:
            assert http.get(drain_url).status_code == 403  # no token: nobody else drains a pod
            bad = http.get(drain_url, headers={DRAIN_TOKEN_HEADER: "guess"})
            assert bad.status_code == 403
            s = Session(sidecar.url, http).initialize()
            started = threading.Event()
            answer: dict[str, object] = {}

            def drain_when_started() -> None:
                started.wait(10)
                r = httpx.get(drain_url, headers={DRAIN_TOKEN_HEADER: "pod-secret"}, timeout=30)
                answer.update(status=r.status_code, body=r.json())

            drainer = threading.Thread(target=drain_when_started)
            drainer.start()
            rid = s.next_id
            body = s.body(
                "tools/call",
                {
                    "name": "work",
                    "arguments": {"uid": "d", "call": "k", "steps": 20, "interval": 0.05},
                    "_meta": {"progressToken": f"t{rid}"},
                },
            )
            with http.stream("POST", sidecar.url, json=body, headers=s.headers()) as r:
                lines: list[str] = []
                for line in r.iter_lines():
                    lines.append(line)
                    if "notifications/progress" in line:
                        started.set()  # the drain begins with this call running
            events = parse_sse(lines)
            drainer.join(30)
            assert progress_of(events) == list(range(1, 21))  # the call finished
            assert answer["status"] == 200, answer
            drained = answer["body"]
            assert isinstance(drained, dict) and drained["in_flight"] == 1
            assert drained["abandoned"] == 0 and not drained["deadline"]
            # Drained: it takes no more connections, but waits for its own signal.
            try:
                http.get(f"http://127.0.0.1:{sidecar.port}/readyz", timeout=2)
                listening = True
            except httpx.TransportError:
                listening = False
            assert not listening
            assert sidecar.proc.poll() is None
        sidecar.proc.send_signal(signal.SIGTERM)
        assert sidecar.proc.wait(10) == 0
    finally:
        sidecar.stop()
        up.stop()
