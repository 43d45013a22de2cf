"""The sidecar's cost: the TypeScript SDK server reached directly vs through ``mcp-epoch proxy``.

    python -m bench proxy [--requests 2000] [--events 20000] [--streams 1000]

One TypeScript SDK server (no event store; :mod:`epochsvc.demo.upstream`) on loopback, and the
sidecar in front of it, both real processes. Measured in one run, against the same upstream
reached directly:

* latency of a ``ping`` on a session, direct, through the sidecar, and through the floor of any
  proxy here (:mod:`bench.passthrough`: a bare pass-through on the same server stack and hop),
  in turn, in rounds; each round's p50 through the sidecar less its p50 direct is the added
  latency (target: <= 0.5 ms), and the floor's shows how much of it any extra process on the
  path costs;
* streaming throughput of one call of ``--events`` progress notifications (target: >= 0.9x
  direct), and the sidecar's CPU per event;
* the sidecar's resident memory idle, and per 1,000 streams held open (calls in flight).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.stats import cpu_seconds, pct
from bench.verdict import Ratio
from tests.sidecar.test_interop import Session
from tests.sidecar.upstreams import Proc, Sidecar, start_sidecar, start_upstream
from tests.support.ports import free_port

TARGET_ADDED_P50_MS = 0.5
TARGET_STREAM_RATIO = 0.9


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@contextmanager
def _passthrough(upstream_port: int) -> Iterator[str]:
    """The floor proxy (:mod:`bench.passthrough`) in front of the upstream: its MCP URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.passthrough"]
    cmd += ["--upstream", f"127.0.0.1:{upstream_port}", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        announced = json.loads(proc.stdout.readline() or "{}")
        if announced.get("port") != port:
            raise RuntimeError(f"the floor proxy did not start (exit {proc.poll()})")
        deadline = time.monotonic() + 30
        while True:  # polling a condition the process reaches by itself: it listens
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the floor proxy never listened") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)


def _latency(http: httpx.Client, paths: dict[str, Session], requests: int, rounds: int) -> Ratio:
    """Pings on a session along each path in turn (the machine is the same for all), in
    ``rounds``; prints each path's p50 and p99, returns the sidecar's added p50 per round."""
    added: list[float] = []
    floor: list[float] = []
    every: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(rounds):
        took: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(max(requests // rounds, 20)):
            for name, session in paths.items():
                took[name].append(_ping(http, session))
        p50 = {name: pct(values, 50) * 1e3 for name, values in took.items()}
        added.append(p50["sidecar"] - p50["direct"])
        floor.append(p50["floor"] - p50["direct"])
        for name, values in took.items():
            every[name] += values
    print(f"ping on a session, {requests} requests on each path, {rounds} rounds")
    for name, values in every.items():
        p50, p99 = pct(values, 50) * 1e3, pct(values, 99) * 1e3
        print(f"  {name:8} p50 {p50:6.3f} ms  p99 {p99:6.3f} ms")
    print(
        f"  added at p50 (median of rounds): the floor {statistics.median(floor):.3f} ms, "
        f"the sidecar {statistics.median(added):.3f} ms"
    )
    return Ratio(
        "the sidecar's added p50 (ms)",
        "the same upstream direct",
        tuple(added),
        TARGET_ADDED_P50_MS,
        at_most=True,
        unit=" ms",
    )


def _ping(http: httpx.Client, s: Session) -> float:
    t0 = time.perf_counter()
    r = http.post(s.url, json={"jsonrpc": "2.0", "id": 7, "method": "ping"}, headers=s.headers())
    took = time.perf_counter() - t0
    r.raise_for_status()
    return took


def _stream(http: httpx.Client, s: Session, events: int) -> float:
    rid = s.next_id
    s.next_id += 1
    params = {
        "name": "work",
        "arguments": {"uid": "b", "call": f"c{rid}", "steps": events, "interval": 0},
        "_meta": {"progressToken": f"p{rid}"},
    }
    body = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}
    seen = 0
    t0 = time.perf_counter()
    with http.stream("POST", s.url, json=body, headers=s.headers()) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and "notifications/progress" in line:
                seen += 1
    rate = events / (time.perf_counter() - t0)
    assert seen == events, (seen, events)
    return rate


async def _hold_streams(sidecar: Sidecar, streams: int) -> float:
    """RSS of the sidecar with ``streams`` calls in flight through it (each a stream)."""
    limits = httpx.Limits(max_connections=streams + 10)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "0"},
            },
        }
        headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
        }
        r = await http.post(sidecar.url, json=init, headers=headers)
        headers = {**headers, "mcp-session-id": r.headers["mcp-session-id"]}
        headers["mcp-protocol-version"] = "2025-11-25"
        await http.post(
            sidecar.url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers=headers,
        )
        opened = asyncio.Event()
        count = 0
        release = asyncio.Event()

        async def one(i: int) -> None:
            nonlocal count
            params = {
                "name": "work",
                "arguments": {"uid": "h", "call": f"h{i}", "steps": 2, "interval": 30},
                "_meta": {"progressToken": f"h{i}"},
            }
            body = {"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call", "params": params}
            async with http.stream("POST", sidecar.url, json=body, headers=headers) as resp:
                async for line in resp.aiter_lines():
                    if "notifications/progress" in line:
                        count += 1
                        if count == streams:
                            opened.set()
                        await release.wait()
                        return

        tasks = [asyncio.ensure_future(one(i)) for i in range(streams)]
        await asyncio.wait_for(opened.wait(), 120)
        rss = _rss_mib(sidecar.proc.pid)
        release.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return rss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench proxy")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of pings, and of streams")
    ap.add_argument(
        "--quick", action="store_true", help="300 requests, 5,000 events x 5, 200 streams"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.requests, args.events, args.streams, args.rounds = 300, 5000, 200, 5
    up: Proc = start_upstream("ts")
    sidecar = start_sidecar(up.port)
    try:
        idle = _rss_mib(sidecar.proc.pid)
        with httpx.Client(timeout=60.0) as http, _passthrough(up.port) as floor_url:
            direct = Session(f"http://127.0.0.1:{up.port}/mcp", http).initialize()
            through = Session(sidecar.url, http).initialize()
            paths = {"direct": direct, "floor": Session(floor_url, http).initialize()}
            paths["sidecar"] = through
            for _ in range(200):  # warm every path
                for session in paths.values():
                    _ping(http, session)
            latency = _latency(http, paths, args.requests, args.rounds)
            lat_met = latency.verdict != "MISSED"
            print(latency.line())
            _stream(http, direct, 500), _stream(http, through, 500)  # warm
            rates_d: list[float] = []
            rates_s: list[float] = []
            cpu = 0.0
            for rnd in range(args.rounds):  # alternating order: both see the same machine
                if rnd % 2:
                    cpu0 = cpu_seconds(sidecar.proc.pid)
                    rates_s.append(_stream(http, through, args.events))
                    cpu += cpu_seconds(sidecar.proc.pid) - cpu0
                    rates_d.append(_stream(http, direct, args.events))
                else:
                    rates_d.append(_stream(http, direct, args.events))
                    cpu0 = cpu_seconds(sidecar.proc.pid)
                    rates_s.append(_stream(http, through, args.events))
                    cpu += cpu_seconds(sidecar.proc.pid) - cpu0
            cpu_per_event = cpu / (args.events * args.rounds) * 1e6
            stream = Ratio(
                "streaming through the sidecar",
                "the same upstream direct",
                tuple(s / d for s, d in zip(rates_s, rates_d, strict=True)),
                TARGET_STREAM_RATIO,
                False,
            )
            stream_met = stream.verdict != "MISSED"
            print(f"one streamed call of {args.events} progress events, {args.rounds} rounds")
            print(f"  direct         {statistics.median(rates_d):10,.0f} events/s (median)")
            print(f"  through proxy  {statistics.median(rates_s):10,.0f} events/s (median)")
            print(f"  sidecar CPU {cpu_per_event:.1f} us/event")
            print(stream.line())
        held = asyncio.run(_hold_streams(sidecar, args.streams))
        per_k = (held - idle) / args.streams * 1000
        print(
            f"sidecar RSS: idle {idle:.1f} MiB; with {args.streams} streams open {held:.1f} MiB "
            f"({per_k:.1f} MiB per 1,000 streams)"
        )
    finally:
        sidecar.stop()
        up.stop()
    return 0 if lat_met and stream_met else 1
