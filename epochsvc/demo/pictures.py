"""The report's pictures, drawn with matplotlib (the optional extra ``mcp-epoch[report]``).

Only :mod:`epochsvc.demo.report_page` imports this module, and only once ``--report`` was
asked for, so ``mcp-epoch`` never loads matplotlib otherwise. Figures are built through the
object API on the Agg canvas (no pyplot, no GUI backend, no global state).

Every picture shares one time axis, seconds from the rolling deploy's start, and one y scale,
so fleets compare at a glance: calls that completed cleanly rise above the zero line (green),
calls that completed with foreign, duplicated or missing events stack on them (orange), calls
that failed (red) or hung (black) hang below it; the deploy's window is shaded and each
replacement of a replica is a dashed line.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

from epochsvc.demo.report import headline
from epochsvc.demo.scenario import FleetResult
from epochsvc.demo.timeline import ReplicaSpan, Series, Timeline, per_second

COMPLETED = "#2e9e4f"
CORRUPTED = "#f28e2b"
FAILED = "#d62728"
HUNG = "#222222"
REJECTED = "#1f6fb4"
FORWARDED = "#9467bd"
DEPLOY = "#e6e6e6"
REPLACED = "#555555"
TITLE = {"bad": "#b01c1c", "warn": "#a35a00", "good": "#1d7a3a"}
LANE = {"starting": "#c9d6e8", "serving": "#8cc79f", "retiring": "#f5c58a"}
#: The resolution PNGs are saved at: sharp on a laptop screen, small enough for a README.
DPI = 100


@dataclass(frozen=True)
class Scale:
    """What every picture of one report shares: the x range (seconds from the deploy's start)
    and the largest count per second above and below the zero line, and of responses."""

    left: float
    right: float
    up: int
    down: int
    responses: int


def scale_of(series: Sequence[Series]) -> Scale:
    """The common scale of these fleets' series."""
    left = min((s.start for s in series), default=0.0)
    right = max((s.start + len(s) * s.width for s in series), default=1.0)
    up = max(
        (c + k for s in series for c, k in zip(s.completed, s.corrupted, strict=True)), default=0
    )
    down = max((f + h for s in series for f, h in zip(s.failed, s.hung, strict=True)), default=0)
    resp = max((max(s.rejections + s.forwards, default=0) for s in series), default=0)
    return Scale(left, right, max(1, up), max(1, down), max(1, resp))


def _shift(tl: Timeline, t: float) -> float:
    return t - tl.zero


def _mark_deploy(ax: Axes, tl: Timeline, *, label: bool) -> None:
    """Shade the deploy's window and draw each replacement (a replica taken out)."""
    if tl.deploy is not None:
        ax.axvspan(_shift(tl, tl.deploy[0]), _shift(tl, tl.deploy[1]), color=DEPLOY, zorder=0)
        if label:
            ax.text(
                _shift(tl, tl.deploy[0]) + 0.2,
                0.97,
                "rolling deploy",
                transform=ax.get_xaxis_transform(),
                va="top",
                fontsize=8,
                color="#666666",
            )
    for t in tl.replacements:
        ax.axvline(_shift(tl, t), color=REPLACED, lw=0.9, ls=(0, (4, 3)), zorder=1)


def _calls(ax: Axes, fleet: FleetResult, series: Series, scale: Scale) -> None:
    """Calls per second: completed (clean, then corrupted) up, failed and hung down."""
    edges = [*series.lefts, series.start + len(series) * series.width]
    up = [c + k for c, k in zip(series.completed, series.corrupted, strict=True)]
    failed = [-n for n in series.failed]
    down = [f - h for f, h in zip(failed, series.hung, strict=True)]
    ax.stairs(series.completed, edges, fill=True, color=COMPLETED, lw=0, zorder=2)
    ax.stairs(up, edges, baseline=series.completed, fill=True, color=CORRUPTED, lw=0, zorder=2)
    ax.stairs(failed, edges, fill=True, color=FAILED, lw=0, zorder=2)
    ax.stairs(down, edges, baseline=failed, fill=True, color=HUNG, lw=0, zorder=2)
    ax.axhline(0, color="#999999", lw=0.8, zorder=1)
    ax.set_ylim(-scale.down * 1.15, scale.up * 1.15)
    ax.set_xlim(scale.left, scale.right)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{abs(v):g}"))
    ax.set_ylabel("calls / s", fontsize=8)
    ax.tick_params(labelsize=8)
    _mark_deploy(ax, fleet.timeline, label=True)
    text, tone = headline(fleet)
    ax.set_title(text, loc="left", fontsize=10, fontweight="bold", color=TITLE[tone])
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _legend(fig: Figure, *, detail: bool) -> None:
    """One legend per figure, above it (never over the data)."""
    handles: list[Artist] = [
        Patch(color=COMPLETED, label="completed"),
        Patch(color=CORRUPTED, label="completed with wrong events (corrupted)"),
        Patch(color=FAILED, label="failed (client told)"),
        Patch(color=HUNG, label="hung (no answer by its deadline)"),
        Patch(color=DEPLOY, label="rolling deploy"),
        Line2D([], [], color=REPLACED, lw=0.9, ls=(0, (4, 3)), label="a replica replaced"),
    ]
    if detail:
        handles += [
            Line2D([], [], color=REJECTED, lw=1.5, label="resumptions rejected / s"),
            Line2D([], [], color=FORWARDED, lw=1.5, label="responses forwarded to the owner / s"),
            *(Patch(color=c, label=f"replica {k}") for k, c in LANE.items()),
            Line2D([], [], color=FAILED, marker="x", lw=0, mew=2, label="replica killed"),
        ]
    fig.legend(
        handles=handles,
        loc="outside upper center",
        ncols=4 if detail else 3,
        fontsize=8,
        frameon=False,
    )


def overview(fleets: Sequence[FleetResult]) -> Figure:
    """Every fleet's calls per second, one row each, on one axis and one y scale."""
    series = [per_second(f.timeline) for f in fleets]
    scale = scale_of(series)
    fig = Figure(figsize=(10, 0.9 + 1.75 * len(fleets)), layout="constrained")
    axes = fig.subplots(len(fleets), 1, sharex=True, squeeze=False)[:, 0]
    for ax, fleet, s in zip(axes, fleets, series, strict=True):
        _calls(ax, fleet, s, scale)
    axes[-1].set_xlabel("seconds from the start of the rolling deploy", fontsize=9)
    _legend(fig, detail=False)
    return fig


def fleet_figure(fleet: FleetResult, scale: Scale) -> Figure:
    """One fleet in detail: its calls, the rejections and forwards its clients were answered
    with, and each replica's life (starting, serving, retiring; x: killed at its deadline)."""
    tl = fleet.timeline
    series = per_second(tl)
    fig = Figure(figsize=(10, 5.6), layout="constrained")
    calls, responses, lanes = fig.subplots(
        3, 1, sharex=True, gridspec_kw={"height_ratios": [3.0, 1.3, 1.6]}
    )
    _calls(calls, fleet, series, scale)
    _responses(responses, tl, series, scale)
    _lanes(lanes, tl, scale)
    lanes.set_xlabel("seconds from the start of the rolling deploy", fontsize=9)
    _legend(fig, detail=True)
    return fig


def _responses(ax: Axes, tl: Timeline, series: Series, scale: Scale) -> None:
    x = [*series.lefts, series.start + len(series) * series.width]
    for counts, colour in ((series.rejections, REJECTED), (series.forwards, FORWARDED)):
        ax.stairs(counts, x, color=colour, lw=1.5, zorder=2)
    ax.set_ylim(0, scale.responses * 1.15)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
    ax.set_ylabel("responses / s", fontsize=8)
    ax.tick_params(labelsize=8)
    _mark_deploy(ax, tl, label=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _first_seen(r: ReplicaSpan) -> float:
    known = [t for t in (r.started, r.ready) if t is not None]
    return min(known, default=math.inf)


def _lanes(ax: Axes, tl: Timeline, scale: Scale) -> None:
    """One lane per replica, in the order they came up: starting (process up, not serving
    yet), serving, retiring (draining, out of the rotation, stopping). A replica stopped after
    the traffic, at the end of the run, serves to the right edge."""
    order = sorted(tl.replicas, key=lambda r: (_first_seen(r), r.name))
    for y, r in enumerate(order):
        if r.ready is None:
            continue  # never served (or this driver does not know when)
        ready = _shift(tl, r.ready)
        lane = (y - 0.35, 0.7)
        if r.started is not None:
            start = _shift(tl, r.started)
            ax.broken_barh([(start, ready - start)], lane, color=LANE["starting"])
        if r.retiring is None or r.retiring > tl.stopped:
            ax.broken_barh([(ready, scale.right - ready)], lane, color=LANE["serving"])
            continue
        retiring = _shift(tl, r.retiring)
        ax.broken_barh([(ready, retiring - ready)], lane, color=LANE["serving"])
        exited = scale.right if r.exited is None else max(retiring, _shift(tl, r.exited))
        ax.broken_barh([(retiring, exited - retiring)], lane, color=LANE["retiring"])
        if r.killed:
            ax.plot([exited], [y], marker="x", color=FAILED, ms=7, mew=2, zorder=3)
    ax.set_yticks(range(len(order)), [r.name for r in order], fontsize=7)
    ax.set_ylim(len(order) - 0.5, -0.5)
    ax.set_xlim(scale.left, scale.right)
    ax.tick_params(labelsize=8)
    _mark_deploy(ax, tl, label=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def png(fig: Figure, dpi: int = DPI) -> bytes:
    """The figure as PNG bytes, rendered by Agg."""
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
