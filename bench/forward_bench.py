"""The forward path's cost: a request to the owner directly vs through another replica.

    python -m bench forward [--requests 2000] [--events 20000]

Two example servers (``examples/epoch_server.py``) share a real epoch service on loopback and
know each other's address from the ledger. One session lives on A. Measured in one run:

* latency of a ``ping`` on that session, sent to A (direct) and to B (forwarded to A), p50 and
  p99, and the difference (target: <= 1 ms added at p50);
* streaming throughput of one ``countdown`` call of ``--events`` progress notifications, read
  from A directly and through B.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.stats import cpu_seconds, pct
from mcp_epoch import api
from mcp_epoch.contract import FORWARDED_BY_HEADER
from tests.replica.conftest import RawSession, ServerProc, start_server
from tests.support.epochsvc_proc import EpochServiceProcess

NS, SERVER = "bench", "forward"
TARGET_ADDED_P50_MS = 1.0


def _launch(svc: EpochServiceProcess, name: str) -> ServerProc:
    epoch = svc.issue(NS, SERVER, f"req-{name}")
    svc.send(api.bind(epoch, name, f"uid-{name}"))
    srv = start_server({**svc.replica_env(epoch, NS, SERVER), "MCP_POD_NAME": name})
    svc.send(api.bind(epoch, name, f"uid-{name}", f"127.0.0.1:{srv.port}"))
    return srv


def _ping(http: httpx.Client, url: str, session: RawSession, rid: int) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": rid, "method": "ping"}
    return http.post(url, json=body, headers=session.headers())


def _latencies(http: httpx.Client, url: str, session: RawSession, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        r = _ping(http, url, session, 10_000 + i)
        out.append(time.perf_counter() - t0)
        r.raise_for_status()
    return out


def _stream(http: httpx.Client, url: str, session: RawSession, events: int, rid: int) -> float:
    params = {
        "name": "countdown",
        "arguments": {"n": events, "delay": 0},
        "_meta": {"progressToken": f"bench-{rid}"},
    }
    body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
    seen = 0
    t0 = time.perf_counter()
    with http.stream("POST", url, json=body, headers=session.headers()) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and "notifications/progress" in line:
                seen += 1
    seconds = time.perf_counter() - t0
    assert seen == events, (seen, events)
    return events / seconds


def _paired(
    http: httpx.Client, a: ServerProc, b: ServerProc, session: RawSession, n: int
) -> tuple[list[float], list[float], dict[str, float]]:
    """``n`` pings direct to A and ``n`` through B, alternating, so both paths see the same
    machine (a run of one after the other drifts by more than the difference on a shared VM);
    and each server's CPU per ping of its own (A serves both, B only the forwarded ones)."""
    before = {name: cpu_seconds(p.proc.pid) for name, p in (("A", a), ("B", b))}
    direct, forwarded = [], []
    for _ in range(n):
        direct += _latencies(http, a.url, session, 1)
        forwarded += _latencies(http, b.url, session, 1)
    cpu = {
        "A": (cpu_seconds(a.proc.pid) - before["A"]) / (2 * n) * 1e3,
        "B": (cpu_seconds(b.proc.pid) - before["B"]) / n * 1e3,
    }
    return direct, forwarded, cpu


def _pct(values: list[float], q: int) -> float:
    return pct(values, q) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench forward")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--quick", action="store_true", help="300 requests, 3,000 events")
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.events = 300, 3000
    work = Path(tempfile.mkdtemp(prefix="bench-forward-"))
    with EpochServiceProcess(f"sqlite:///{work}/ledger.db", work / "epochsvc.log") as svc:
        # Started side by side: each start is mostly a Python process importing its modules.
        with ThreadPoolExecutor(2) as starting:
            a, b = starting.map(lambda name: _launch(svc, name), ("a", "b"))
        try:
            with httpx.Client(timeout=30.0) as http:
                session = RawSession(a.url, http).initialize()
                deadline = time.monotonic() + 15
                while FORWARDED_BY_HEADER not in _ping(http, b.url, session, 1).headers:
                    if time.monotonic() > deadline:
                        print("B never learnt A's address from the ledger")
                        return 1
                    time.sleep(0.05)  # the ledger copy catches up on its own; a bench may wait
                _latencies(http, a.url, session, 200)  # warm both paths
                _latencies(http, b.url, session, 200)
                direct, forwarded, cpu = _paired(http, a, b, session, args.requests)
                print(f"ping on A's session, {args.requests} pairs of sequential requests")
                for label, lat in (("direct to A", direct), ("through B", forwarded)):
                    print(f"  {label:12} p50 {_pct(lat, 50):6.3f} ms  p99 {_pct(lat, 99):6.3f} ms")
                print(
                    f"  CPU per request: A {cpu['A']:.2f} ms (direct and forwarded alike), "
                    f"B {cpu['B']:.2f} ms (forwarding)"
                )
                added50 = _pct(forwarded, 50) - _pct(direct, 50)
                added99 = _pct(forwarded, 99) - _pct(direct, 99)
                met = added50 <= TARGET_ADDED_P50_MS
                print(
                    f"  added by forwarding: p50 {added50:.3f} ms, p99 {added99:.3f} ms "
                    f"(target p50 <= {TARGET_ADDED_P50_MS:g} ms: {'met' if met else 'MISSED'}); "
                    f"ratio p50 {_pct(forwarded, 50) / _pct(direct, 50):.2f}x"
                )
                print(f"one streamed call of {args.events} progress events")
                rate_direct = _stream(http, a.url, session, args.events, 90_001)
                rate_forward = _stream(http, b.url, session, args.events, 90_002)
                print(f"  direct to A  {rate_direct:10,.0f} events/s")
                print(f"  through B    {rate_forward:10,.0f} events/s")
                print(f"  ratio through/direct: {rate_forward / rate_direct:.2f}x")
        finally:
            a.stop()
            b.stop()
    return 0 if met else 1
