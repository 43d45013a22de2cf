"""The benchmarks keep running: ``python -m bench replica --quick`` end to end (figures are not
asserted here; targets belong to the benchmarks, never to timed tests). A change to the store
once left its replay waiting for a final response the benchmark never stored, and nothing ran
the benchmark to notice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_replica_benchmark_runs_to_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "replica", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for line in ("store_event", "replay of 3000 missed events", "resident memory"):
        assert line in out.stdout, out.stdout
