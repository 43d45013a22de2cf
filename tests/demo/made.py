"""Runs made by hand from the demo's real parts: calls the real checker saw through, clients'
results and replicas as the fleet records them, on a monotonic clock that starts at
:data:`ORIGIN`. The timeline's and the report's tests share them."""

from __future__ import annotations

from epochsvc.demo.balancer import Backend
from epochsvc.demo.checker import CallCheck, Outcome, Tally, Token
from epochsvc.demo.client import ClientResult
from epochsvc.demo.fleet import Replica
from epochsvc.demo.scenario import FleetName, FleetResult
from epochsvc.demo.timeline import Timeline, build_timeline

ORIGIN = 1000.0  # the monotonic moment the traffic started


def call(
    n: int, outcome: Outcome, start: float, end: float | None, *, foreign: bool = False
) -> CallCheck:
    """A one-step call the checker saw through to ``outcome``, stamped as the client does."""
    c = CallCheck(f"c1s{n}", f"k{n}", 1, 0)
    c.started_at = ORIGIN + start
    uid = "c9s9" if foreign else c.uid
    if outcome == "completed":
        c.accept(Token(uid, c.call, "step", 1).encode(), "step")
        c.accept(Token(c.uid, c.call, "done", 1).encode(), "done")
    if outcome != "pending":
        c.finish(outcome)
    c.ended_at = None if end is None else ORIGIN + end
    return c


def replica(name: str, *times: float | None, killed: bool = False) -> Replica:
    """A replica started, ready, retiring and exited at these seconds (``None``: unknown)."""
    started, ready, retiring, exited = (None if t is None else ORIGIN + t for t in times)
    return Replica(
        Backend(name, "127.0.0.1", 1),
        "",
        "e.0",
        killed=killed,
        started_at=started,
        ready_at=ready,
        retiring_at=retiring,
        exited_at=exited,
    )


def timeline_of(
    client: ClientResult, replicas: list[Replica], deploy: tuple[float, float] | None
) -> Timeline:
    return build_timeline(
        ORIGIN,
        [client],
        replicas,
        deploy=None if deploy is None else (ORIGIN + deploy[0], ORIGIN + deploy[1]),
        stopped=ORIGIN + 18.0,
        ended=ORIGIN + 19.5,
    )


def fleet_result(
    kind: FleetName, client: ClientResult, replicas: list[Replica], tl: Timeline
) -> FleetResult:
    """The figures of a fleet whose only client was ``client`` (one session per uid)."""
    tally = Tally()
    by_uid: dict[str, list[CallCheck]] = {}
    for c in client.calls:
        by_uid.setdefault(c.uid, []).append(c)
    for calls in by_uid.values():
        tally.add_session(calls)
    return FleetResult(
        kind=kind,
        tally=tally,
        reinits=0,
        reinits_ok=0,
        reinit_p50=None,
        reinit_p99=None,
        reasons={},
        drops=0,
        requests=0,
        replicas=[{"name": r.backend.name} for r in replicas],
        seconds=20.0,
        errors=[],
        timeline=tl,
    )
