"""What mcp-epoch costs an SDK server: tool calls with progress, served three ways.

    python -m bench guard [--seconds 5] [--clients 8] [--steps 10] [--rounds 5]

One ``MCPServer`` (``bench/guard_server.py``) with a tool that sends ``--steps`` progress
notifications and answers, served (one process at a time, same uvicorn settings) with
mcp-epoch (store, guard, live view of a real epoch service), with a no-op event store (the
SDK's own resumability path alone) and with no event store. The Go load generator times each
call until its whole SSE answer is read: throughput with ``--clients`` calls in flight on one
session, latency with one call at a time (no queueing). The server is one Python process (one
core) and the Go client costs a fraction of the other core, so the server is the bottleneck.
Rounds alternate the order of the three, and the median round of each counts (single rounds
vary by 20% or more on a shared two-core VM). Targets: throughput >= 0.95x the no-op store
(our own cost) and >= 0.90x no store; p99 at most 1 ms above the no-op store.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from bench.loadgen import Load, run
from mcp_epoch import api
from tests.replica.conftest import RawSession, parse_sse
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.ports import free_port

NS, SERVER = "bench", "guard"
STORES = ("none", "noop", "epoch")
MIN_VS_NOOP, MIN_VS_NONE, MAX_ADDED_P99_MS = 0.95, 0.90, 1.0


def _start(store: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    full = {k: v for k, v in os.environ.items() if not k.startswith("MCP_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.guard_server", f"--store={store}", f"--port={port}"],
        env={**full, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    if not proc.stdout.readline():
        raise RuntimeError(f"the {store} server exited with {proc.wait(5)}")
    return proc, f"http://127.0.0.1:{port}/mcp"


def _call_body(steps: int) -> str:
    params = {"name": "work", "arguments": {"steps": steps}, "_meta": {"progressToken": "{n}"}}
    return json.dumps({"jsonrpc": "2.0", "id": "{n}", "method": "tools/call", "params": params})


def _measure(url: str, args: argparse.Namespace) -> tuple[Load, Load]:
    """(throughput with ``--clients`` in flight, latency with one call at a time)."""
    with httpx.Client(timeout=30.0) as http:
        session = RawSession(url, http).initialize()
        # One call by hand first: the workload really streams progress and its answer.
        body = json.loads(_call_body(args.steps).replace("{n}", "check"))
        with http.stream("POST", url, json=body, headers=session.headers()) as r:
            events = parse_sse(list(r.iter_lines()))
        progress = sum("notifications/progress" in e.data for e in events)
        assert progress == args.steps and '"result"' in events[-1].data, events[-3:]
        headers = {k: v for k, v in session.headers().items() if k != "content-type"}

    def load(clients: int, seconds: float) -> Load:
        return run(
            [url],
            clients=clients,
            seconds=seconds,
            method="POST",
            body=_call_body(args.steps),
            headers=headers,
            whole=True,
            status=200,
        )

    load(args.clients, 1.0)  # warm-up
    return load(args.clients, args.seconds), load(1, args.seconds / 2)


def _median(loads: list[Load]) -> Load:
    """The round of median throughput (its latencies come with it)."""
    return sorted(loads, key=lambda load: load.per_sec)[len(loads) // 2]


def _median_p99(loads: list[Load]) -> Load:
    return sorted(loads, key=lambda load: load.p99_ms)[len(loads) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench guard")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1 s per measurement, 2 rounds")
    args = ap.parse_args(argv)
    if args.quick:
        args.seconds, args.rounds = 1.0, 2
    work = Path(tempfile.mkdtemp(prefix="bench-guard-"))
    rounds: dict[str, list[tuple[Load, Load]]] = {store: [] for store in STORES}
    with EpochServiceProcess(f"sqlite:///{work}/ledger.db", work / "epochsvc.log") as svc:
        epoch = svc.issue(NS, SERVER, "req-guard")
        svc.send(api.bind(epoch, "guard", "uid-guard"))
        env = {**svc.replica_env(epoch, NS, SERVER), "MCP_POD_NAME": "guard"}
        for rnd in range(args.rounds):
            for store in STORES if rnd % 2 == 0 else tuple(reversed(STORES)):
                proc, url = _start(store, env if store == "epoch" else {})
                try:
                    busy, alone = _measure(url, args)
                finally:
                    proc.terminate()
                    proc.wait(10)
                print(
                    f"  round {rnd + 1} {store:5}: {busy.per_sec:8.1f} calls/s; one at a time "
                    f"p50 {alone.p50_ms:6.2f} ms p99 {alone.p99_ms:6.2f} ms; errors "
                    f"{busy.errors + alone.errors}",
                    flush=True,
                )
                for failed in (x for x in (busy, alone) if x.errors):
                    print(f"    first error: {failed.first_error}")
                rounds[store].append((busy, alone))
    busy_of = {store: _median([b for b, _ in r]) for store, r in rounds.items()}
    alone_of = {store: _median_p99([a for _, a in r]) for store, r in rounds.items()}
    vs_noop = busy_of["epoch"].per_sec / busy_of["noop"].per_sec
    vs_none = busy_of["epoch"].per_sec / busy_of["none"].per_sec
    added = alone_of["epoch"].p99_ms - alone_of["noop"].p99_ms
    print(
        f"tool calls with {args.steps} progress events, median of {args.rounds} rounds: "
        f"throughput with {args.clients} in flight, latency one call at a time (Go client; "
        "the server is the bottleneck)"
    )
    names = (("no event store", "none"), ("no-op event store", "noop"), ("mcp-epoch", "epoch"))
    for name, store in names:
        a = alone_of[store]
        print(
            f"  {name:18} {busy_of[store].per_sec:8.1f} calls/s  p50 {a.p50_ms:6.2f} ms  "
            f"p99 {a.p99_ms:6.2f} ms"
        )
    ok = vs_noop >= MIN_VS_NOOP and vs_none >= MIN_VS_NONE and added <= MAX_ADDED_P99_MS
    print(
        f"mcp-epoch: {vs_noop:.2f}x the no-op store (>= {MIN_VS_NOOP}), {vs_none:.2f}x no store "
        f"(>= {MIN_VS_NONE}), p99 {added:+.2f} ms against the no-op store (<= "
        f"{MAX_ADDED_P99_MS:g}): {'met' if ok else 'MISSED'}"
    )
    errors = sum(b.errors + a.errors for r in rounds.values() for b, a in r)
    return 1 if errors else 0
