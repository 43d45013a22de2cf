"""``python -m tests.robustness``: every fault as its own checked history, and a table.

Exits non-zero on any history that is not linearizable (or that the checker could not
decide), any response with status 500, or any acknowledged epoch lost. ``make robustness``
runs it at full size; ``make test`` runs a short version (``tests/robustness/test_faults.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tests.robustness import linearizability
from tests.robustness.faults import SCENARIOS, Result, run
from tests.robustness.history import load


def table(results: list[Result]) -> str:
    rows = [
        ("fault", "backend", "ops", "unknown", "5xx by code", "recovered in", "linearizable"),
    ]
    for r in results:
        errors = ", ".join(f"{n} x {k}" for k, n in sorted(r.errors_5xx.items())) or "0"
        recovery = "-" if r.recovery_s is None else f"{r.recovery_s * 1000:.0f} ms"
        verdict = "yes" if r.ok else "NO"
        rows.append(
            (r.scenario.name, r.scenario.backend, str(r.operations), str(r.unknown), errors,
             recovery, verdict)
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.robustness", description=__doc__)
    parser.add_argument("--operations", type=int, default=10_000, help="per history")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="run only the faults whose name contains this")
    parser.add_argument("--backend", choices=("sqlite", "postgres"))
    parser.add_argument("--keep", action="store_true", help="keep the work folders")
    parser.add_argument(
        "--check", type=Path, metavar="HISTORY", help="only check a kept history.jsonl again"
    )
    args = parser.parse_args(argv)
    if args.check is not None:
        verdict = linearizability.check(load(args.check))
        for problem in verdict.problems:
            print(f"PROBLEM: {problem}")
        print(f"{args.check}: {'linearizable' if verdict.ok else 'NOT linearizable'}")
        return 0 if verdict.ok else 1
    chosen = [
        s
        for s in SCENARIOS
        if (args.only is None or args.only in s.name)
        and (args.backend is None or s.backend == args.backend)
    ]
    print(f"robustness: {len(chosen)} histories of {args.operations} operations, seed {args.seed}")
    results = []
    for scenario in chosen:
        t0 = time.monotonic()
        workdir = Path(tempfile.mkdtemp(prefix="mcp-epoch-robust-"))
        r = await run(
            scenario,
            args.operations,
            workdir,
            seed=args.seed,
            progress=lambda line: print(line, file=sys.stderr),
        )
        if r.ok and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"  kept {workdir} (the history and the service logs)", file=sys.stderr)
        results.append(r)
        took = time.monotonic() - t0
        checked = "" if r.verdict is None else f", checked in {r.verdict.seconds:.1f}s"
        print(f"{scenario.name} ({scenario.backend}): {took:.0f}s{checked}", file=sys.stderr)
        for problem in r.problems:
            print(f"  PROBLEM: {problem}", file=sys.stderr)
    print(table(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
