"""The verdict and the side-by-side table of the two fleets.

The demo proves something only if both halves hold: the mcp-epoch fleet shows none of the
failures, and the naive fleet, under the very same scenario, shows them (otherwise the scenario
was too gentle to tell the two apart). :func:`verdict` lists every property that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from epochsvc.demo.scenario import FleetResult

Row = tuple[str, Callable[[FleetResult], object]]


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


ROWS: list[Row] = [
    ("sessions", lambda f: f.tally.sessions),
    ("corrupted sessions (foreign/dup/missing accepted)", lambda f: f.tally.corrupted_sessions),
    ("  foreign events accepted", lambda f: f.tally.foreign),
    ("  duplicated events accepted", lambda f: f.tally.duplicated),
    ("  missing events", lambda f: f.tally.missing),
    ("tool calls", lambda f: f.tally.calls),
    ("  completed", lambda f: f.tally.completed),
    ("  failed fast (rejected)", lambda f: f.tally.rejected_calls),
    ("  failed (other errors)", lambda f: f.tally.failed_calls),
    ("  hung (no answer, no error by deadline)", lambda f: f.tally.hung),
    ("Last-Event-ID reconnects", lambda f: f.tally.reconnects),
    ("  to the same process", lambda f: f.tally.same_process),
    ("  to another process", lambda f: f.tally.cross_process),
    ("  resumed losslessly", lambda f: f.tally.lossless),
    ("  resumed wrongly (corrupt, or never answered)", lambda f: f.tally.lossy),
    ("  undecided (call ended first)", lambda f: f.tally.undecided),
    (
        "  same-process: lossless / lossy",
        lambda f: f"{f.tally.same_process_lossless} / {f.tally.same_process_lossy}",
    ),
    ("  other process: resumed anyway", lambda f: f.tally.cross_process_resumed),
    ("  rejected (404, re-initialize)", lambda f: f.tally.reconnects_rejected),
    ("rejections -> re-initialized", lambda f: f"{f.reinits} -> {f.reinits_ok}"),
    ("  re-init time p50 / p99", lambda f: f"{_s(f.reinit_p50)} / {_s(f.reinit_p99)}"),
    ("random drops (connections cut)", lambda f: f.drops),
    ("requests through the balancer", lambda f: f.requests),
    ("wall time", lambda f: f"{f.seconds:.1f}s"),
]


def table(fleets: list[FleetResult]) -> str:
    head = ["", *(("naive fleet" if f.kind == "naive" else "mcp-epoch fleet") for f in fleets)]
    rows = [head] + [[label, *(str(get(f)) for f in fleets)] for label, get in ROWS]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for n, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def verdict(fleets: list[FleetResult]) -> list[str]:
    """Every property that does not hold (empty: the demo proved its point)."""
    failed: list[str] = []
    by_kind = {f.kind: f for f in fleets}
    ep = by_kind.get("epoch")
    if ep is not None:
        t = ep.tally
        if t.corrupted_sessions:
            failed.append(f"mcp-epoch fleet: {t.corrupted_sessions} corrupted sessions (want 0)")
        if t.hung:
            failed.append(f"mcp-epoch fleet: {t.hung} hung requests (want 0)")
        if ep.reinits_ok != ep.reinits:
            failed.append(
                f"mcp-epoch fleet: {ep.reinits - ep.reinits_ok} of {ep.reinits} rejections "
                "were not followed by a successful re-initialization"
            )
        if t.cross_process_resumed:
            failed.append(
                f"mcp-epoch fleet: {t.cross_process_resumed} reconnects to another process "
                "were resumed instead of rejected"
            )
        if t.same_process_lossy:
            failed.append(
                f"mcp-epoch fleet: {t.same_process_lossy} same-epoch reconnects were not lossless"
            )
        if not t.same_process_lossless:
            failed.append("mcp-epoch fleet: no same-epoch reconnect happened (nothing to show)")
    nv = by_kind.get("naive")
    if nv is not None:
        if not nv.tally.corrupted_sessions:
            failed.append("naive fleet: no corrupted session: the scenario is too gentle")
        if not nv.tally.hung:
            failed.append("naive fleet: no hung request: the scenario is too gentle")
    return failed


def success_line(kinds: set[str]) -> str:
    """What a clean verdict proved, for the fleets that actually ran."""
    parts = []
    if "naive" in kinds:
        parts.append("the naive fleet corrupted sessions and hung requests")
    if "epoch" in kinds:
        parts.append(
            "the mcp-epoch fleet had none, re-initialized after every rejection and resumed "
            "same-epoch reconnects losslessly"
        )
    return "; ".join(parts) + "."


def summary(fleets: list[FleetResult], config: dict[str, Any], failed: list[str]) -> dict[str, Any]:
    """The machine-readable form (``--json``)."""
    return {
        "ok": not failed,
        "failed": failed,
        "config": config,
        "fleets": {f.kind: f.as_dict() for f in fleets},
    }
