"""Epoch service throughput and latency on loopback, SQLite and PostgreSQL, next to the same
server's ``/healthz`` (the framework's ceiling), measured in one run.

    python -m bench service [--seconds 3] [--rounds 5] [--quick] [--scale-out]

Issuing is a durable write; the most a write could do through the same HTTP stack is what an
in-memory lookup does, so issuing at 8 clients is judged against lookups at 8 clients, in rounds
that alternate the two (:mod:`bench.verdict`). Target on PostgreSQL: at least 0.6x. On
PostgreSQL a lookup is not in-memory: it waits for the read barrier's round trip
(``epochsvc.service.store.barrier``). So PostgreSQL's issuing is judged against the in-memory
lookups of a SQLite-backed service run beside it (the same code, answering from its copy), and
its own lookups are reported. Beside it, per group commit: writes, statements, round trips and
writer time.

Scale-out: issuing and lookups at 8 clients on two service processes sharing the PostgreSQL,
the clients spread over both, reported beside one process (``docs/scaling.md`` reads them).
Not in ``--quick`` unless ``--scale-out`` asks (:mod:`bench.scaleout`).
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx

from bench import scaleout
from bench.loadgen import Load, run
from bench.verdict import Ratio
from mcp_epoch import api
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.postgres import PostgresServer

CLIENTS = (1, 8, 32)
BACKENDS = ("sqlite", "postgres")
#: Issuing at 8 clients over lookups at 8 clients, on PostgreSQL.
ISSUE_TARGET = 0.6
SEED_EPOCHS = 256
ISSUE_BODY = '{"namespace":"bench","server":"issue","request_uid":"{n}"}'


def _seed(svc: EpochServiceProcess) -> list[str]:
    with svc.api() as c:
        return [
            c.send(api.issue("bench", "lookup", str(uuid.uuid4()))).epoch
            for _ in range(SEED_EPOCHS)
        ]


def _commit_totals(svc: EpochServiceProcess) -> dict[str, float]:
    """The group committer's counters from the service's /metrics."""
    text = httpx.get(f"{svc.url}/metrics").text
    found = re.findall(r"^epochsvc_group_(\w+)_total ([0-9.e+]+)$", text, flags=re.M)
    return {name: float(value) for name, value in found}


def commit_breakdown(before: dict[str, float], after: dict[str, float], dialect: str) -> str:
    """Where the time of one group commit went, between two readings."""
    commits = after["commits"] - before["commits"]
    if not commits:
        return "no group commit in the run"
    per = {k: (after[k] - before[k]) / commits for k in after if k != "commits"}
    # Round trips as the committer counts them: BEGIN, COMMIT and (PostgreSQL) an idle writer's ping
    # included, several statements in one when pipelined; on SQLite each is a library call.
    return (
        f"{commits:.0f} commits: {per['commit_writes']:.1f} writes, "
        f"{per['commit_statements']:.1f} statements"
        + (" (1 of them the NOTIFY)" if dialect == "postgres" else "")
        + f", {per['commit_round_trips']:.1f} round trips, "
        f"{per['commit_seconds'] * 1000:.2f} ms of the writer each"
    )


def _issue(svcs: list[EpochServiceProcess], clients: int, seconds: float) -> Load:
    return run(
        [f"{s.url}/v1/epochs" for s in svcs],
        clients=clients,
        seconds=seconds,
        method="POST",
        body=ISSUE_BODY,
        token=svcs[0].operator_token,
        status=201,
    )


def _lookup(
    svcs: list[EpochServiceProcess], epochs: list[str], clients: int, seconds: float
) -> Load:
    urls = [f"{s.url}/v1/epochs/{e}" for e in epochs for s in svcs]
    return run(urls, clients=clients, seconds=seconds, token=svcs[0].replica_token, status=200)


@dataclass
class Rounds:
    """The ratio of each round at 8 clients: issuing over the same server's lookups, and over
    the in-memory floor's when there is one (PostgreSQL)."""

    own: list[float] = field(default_factory=list)
    in_memory: list[float] = field(default_factory=list)


def _measure(
    svc: EpochServiceProcess,
    seconds: float,
    backend: str,
    rounds: int,
    floor: Callable[[], Load] | None = None,
) -> tuple[dict[tuple[str, int], Load], str, Rounds]:
    """Every op at every client count; at 8 clients, ``rounds`` alternating lookup/issue pairs
    (the table shows the last), each with ``floor``'s lookups beside it if given. Returns the
    loads, the commit breakdown, the round ratios."""
    epochs = _seed(svc)
    results: dict[tuple[str, int], Load] = {}
    breakdown = ""
    ratios = Rounds()
    for clients in CLIENTS:
        results["healthz", clients] = run([f"{svc.url}/healthz"], clients=clients, seconds=seconds)
        for rnd in range(rounds if clients == 8 else 1):
            before = _commit_totals(svc)
            beside = floor if clients == 8 else None
            if rnd % 2:
                issued = _issue([svc], clients, seconds)
                looked = _lookup([svc], epochs, clients, seconds)
                floored = beside() if beside else None
            else:
                floored = beside() if beside else None
                looked = _lookup([svc], epochs, clients, seconds)
                issued = _issue([svc], clients, seconds)
            results["lookup", clients], results["issue", clients] = looked, issued
            if clients == 8:
                ratios.own.append(issued.per_sec / max(looked.per_sec, 1e-9))
                if floored is not None:
                    ratios.in_memory.append(issued.per_sec / max(floored.per_sec, 1e-9))
                breakdown = commit_breakdown(before, _commit_totals(svc), backend)
    return results, breakdown, ratios


