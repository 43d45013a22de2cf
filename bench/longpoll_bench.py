"""Long polls at scale: N replicas' live views waiting on one server, then one change.

    python -m bench longpoll [--waiters 1000,10000,15000] [--quick]

For each N, the Go load generator (bench/loadgen, far lighter than the service) holds N long
polls on one server of an epoch service on SQLite, waits until the service reports holding
them all (``epochsvc_longpoll_waiters``), issues one epoch for that server, and measures when
each waiter's answer arrives, while ``/healthz`` is probed every 10 ms the whole time (what a
readiness probe sees). The service's resident memory is sampled throughout. The baseline is
the same run with one waiter, measured in the same process of the same run.

Each N is also run against the floor (``bench/longpoll_floor.py``): a bare ASGI app on the same
uvicorn that wakes its waiters in the service's batches. What it takes is what the server, the
loop and the kernel take on this machine, so the service's figure over the floor's is the part
above them.

Targets: at 10k waiters, wake p99 < 250 ms and /healthz p99 < 50 ms; at 15k, no refused
connection on default settings and memory < 500 MB.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from bench.loadgen import run_longpoll
from bench.servers import start_server
from mcp_epoch import api
from tests.support.epochsvc_proc import EpochServiceProcess

DEFAULT_WAITERS = (1_000, 10_000, 15_000)
QUICK_WAITERS = (1_000, 3_000)
SERVER = ("bench", "lp")


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, flags=re.M)
    return int(match.group(1)) / 1024 if match else 0.0


class PeakMemory:
    """The service's peak resident memory while a run goes on (sampled every 50 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_mb(self.pid))
            self._stop.wait(0.05)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _one(svc: EpochServiceProcess, waiters: int) -> dict[str, Any]:
    ns, server = SERVER
    revision = svc.send(api.list_server(ns, server)).revision
    assert svc.proc is not None
    with PeakMemory(svc.proc.pid) as memory:
        result = run_longpoll(
            f"{svc.url}/v1/servers/{ns}/{server}/epochs?since={revision}&wait=300",
            waiters=waiters,
            trigger_url=f"{svc.url}/v1/epochs",
            trigger_body=(
                f'{{"namespace":"{ns}","server":"{server}","request_uid":"{uuid.uuid4()}"}}'
            ),
            health_url=f"{svc.url}/healthz",
            metrics_url=f"{svc.url}/metrics",
            token=svc.operator_token,
        )
    result["rss_mb"] = memory.peak
    return result


def _floor(url: str, waiters: int) -> dict[str, Any]:
    return run_longpoll(
        f"{url}/poll",
        waiters=waiters,
        trigger_url=f"{url}/change",
        trigger_body="{}",
        health_url=f"{url}/healthz",
        metrics_url=f"{url}/metrics",
        token="",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench longpoll")
    parser.add_argument("--waiters", default=",".join(map(str, DEFAULT_WAITERS)))
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK_WAITERS}")
    args = parser.parse_args(argv)
    counts = QUICK_WAITERS if args.quick else tuple(int(n) for n in args.waiters.split(","))
    rows: list[tuple[int, dict[str, Any]]] = []
    floors: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mcp-epoch-bench-") as tmp:
        svc = EpochServiceProcess(f"sqlite:///{tmp}/ledger.db", Path(tmp) / "svc.log").start()
        floor = None
        try:
            floor, floor_port = start_server("bench.longpoll_floor")
            floor_url = f"http://127.0.0.1:{floor_port}"
            _floor(floor_url, 1)  # warm, as the service is by its one-waiter baseline
            capacity = next(
                (
                    line
                    for line in Path(tmp, "svc.log").read_text().splitlines()
                    if "room for about" in line
                ),
                "",
            )
            print(f"service: {capacity.split('; ', 1)[-1]}" if capacity else "", flush=True)
            for n in (1, *counts):
                print(f"holding {n} long polls...", flush=True)
                rows.append((n, _one(svc, n)))
                if n > 1:
                    print(f"holding {n} long polls on the floor...", flush=True)
                    floors[n] = _floor(floor_url, n)
        finally:
            if floor is not None:
                floor.terminate()
                floor.wait(10)
            svc.stop()
    base = rows[0][1]
    print(
        f"{'waiters':>8} {'held':>6} {'errors':>6} {'wake p50':>9} {'wake p99':>9} "
        f"{'x base':>7} {'healthz p99':>11} {'x base':>7} {'RSS MB':>7} "
        f"{'floor p99':>9} {'x floor':>7}"
    )

    def ratio(value: float, baseline: float) -> str:
        # A baseline too fast to measure (no /healthz probe landed in its wake) has no ratio.
        return f"{value / baseline:>6.1f}x" if baseline >= 0.05 else f"{'n/a':>7}"

    for n, r in rows:
        wake_ratio = ratio(r["wake_p99_ms"], base["wake_p99_ms"])
        health_ratio = ratio(r["health_p99_ms"], base["health_p99_ms"])
        floor_p99 = floors[n]["wake_p99_ms"] if n in floors else None
        print(
            f"{n:>8} {r['registered']:>6} {r['errors']:>6} {r['wake_p50_ms']:>8.1f}m "
            f"{r['wake_p99_ms']:>8.1f}m {wake_ratio} {r['health_p99_ms']:>10.1f}m "
            f"{health_ratio} {r['rss_mb']:>7.0f} "
            + (
                f"{floor_p99:>8.1f}m {ratio(r['wake_p99_ms'], floor_p99)}"
                if floor_p99 is not None
                else f"{'-':>9} {'-':>7}"
            )
        )
        if r.get("first_error"):
            print(f"{'':>8} first error: {r['first_error']}")
    verdicts = []
    by_n = dict(rows)
    if 10_000 in by_n:
        r = by_n[10_000]
        ok = r["wake_p99_ms"] < 250 and r["health_p99_ms"] < 50
        verdicts.append(
            f"10k waiters: wake p99 {r['wake_p99_ms']:.0f} ms (< 250), /healthz p99 "
            f"{r['health_p99_ms']:.1f} ms (< 50): {'met' if ok else 'MISSED'}"
        )
    if 15_000 in by_n:
        r = by_n[15_000]
        ok = r["errors"] == 0 and r["woken"] == 15_000 and r["rss_mb"] < 500
        verdicts.append(
            f"15k waiters: {r['errors']} errors, {r['woken']} woken, {r['rss_mb']:.0f} MB "
            f"(0 errors, < 500 MB): {'met' if ok else 'MISSED'}"
        )
    print("\n".join(verdicts) or "(targets are checked at 10k and 15k waiters)")
    for n, f in sorted(floors.items()):
        print(
            f"floor at {n}: a bare ASGI app on the same uvicorn wakes them with p99 "
            f"{f['wake_p99_ms']:.0f} ms ({f['errors']} errors); the service's wake p99 is "
            f"{by_n[n]['wake_p99_ms'] / max(f['wake_p99_ms'], 1e-9):.1f}x that"
        )
    return 0 if all(v.endswith("met") for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
