"""`mcp-epoch demo` as a real subprocess, small: the naive fleet, the library's and the sidecar's
(TypeScript SDK servers behind it), the verdict read from its JSON, and the report it draws."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).with_name("mcp-epoch")


def test_demo_small_run_proves_the_point(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    report = tmp_path / "report"
    cmd = [str(CLI), "demo", "--clients", "12", "--replicas", "3", "--duration", "8"]
    cmd += ["--seed", "3", "--fleets", "naive,epoch,sidecar", "--json", str(out)]
    cmd += ["--report", str(report)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    print(proc.stdout)  # both fleets' table lands in the test output (pytest -s / on failure)
    print(proc.stderr[-3000:], file=sys.stderr)
    summary = json.loads(out.read_text())
    fleets = summary["fleets"]
    naive = fleets["naive"]
    for name, f in (
        ("naive", naive),
        ("mcp-epoch", fleets["epoch"]),
        ("sidecar", fleets["sidecar"]),
    ):
        print(
            f"{name}: sessions={f['sessions']} corrupted={f['corrupted_sessions']} "
            f"hung={f['hung']} rejections={f['rejections']} reinits_ok={f['reinits_ok']} "
            f"same-process lossless/lossy={f['same_process_lossless']}/"
            f"{f['same_process_lossy']} reinit p50/p99={f['reinit_p50_s']}/{f['reinit_p99_s']}"
        )
    # The naive fleet shows the failure, or the scenario proves nothing.
    assert naive["corrupted_sessions"] > 0 and naive["hung"] > 0
    for kind in ("epoch", "sidecar"):
        _shows_none_of_it(fleets[kind])
    # The verdict's completion target (>= 99.5 % of calls) is a rate over the full scenario
    # (docs: 10 seeds of ~500 calls); this small run has under 100 calls, where one lost call
    # is already 1 %, so here every other verdict line must hold and the rate is reported.
    rate = "of the tool calls a client could complete completed"
    assert [line for line in summary["failed"] if rate not in line] == [], summary["failed"]
    for kind in ("epoch", "sidecar"):
        print(
            f"{kind} completion of reachable calls: {fleets[kind]['completion_of_reachable_pct']}%"
        )
        _timeline_matches_the_figures(fleets[kind], replicas=3)
    _timeline_matches_the_figures(naive, replicas=3)
    # The report: its page (whose path the demo prints last but one) and a picture per fleet.
    assert f"report: {(report / 'index.html').resolve()}" in proc.stdout
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert pngs == ["overview.png", *(f"timeline-{k}.png" for k in ("epoch", "naive", "sidecar"))]
    assert all((report / p).stat().st_size > 10_000 for p in pngs)
    assert "sidecar, TS servers" in (report / "index.html").read_text()


def _timeline_matches_the_figures(fleet: dict[str, Any], replicas: int) -> None:
    """The timeline the client and the fleet stamped holds every call the tally counted, and
    each replacement of a replica inside the deploy's window."""
    tl = fleet["timeline"]
    per = tl["per_second"]
    calls = sum(sum(per[k]) for k in ("completed", "corrupted", "failed", "hung"))
    assert calls == fleet["calls"]
    assert sum(per["completed"]) + sum(per["corrupted"]) == fleet["completed"]
    assert sum(per["hung"]) == fleet["hung"]
    start, end = tl["deploy_s"]
    assert start == 0.0 and len(tl["replaced_s"]) == replicas
    assert all(start <= t <= end for t in tl["replaced_s"])


def _shows_none_of_it(epoch: dict[str, Any]) -> None:
    """What the library's fleet shows, and the sidecar's the same."""
    assert epoch["corrupted_sessions"] == 0
    assert epoch["hung"] == 0
    # A planned deploy moves sessions rather than ending them: the drained replicas handed
    # theirs on, calls followed them, and none was refused before it ran; any rejection left
    # (an owner that was gone) was followed by a new session.
    assert epoch["sessions_handed_off"] > 0 and epoch["handed_off_session_requests"] > 0
    assert epoch["failure_causes"]["refused_before_they_ran"] == 0
    assert epoch["reinits_ok"] == epoch["rejections"]
    assert epoch["cross_process_resumed"] == 0
    assert epoch["same_process_lossless"] > 0 and epoch["same_process_lossy"] == 0