def _two_processes(url: str, tmp: str, seconds: float) -> dict[int, tuple[Load, Load]]:
    """Lookups and issues at 8 clients on one process, then spread over two, one database."""
    first = EpochServiceProcess(url, Path(tmp) / "pg-scale-1.log").start()
    second = EpochServiceProcess(url, Path(tmp) / "pg-scale-2.log")
    second.operator_token, second.replica_token = first.operator_token, first.replica_token
    out: dict[int, tuple[Load, Load]] = {}
    try:
        epochs = _seed(first)
        out[1] = (_lookup([first], epochs, 8, seconds), _issue([first], 8, seconds))
        second.start()
        both = [first, second]
        out[2] = (_lookup(both, epochs, 8, seconds), _issue(both, 8, seconds))
    finally:
        second.stop()
        first.stop()
    return out


def _report(backend: str, results: dict[tuple[str, int], Load]) -> list[str]:
    lines = []
    for (op, clients), load in results.items():
        ceiling = results["healthz", clients].per_sec
        ratio = ceiling / load.per_sec if load.per_sec else float("inf")
        lines.append(
            f"{backend:<9} {op:<8} {clients:>3} {load.per_sec:>9.0f} {load.p50_ms:>8.2f} "
            f"{load.p99_ms:>8.2f} {ratio:>8.2f}x {load.errors:>6}"
        )
    return lines


def _targets(backend: str, results: dict[tuple[str, int], Load], ratios: Rounds) -> list[str]:
    out = []
    for clients in CLIENTS:
        ratio = results["healthz", clients].per_sec / max(results["lookup", clients].per_sec, 1e-9)
        verdict = "met" if ratio <= 2 else "MISSED"
        out.append(
            f"check: {backend} lookups at {clients} clients are {ratio:.2f}x below /healthz "
            f"(<= 2x): {verdict}"
        )
    issue8, lookup8 = results["issue", 8], results["lookup", 8]
    kind = "in-memory lookups" if backend == "sqlite" else "lookups, each after the read barrier"
    out.append(
        f"{backend}: issuing at 8 clients {issue8.per_sec:.0f}/s, p99 {issue8.p99_ms:.1f} ms; "
        f"{kind} on the same server {lookup8.per_sec:.0f}/s"
    )
    out.append(
        f"{backend}: issuing at 8 clients is {statistics.median(ratios.own):.2f}x its own lookups "
        f"(median of {len(ratios.own)} rounds; reported, no target)"
    )
    if backend == "postgres":  # the target; SQLite's fsync is this machine's disk, reported
        ratio = Ratio(
            "postgres issuing at 8 clients",
            "in-memory lookups (a SQLite-backed service beside it)",
            tuple(ratios.in_memory),
            ISSUE_TARGET,
            False,
        )
        out.append(ratio.line())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench service")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=5, help="lookup/issue pairs at 8 clients")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    parser.add_argument("--quick", action="store_true", help="0.5 s per measurement, 3 rounds")
    scaleout.add_option(parser)
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:  # before minutes of measuring, not after
        parser.error(f"unknown backend {', '.join(unknown)}: choose from {', '.join(BACKENDS)}")
    if args.quick:
        args.seconds, args.rounds = 0.5, 3
    header = (
        f"{'backend':<9} {'op':<8} {'c':>3} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'healthz/op':>9} {'errors':>6}"
    )
    lines, verdicts, status = [header], [], 0
    with tempfile.TemporaryDirectory(prefix="mcp-epoch-bench-") as tmp:
        for backend in backends:
            pg = floor = None
            if backend == "sqlite":
                url = f"sqlite:///{tmp}/ledger.db"
            else:
                pg = PostgresServer().start()
                url = pg.new_database()
                floor = EpochServiceProcess(f"sqlite:///{tmp}/floor.db", Path(tmp) / "floor.log")
            svc = EpochServiceProcess(url, Path(tmp) / f"{backend}.log").start()
            scale: dict[int, tuple[Load, Load]] = {}
            try:
                print(f"measuring {backend}...", flush=True)
                in_memory = None
                if floor is not None:
                    floor_epochs = _seed(floor.start())
                    in_memory = partial(_lookup, [floor], floor_epochs, 8, args.seconds)
                results, breakdown, ratios = _measure(
                    svc, args.seconds, backend, args.rounds, in_memory
                )
                svc.stop()
                if floor is not None:
                    floor.stop()  # neither takes the machine from the scale-out run
                if pg is not None and scaleout.wanted(args):
                    print("measuring two service processes on one PostgreSQL...", flush=True)
                    scale = _two_processes(pg.new_database(), tmp, args.seconds)
            finally:
                svc.stop()
                if floor is not None:
                    floor.stop()
                if pg:
                    pg.stop()
            lines += _report(backend, results)
            verdicts += _targets(backend, results, ratios)
            status |= any(v.endswith("MISSED") for v in verdicts)
            verdicts.append(f"{backend}: per group commit while issuing at 8 clients: {breakdown}")
            if pg is not None and not scale:
                verdicts.append(scaleout.SKIPPED)
            for procs, (looked, issued) in scale.items():
                verdicts.append(
                    f"{backend}, {procs} service process{'es' if procs > 1 else ''}: lookups "
                    f"{looked.per_sec:.0f}/s, issues {issued.per_sec:.0f}/s (p99 "
                    f"{issued.p99_ms:.1f} ms) at 8 clients"
                )
    print("\n".join(lines))
    print()
    print("\n".join(verdicts))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
