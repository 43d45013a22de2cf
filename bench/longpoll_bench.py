"""Long polls at scale: N replicas' live views waiting on one server, then one change.

    python -m bench longpoll [--waiters 1000,10000,15000] [--rounds 5] [--quick] [--scale-out]

For each N, the Go load generator (bench/loadgen, far lighter than the service) holds N long
polls on one server of an epoch service on SQLite, waits until the service reports holding
them all (``epochsvc_longpoll_waiters``), issues one epoch for that server, and measures when
each waiter's answer arrives, while ``/healthz`` is probed every 10 ms the whole time (what a
readiness probe sees). The service's resident memory is sampled throughout. The baseline is
the same run with one waiter, measured in the same process of the same run.

Each N is also run against the floor (``bench/longpoll_floor.py``): a bare ASGI app on the same
uvicorn that wakes its waiters in the service's batches. What it takes is what the server, the
loop and the kernel take on this machine, so the service's figure over the floor's is the part
above them. At the judged N (10k; 3k in ``--quick``) the two alternate for ``--rounds``
rounds, and the verdict reads the ratio of each round (:mod:`bench.verdict`).

Target: wake p99 at most 1.3x the floor's. Checked too: at the largest N, no refused
connection on default settings and memory under 500 MB.

Scale-out: the same waiters on PostgreSQL, held by one service process and then spread over
two processes sharing the database (the change is made through one; the other hears it from
PostgreSQL), reported side by side (``docs/scaling.md`` reads them). Not in ``--quick``
unless ``--scale-out`` asks (:mod:`bench.scaleout`).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

from bench import scaleout
from bench.loadgen import run_longpoll
from bench.servers import start_server
from bench.verdict import Ratio
from mcp_epoch import api
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.postgres import PostgresServer

DEFAULT_WAITERS = (1_000, 10_000, 15_000)
QUICK_WAITERS = (1_000, 3_000)
#: The waiter count whose ratio to the floor is judged, in rounds.
JUDGED, QUICK_JUDGED = 10_000, 3_000
TARGET = 1.3
MAX_RSS_MB = 500
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


def _services_poll(svcs: list[EpochServiceProcess], waiters: int) -> dict[str, Any]:
    """``waiters`` long polls spread over ``svcs`` (one database), one change through the
    first; the result of the load generator, with the peak RSS of the first."""
    ns, server = SERVER
    first = svcs[0]
    revision = first.send(api.list_server(ns, server)).revision
    assert first.proc is not None
    path = f"/v1/servers/{ns}/{server}/epochs?since={revision}&wait=300"
    with PeakMemory(first.proc.pid) as memory:
        result = run_longpoll(
            ",".join(f"{s.url}{path}" for s in svcs),
            waiters=waiters,
            trigger_url=f"{first.url}/v1/epochs",
            trigger_body=(
                f'{{"namespace":"{ns}","server":"{server}","request_uid":"{uuid.uuid4()}"}}'
            ),
            health_url=f"{first.url}/healthz",
            metrics_url=",".join(f"{s.url}/metrics" for s in svcs),
            token=first.operator_token,
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


def _start_floor() -> tuple[Any, str]:
    proc, port = start_server("bench.longpoll_floor")
    url = f"http://127.0.0.1:{port}"
    _floor(url, 1)  # warm, as the service is by its one-waiter baseline
    return proc, url


def _sqlite(
    tmp: str, counts: tuple[int, ...], judged: int, rounds: int
) -> tuple[list[tuple[int, dict[str, Any]]], dict[int, dict[str, Any]], list[float]]:
    """Each N on the service (SQLite) and on the floor; ``rounds`` alternating pairs at
    ``judged``. Returns the rows (the judged N's median round), the floors, the ratios."""
    svc = EpochServiceProcess(f"sqlite:///{tmp}/ledger.db", Path(tmp) / "svc.log").start()
    floor = None
    rows: list[tuple[int, dict[str, Any]]] = []
    floors: dict[int, dict[str, Any]] = {}
    ratios: list[float] = []
    try:
        floor, floor_url = _start_floor()
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
            if n == 1:
                rows.append((n, _services_poll([svc], n)))
                continue
            pairs = []
            for rnd in range(rounds if n == judged else 1):
                print(f"holding {n} long polls, service and floor (round {rnd + 1})", flush=True)
                if rnd % 2:
                    f = _floor(floor_url, n)
                    r = _services_poll([svc], n)
                else:
                    r = _services_poll([svc], n)
                    f = _floor(floor_url, n)
                pairs.append((r, f))
                if n == judged:
                    ratios.append(r["wake_p99_ms"] / max(f["wake_p99_ms"], 1e-9))
                    print(
                        f"  wake p99: service {r['wake_p99_ms']:.1f} ms, floor "
                        f"{f['wake_p99_ms']:.1f} ms ({ratios[-1]:.2f}x)",
                        flush=True,
                    )
            pairs.sort(key=lambda p: p[0]["wake_p99_ms"] / max(p[1]["wake_p99_ms"], 1e-9))
            r, f = pairs[len(pairs) // 2]
            rows.append((n, r))
            floors[n] = f
    finally:
        if floor is not None:
            floor.terminate()
            floor.wait(10)
        svc.stop()
    return rows, floors, ratios


def _postgres(tmp: str, waiters: int) -> dict[int, dict[str, Any]]:
    """``waiters`` on one service process on PostgreSQL, then spread over two."""
    pg = PostgresServer().start()
    out: dict[int, dict[str, Any]] = {}
    try:
        url = pg.new_database()
        first = EpochServiceProcess(url, Path(tmp) / "pg-1.log").start()
        second = EpochServiceProcess(url, Path(tmp) / "pg-2.log")
        second.operator_token, second.replica_token = first.operator_token, first.replica_token
        try:
            _services_poll([first], 1)  # warm, as the SQLite run is by its one-waiter baseline
            print(f"holding {waiters} long polls on one process on PostgreSQL", flush=True)
            out[1] = _services_poll([first], waiters)
            second.start()
            _services_poll([second], 1)
            print(f"holding {waiters} long polls over two processes on PostgreSQL", flush=True)
            out[2] = _services_poll([first, second], waiters)
        finally:
            second.stop()
            first.stop()
    finally:
        pg.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench longpoll")
    parser.add_argument("--waiters", default=",".join(map(str, DEFAULT_WAITERS)))
    parser.add_argument("--rounds", type=int, default=5, help="service/floor pairs judged")
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK_WAITERS}, 5 rounds")
    scaleout.add_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        counts, judged, rounds = QUICK_WAITERS, QUICK_JUDGED, 5
    else:
        counts = tuple(int(n) for n in args.waiters.split(","))
        judged = JUDGED if JUDGED in counts else max(counts)
        rounds = args.rounds
    with tempfile.TemporaryDirectory(prefix="mcp-epoch-bench-") as tmp:
        rows, floors, ratios = _sqlite(tmp, counts, judged, rounds)
        scale = _postgres(tmp, judged) if scaleout.wanted(args) else {}
    base = rows[0][1]
    print(
        f"{'waiters':>8} {'held':>6} {'errors':>6} {'wake p50':>9} {'wake p99':>9} "
        f"{'healthz p99':>11} {'RSS MB':>7} {'floor p99':>9} {'x floor':>7} {'floor hz99':>10}"
    )
    for n, r in rows:
        f = floors.get(n)
        print(
            f"{n:>8} {r['registered']:>6} {r['errors']:>6} {r['wake_p50_ms']:>8.1f}m "
            f"{r['wake_p99_ms']:>8.1f}m {r['health_p99_ms']:>10.1f}m {r['rss_mb']:>7.0f} "
            + (
                f"{f['wake_p99_ms']:>8.1f}m {r['wake_p99_ms'] / max(f['wake_p99_ms'], 1e-9):>6.2f}x"
                f" {f['health_p99_ms']:>9.1f}m"
                if f is not None
                else f"{'-':>9} {'-':>7} {'-':>10}"
            )
        )
        if r.get("first_error"):
            print(f"{'':>8} first error: {r['first_error']}")
    print(f"(the one-waiter baseline: wake p99 {base['wake_p99_ms']:.1f} ms)")
    print(
        f"scale-out on PostgreSQL, {judged} waiters on one server, one change:"
        if scale
        else scaleout.SKIPPED
    )
    for procs, r in scale.items():
        print(
            f"  {procs} service process{'es' if procs > 1 else ''}: {r['registered']} held, "
            f"{r['errors']} errors, wake p50 {r['wake_p50_ms']:.1f} ms, p99 "
            f"{r['wake_p99_ms']:.1f} ms, /healthz p99 {r['health_p99_ms']:.1f} ms, first "
            f"process RSS {r['rss_mb']:.0f} MB"
        )
    largest_n, largest = rows[-1]
    held_ok = (
        largest["errors"] == 0 and largest["woken"] == largest_n and largest["rss_mb"] < MAX_RSS_MB
    )
    print(
        f"check: {largest_n} waiters: {largest['errors']} errors, {largest['woken']} woken, "
        f"{largest['rss_mb']:.0f} MB (0 errors, < {MAX_RSS_MB} MB): "
        f"{'met' if held_ok else 'MISSED'}"
    )
    ratio = Ratio(
        f"wake p99 of {judged} long polls", "a bare ASGI app's", tuple(ratios), TARGET, True
    )
    print(ratio.line())
    return 0 if held_ok and ratio.verdict != "MISSED" else 1


if __name__ == "__main__":
    raise SystemExit(main())
