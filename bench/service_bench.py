"""Epoch service throughput and latency on loopback, SQLite and PostgreSQL, next to the same
server's ``/healthz`` (the framework's ceiling), measured in one run.

    python -m bench service [--seconds 3]
"""

from __future__ import annotations

import argparse
import re
import tempfile
import uuid
from pathlib import Path

import httpx

from bench.loadgen import Load, run
from mcp_epoch import api
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.postgres import PostgresServer

CLIENTS = (1, 8, 32)
#: Durable issues a second at 8 clients.
ISSUE_TARGETS = {"sqlite": 1000, "postgres": 3000}
SEED_EPOCHS = 256


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
    # Round trips as the committer counts them: BEGIN, COMMIT and (PostgreSQL) the pool's ping
    # included, several statements in one when pipelined; on SQLite each is a library call.
    return (
        f"{commits:.0f} commits: {per['commit_writes']:.1f} writes, "
        f"{per['commit_statements']:.1f} statements"
        + (" (1 of them the NOTIFY)" if dialect == "postgres" else "")
        + f", {per['commit_round_trips']:.1f} round trips, "
        f"{per['commit_seconds'] * 1000:.2f} ms of the writer each"
    )


def _measure(
    svc: EpochServiceProcess, seconds: float, backend: str
) -> tuple[dict[tuple[str, int], Load], str]:
    lookups = [f"{svc.url}/v1/epochs/{e}" for e in _seed(svc)]
    results: dict[tuple[str, int], Load] = {}
    breakdown = ""
    for clients in CLIENTS:
        results["healthz", clients] = run([f"{svc.url}/healthz"], clients=clients, seconds=seconds)
        results["lookup", clients] = run(
            lookups, clients=clients, seconds=seconds, token=svc.replica_token, status=200
        )
        before = _commit_totals(svc)
        results["issue", clients] = run(
            [f"{svc.url}/v1/epochs"],
            clients=clients,
            seconds=seconds,
            method="POST",
            body='{"namespace":"bench","server":"issue","request_uid":"{n}"}',
            token=svc.operator_token,
            status=201,
        )
        if clients == 8:
            breakdown = commit_breakdown(before, _commit_totals(svc), backend)
    return results, breakdown


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


def _targets(backend: str, results: dict[tuple[str, int], Load]) -> list[str]:
    out = []
    for clients in CLIENTS:
        ratio = results["healthz", clients].per_sec / max(results["lookup", clients].per_sec, 1e-9)
        verdict = "met" if ratio <= 2 else "MISSED"
        out.append(
            f"{backend}: lookups at {clients} clients are {ratio:.2f}x below /healthz "
            f"(target <= 2x): {verdict}"
        )
    issue8 = results["issue", 8]
    floor = ISSUE_TARGETS[backend]
    verdict = "met" if issue8.per_sec >= floor and issue8.p99_ms < 20 else "MISSED"
    ceiling = results["lookup", 8].per_sec
    out.append(
        f"{backend}: issuing at 8 clients {issue8.per_sec:.0f}/s, p99 {issue8.p99_ms:.1f} ms "
        f"(target >= {floor}/s, p99 < 20 ms): {verdict}; that is "
        f"{issue8.per_sec / max(ceiling, 1e-9):.2f}x the same server's in-memory lookups "
        f"({ceiling:.0f}/s), the most a write could do through the same HTTP stack"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench service")
    parser.add_argument("--seconds", type=float, default=3.0, help="per measurement")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated")
    parser.add_argument("--quick", action="store_true", help="0.5 s per measurement")
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    unknown = [b for b in backends if b not in ISSUE_TARGETS]
    if unknown:  # before minutes of measuring, not after
        parser.error(
            f"unknown backend {', '.join(unknown)}: choose from {', '.join(ISSUE_TARGETS)}"
        )
    if args.quick:
        args.seconds = 0.5
    header = (
        f"{'backend':<9} {'op':<8} {'c':>3} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'healthz/op':>9} {'errors':>6}"
    )
    lines, verdicts = [header], []
    with tempfile.TemporaryDirectory(prefix="mcp-epoch-bench-") as tmp:
        for backend in backends:
            pg = None
            if backend == "sqlite":
                url = f"sqlite:///{tmp}/ledger.db"
            else:
                pg = PostgresServer().start()
                url = pg.new_database()
            svc = EpochServiceProcess(url, Path(tmp) / f"{backend}.log").start()
            try:
                print(
                    f"measuring {backend} ({len(CLIENTS) * 3} runs of {args.seconds:g}s)...",
                    flush=True,
                )
                results, breakdown = _measure(svc, args.seconds, backend)
            finally:
                svc.stop()
                if pg:
                    pg.stop()
            lines += _report(backend, results)
            verdicts += _targets(backend, results)
            verdicts.append(f"{backend}: per group commit while issuing at 8 clients: {breakdown}")
    print("\n".join(lines))
    print()
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
