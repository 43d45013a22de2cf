"""The benchmarks keep running: ``python -m bench replica --quick`` end to end, and the guard
benchmark's server and its instruction count (figures are not asserted here; targets belong to
the benchmarks, never to timed tests). A change to the store once left its replay waiting for a
final response the benchmark never stored, and nothing ran the benchmark to notice."""

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


def test_the_guard_benchmark_server_serves_its_three_variants_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """One ``bench.guard_server`` process serves mcp-epoch (on a real epoch service), the
    no-op store and no store, each streaming a tool call's progress and answer, and all three
    stop on one SIGTERM (each uvicorn server would otherwise take the signal for itself)."""
    from bench.guard_bench import _session_headers, _start, pod_env
    from bench.guard_server import VARIANTS
    from mcp_epoch.contract import ENV_EPOCH
    from tests.support.epochsvc_proc import EpochServiceProcess

    with EpochServiceProcess(f"sqlite:///{tmp_path}/ledger.db", tmp_path / "svc.log") as svc:
        env = pod_env(svc, 0)
        epoch = env[ENV_EPOCH]  # the pod epoch: its processes are <epoch>.<incarnation>
        proc, urls = _start(env)
        try:
            assert set(urls) == set(VARIANTS)
            shown = {v: _session_headers(urls[v], 3)["mcp-session-id"] for v in VARIANTS}
            # Only the mcp-epoch variant shows its clients a session ID naming its epoch.
            assert shown["epoch"].startswith(f"{epoch}."), shown
            assert not shown["noop"].startswith(f"{epoch}."), shown
        finally:
            proc.terminate()
            assert proc.wait(30) == 0


def test_the_guard_benchmark_counts_instructions_per_call_of_each_variant() -> None:
    """``python -m bench guard --instructions`` runs the server under callgrind and counts
    each variant's phases alone: a figure per phase and per variant, and the line that sets
    mcp-epoch's beside the no-op store's."""
    out = subprocess.run(
        [sys.executable, "-m", "bench", "guard", "--instructions", "--phase-seconds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    phases = [line.split() for line in out.stdout.splitlines() if line.endswith(" M")]
    counted = [p for p in phases if p[0] in ("none", "noop", "epoch") and p[2] == "calls"]
    assert [p[0] for p in counted] == ["noop", "epoch", "none", "epoch", "noop"], out.stdout
    assert all(int(p[1]) > 0 and float(p[3]) > 0 for p in counted), out.stdout
    assert "instructions: mcp-epoch" in out.stdout, out.stdout
