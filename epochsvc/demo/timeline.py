"""What happened when during one fleet's run, as plain data: the report's timeline.

The scenario stamps everything on the monotonic clock as it happens: each call's start and
end (:class:`~epochsvc.demo.checker.CallCheck`), each rejection and forwarded response a
client saw (:class:`~epochsvc.demo.client.ClientResult`), each replica's start, readiness,
retirement and exit (:class:`~epochsvc.demo.fleet.Replica`), and the deploy's window.
:func:`build_timeline` turns those into seconds from the fleet's traffic start, once, when
the fleet's run ends; :func:`per_second` bins them into the series the pictures draw. Nothing
here draws or reads a clock, so both are tested on hand-made input.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from epochsvc.demo.checker import CallCheck

if TYPE_CHECKING:  # the client module pulls in the MCP SDK; the timeline needs only its shape
    from epochsvc.demo.client import ClientResult
    from epochsvc.demo.fleet import Replica

#: What a call came to, as its user saw it: ``completed`` with exactly what its server sent;
#: ``corrupted``: completed, but the client accepted foreign, duplicated or missing events
#: (the user was not told); ``failed``: the client was told it failed (rejected included);
#: ``hung``: no answer and no error by its deadline (or still pending at the end).
Result = Literal["completed", "corrupted", "failed", "hung"]


@dataclass(frozen=True, slots=True)
class CallSpan:
    """One call, in seconds from the fleet's traffic start."""

    started: float
    ended: float
    result: Result


@dataclass(frozen=True, slots=True)
class ReplicaSpan:
    """One replica's life, in seconds from the traffic start (``None``: not known)."""

    name: str
    started: float | None = None
    ready: float | None = None
    retiring: float | None = None
    exited: float | None = None
    killed: bool = False  # SIGKILLed at the end of its grace period


@dataclass(frozen=True)
class Timeline:
    """One fleet's run. ``stopped``: when clients stopped starting calls; ``deploy``: the
    rolling deploy's start and end (``None`` for a run without one)."""

    calls: tuple[CallSpan, ...] = ()
    rejections: tuple[float, ...] = ()
    forwards: tuple[float, ...] = ()
    replicas: tuple[ReplicaSpan, ...] = ()
    deploy: tuple[float, float] | None = None
    stopped: float = 0.0

    @property
    def zero(self) -> float:
        """Where the pictures put 0 s: the deploy's start, so every fleet shares one axis."""
        return self.deploy[0] if self.deploy else 0.0

    @property
    def replacements(self) -> list[float]:
        """When the deploy took each old replica out (a replica stopped at the end of the
        run, after the traffic, is not a replacement)."""
        return sorted(
            r.retiring
            for r in self.replicas
            if r.retiring is not None and r.retiring <= self.stopped
        )

    @property
    def last(self) -> float:
        """The latest moment anything in the timeline happened."""
        ends = [c.ended for c in self.calls] + list(self.rejections) + list(self.forwards)
        return max([self.stopped, *ends])


def result_of(call: CallCheck) -> Result:
    if call.outcome == "completed":
        return "completed" if call.clean else "corrupted"
    if call.outcome in ("rejected", "failed"):
        return "failed"
    return "hung"


def build_timeline(
    origin: float,
    clients: Iterable[ClientResult],
    replicas: Iterable[Replica],
    *,
    deploy: tuple[float, float] | None,
    stopped: float,
    ended: float,
) -> Timeline:
    """The timeline of a run whose traffic started at ``origin`` (monotonic). A call with no
    end stamp was still pending when the run ended (``ended``): it hung."""

    def rel(t: float) -> float:
        return round(t - origin, 4)

    def opt(t: float | None) -> float | None:
        return None if t is None else rel(t)

    calls: list[CallSpan] = []
    rejections: list[float] = []
    forwards: list[float] = []
    for client in clients:
        for c in client.calls:
            start = c.started_at if c.started_at is not None else origin
            end = c.ended_at if c.ended_at is not None else ended
            calls.append(CallSpan(rel(start), rel(end), result_of(c)))
        rejections += (rel(t) for t in client.rejected_at)
        forwards += (rel(t) for t in client.forwarded_at)
    calls.sort(key=lambda c: (c.ended, c.started))
    spans = tuple(
        ReplicaSpan(
            r.backend.name,
            opt(r.started_at),
            opt(r.ready_at),
            opt(r.retiring_at),
            opt(r.exited_at),
            r.killed,
        )
        for r in replicas
    )
    return Timeline(
        calls=tuple(calls),
        rejections=tuple(sorted(rejections)),
        forwards=tuple(sorted(forwards)),
        replicas=spans,
        deploy=None if deploy is None else (rel(deploy[0]), rel(deploy[1])),
        stopped=rel(stopped),
    )


@dataclass(frozen=True)
class Series:
    """Counts per bin of ``width`` seconds; bin ``i`` covers ``[start + i*width, start +
    (i+1)*width)`` in seconds from :attr:`Timeline.zero`. Calls count in the bin where they
    ended (where their user learned how they went)."""

    start: float
    width: float
    completed: tuple[int, ...]
    corrupted: tuple[int, ...]
    failed: tuple[int, ...]
    hung: tuple[int, ...]
    rejections: tuple[int, ...]
    forwards: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.completed)

    @property
    def lefts(self) -> list[float]:
        """Each bin's left edge."""
        return [self.start + i * self.width for i in range(len(self))]


def per_second(timeline: Timeline, width: float = 1.0) -> Series:
    """Bin the timeline; bin edges fall on :attr:`Timeline.zero` (the deploy's start), so the
    bins of different fleets line up. Every event lands in exactly one bin."""
    if width <= 0:
        raise ValueError("the bin width must be positive")
    zero = timeline.zero
    first = math.floor((0.0 - zero) / width)
    count = max(1, math.floor((timeline.last - zero) / width) - first + 1)

    def binned(times: Iterable[float]) -> tuple[int, ...]:
        counts = [0] * count
        for t in times:
            counts[min(count - 1, max(0, math.floor((t - zero) / width) - first))] += 1
        return tuple(counts)

    def ends(result: Result) -> tuple[int, ...]:
        return binned(c.ended for c in timeline.calls if c.result == result)

    return Series(
        start=first * width,
        width=width,
        completed=ends("completed"),
        corrupted=ends("corrupted"),
        failed=ends("failed"),
        hung=ends("hung"),
        rejections=binned(timeline.rejections),
        forwards=binned(timeline.forwards),
    )


def summary(timeline: Timeline) -> dict[str, Any]:
    """The timeline in the demo's JSON summary, in seconds from the deploy's start (from the
    traffic's start without a deploy), for plotting it with anything else."""
    zero = timeline.zero
    series = per_second(timeline)
    return {
        "deploy_s": None
        if timeline.deploy is None
        else [round(t - zero, 2) for t in timeline.deploy],
        "replaced_s": [round(t - zero, 2) for t in timeline.replacements],
        "traffic_stopped_s": round(timeline.stopped - zero, 2),
        "per_second": {
            "start_s": series.start,
            **{
                name: list(getattr(series, name))
                for name in ("completed", "corrupted", "failed", "hung", "rejections", "forwards")
            },
        },
    }
