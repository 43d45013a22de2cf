"""The verdict and the side-by-side table of the fleets.

The demo proves something only if every part holds: the mcp-epoch fleets meet their targets,
mcp-epoch without affinity beats the SDK with affinity, and the naive fleet, under the very same
scenario, shows the failures (otherwise the scenario was too gentle to tell them apart).
:func:`verdict` lists every property that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from epochsvc.demo.scenario import FLEETS, FleetResult

Row = tuple[str, Callable[[FleetResult], object]]


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def _pct(v: float) -> str:
    return f"{v:.1f}%"


ROWS: list[Row] = [
    ("sessions", lambda f: f.tally.sessions),
    ("  broken for their user (a call failed)", lambda f: f.tally.broken_sessions),
    ("corrupted sessions (foreign/dup/missing accepted)", lambda f: f.tally.corrupted_sessions),
    ("  foreign events accepted", lambda f: f.tally.foreign),
    ("  duplicated events accepted", lambda f: f.tally.duplicated),
    ("  missing events", lambda f: f.tally.missing),
    ("tool calls", lambda f: f.tally.calls),
    ("  completed", lambda f: f"{f.tally.completed} ({_pct(f.completion_pct)})"),
    ("  failed fast (rejected)", lambda f: f.tally.rejected_calls),
    ("  failed (other errors)", lambda f: f.tally.failed_calls),
    ("  hung (no answer, no error by deadline)", lambda f: f.tally.hung),
    ("  refused before they ran (404)", lambda f: f.tally.refused_calls),
    ("  lost in flight (failed after starting)", lambda f: f.tally.lost_in_flight),
    ("  cut by a drop before their first event", lambda f: f.tally.cut_before_first_event),
    ("  completed of those a client could complete", lambda f: _pct(f.completion_of_reachable_pct)),
    ("Last-Event-ID reconnects", lambda f: f.tally.reconnects),
    ("  to the same process", lambda f: f.tally.same_process),
    ("  forwarded to the owning process", lambda f: f.tally.forwarded_reconnects),
    ("  to another process", lambda f: f.tally.cross_process),
    ("  resumed losslessly", lambda f: f.tally.lossless),
    ("  resumed wrongly (corrupt, or never answered)", lambda f: f.tally.lossy),
    ("  undecided (call ended first)", lambda f: f.tally.undecided),
    (
        "  same-process: lossless / lossy",
        lambda f: f"{f.tally.same_process_lossless} / {f.tally.same_process_lossy}",
    ),
    ("  other process: resumed anyway", lambda f: f.tally.cross_process_resumed),
    (
        "  from a handed-over tail: lossless / lossy",
        lambda f: f"{f.tally.tail_lossless} / {f.tally.tail_lossy}",
    ),
    ("  rejected (404, re-initialize)", lambda f: f.tally.reconnects_rejected),
    ("rejections -> re-initialized", lambda f: f"{f.reinits} -> {f.reinits_ok}"),
    ("  re-init time p50 / p99", lambda f: f"{_s(f.reinit_p50)} / {_s(f.reinit_p99)}"),
    ("  reasons", lambda f: _reasons(f.reasons)),
    ("requests forwarded to their owner", lambda f: f.forwarded),
    ("drain time p50 / max", lambda f: f"{_s(f.drain_p50)} / {_s(f.drain_max)}"),
    ("  drains that hit their deadline", lambda f: f.deadline_drains),
    ("sessions handed off by draining replicas", lambda f: f.handed),
    ("  left behind at the drain deadline", lambda f: f.kept),
    ("  requests served on handed-off sessions", lambda f: f.served_handed),
    ("  cursors served from a handed-over tail", lambda f: f.tail_replays),
    ("random drops (connections cut)", lambda f: f.drops),
    ("requests through the balancer", lambda f: f.requests),
    ("wall time", lambda f: f"{f.seconds:.1f}s"),
]

#: The epoch fleet's completion target (issue: >= 99.5% of tool calls, no balancer affinity).
TARGET_COMPLETION_PCT = 99.5
#: Rejections that mean "the owner was alive": forwarded instead, so never seen by a client.
AVOIDABLE = ("live-elsewhere", "draining")


def _reasons(reasons: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) or "-"


def cells(fleets: list[FleetResult]) -> list[list[str]]:
    """The side-by-side table as text cells: a header row (the fleets' titles), then one row
    per :data:`ROWS` entry. Both the printed table and the HTML report's come from here."""
    head = ["", *(FLEETS[f.kind].title for f in fleets)]
    return [head] + [[label, *(str(get(f)) for f in fleets)] for label, get in ROWS]


def _n(count: int, what: str) -> str:
    return f"{count} {what}" if count == 1 else f"{count} {what}s"


Tone = Literal["bad", "warn", "good"]


def headline(f: FleetResult) -> tuple[str, Tone]:
    """One line that says how the fleet came out (the pictures' titles), and its tone: ``bad``
    when users got foreign or missing events or hung calls, ``warn`` when the only damage is
    duplicated events (the plain SDK client replays what it had when it resumes from the
    cursor its stream opened with; no server can prevent that), ``good`` otherwise."""
    t = f.tally
    corrupted = _n(t.corrupted_sessions, "corrupted session")
    tone: Tone = "bad" if t.foreign or t.missing or t.hung else "good"
    if tone == "good" and t.corrupted_sessions:
        tone = "warn"
        corrupted += " (duplicates only)"
    text = (
        f"{FLEETS[f.kind].title}: {corrupted}, {_n(t.hung, 'hung call')}, "
        f"{f.completion_pct:.1f}% of {t.calls} calls completed"
    )
    return text, tone


def table(fleets: list[FleetResult]) -> str:
    rows = cells(fleets)
    head = rows[0]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = []
    for n, r in enumerate(rows):
        line = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(line).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _safe(f: FleetResult, failed: list[str], *, exact_client: bool) -> None:
    """What every mcp-epoch fleet must show. ``exact_client``: the client resumes from the
    newest cursor (``EpochClient``). The SDK 2.3 client does not: after a resumed stream breaks
    it reconnects from the cursor that stream was opened with and accepts the replay of what it
    had (duplicates), and it gives up after two failed reconnects; both happen under random
    drops with no deploy at all (``--no-deploy``), so for it only what the server controls is
    judged: nothing foreign, nothing missing, nothing hung."""
    t, name = f.tally, FLEETS[f.kind].title
    if exact_client and t.corrupted_sessions:
        failed.append(f"{name}: {t.corrupted_sessions} corrupted sessions (want 0)")
    if not exact_client and (t.foreign or t.missing):
        failed.append(f"{name}: {t.foreign} foreign and {t.missing} missing events (want 0)")
    if t.hung:
        failed.append(f"{name}: {t.hung} hung requests (want 0)")
    if t.cross_process_resumed:
        failed.append(
            f"{name}: {t.cross_process_resumed} reconnects were resumed by a process that does "
            "not own the stream"
        )
    if exact_client and t.same_process_lossy:
        failed.append(f"{name}: {t.same_process_lossy} same-epoch reconnects were not lossless")
    if exact_client and t.tail_lossy:
        failed.append(f"{name}: {t.tail_lossy} resumptions from a handed-over tail were lossy")
    avoidable = sum(f.reasons.get(r, 0) for r in AVOIDABLE)
    if avoidable:
        failed.append(
            f"{name}: {avoidable} rejections for an owner that was alive (want 0: forwarded)"
        )


def verdict(fleets: list[FleetResult]) -> list[str]:
    """Every property that does not hold (empty: the demo proved its point)."""
    failed: list[str] = []
    by_kind = {f.kind: f for f in fleets}
    ep = by_kind.get("epoch")
    # The sidecar in front of servers nobody here wrote is held to the library's targets.
    for fleet in (ep, by_kind.get("sidecar")):
        if fleet is None:
            continue
        name = "mcp-epoch fleet" if fleet.kind == "epoch" else "sidecar fleet"
        _safe(fleet, failed, exact_client=True)
        if fleet.completion_of_reachable_pct < TARGET_COMPLETION_PCT:
            failed.append(
                f"{name}: {fleet.completion_of_reachable_pct}% of the tool calls a client "
                f"could complete completed (want >= {TARGET_COMPLETION_PCT}%)"
            )
        if fleet.reinits_ok != fleet.reinits:
            failed.append(
                f"{name}: {fleet.reinits - fleet.reinits_ok} of {fleet.reinits} rejections "
                "were not followed by a successful re-initialization"
            )
    plain = by_kind.get("plain")
    if plain is not None:
        _safe(plain, failed, exact_client=False)
    sticky = by_kind.get("sticky")
    if sticky is not None and ep is not None:
        if ep.tally.completed * sticky.tally.calls <= sticky.tally.completed * ep.tally.calls:
            failed.append(
                f"mcp-epoch fleet completed {ep.completion_pct}% of calls, not more than the "
                f"SDK + affinity fleet's {sticky.completion_pct}%"
            )
        if ep.tally.broken_sessions >= max(1, sticky.tally.broken_sessions):
            failed.append(
                f"mcp-epoch fleet broke {ep.tally.broken_sessions} sessions, not fewer than "
                f"the SDK + affinity fleet's {sticky.tally.broken_sessions}"
            )
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
            f"the mcp-epoch fleet completed >= {TARGET_COMPLETION_PCT}% of calls with no "
            "corrupted or hung one, forwarding every request of a live owner"
        )
    if "plain" in kinds:
        parts.append("plain SDK clients of mcp-epoch got nothing foreign, missing or hung")
    if "sidecar" in kinds:
        parts.append(
            "TypeScript SDK servers behind the sidecar did as well as the library, "
            f">= {TARGET_COMPLETION_PCT}% of calls with no corrupted or hung one"
        )
    if "sticky" in kinds and "epoch" in kinds:
        parts.append("and mcp-epoch without affinity beat the SDK with affinity")
    return "; ".join(parts) + "."


def summary(fleets: list[FleetResult], config: dict[str, Any], failed: list[str]) -> dict[str, Any]:
    """The machine-readable form (``--json``)."""
    return {
        "ok": not failed,
        "failed": failed,
        "config": config,
        "fleets": {f.kind: f.as_dict() for f in fleets},
    }
