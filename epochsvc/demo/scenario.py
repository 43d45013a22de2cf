"""The scenario: M clients, N replicas behind the balancer, random drops, a rolling deploy.

One :func:`run_fleet` call runs the scenario against one fleet and returns its figures; the
fleet is whatever a :data:`DriverFactory` builds (local processes here, pods later), so the
timeline, the clients and the checks are the same for every way of running replicas.

Timeline of a fleet: replicas up -> clients start -> drops begin -> after ``warm`` seconds the
rolling deploy replaces every replica -> traffic keeps going until ``duration`` (and at least
``cool`` seconds after the deploy) -> clients stop starting calls -> every call still running
ends or hits its deadline (hung) -> teardown.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from epochsvc.demo.balancer import Balancer, Policy
from epochsvc.demo.checker import CallCheck, Tally
from epochsvc.demo.client import (
    CallShape,
    ClientResult,
    DemoClient,
    drop_schedule,
    make_client,
)
from epochsvc.demo.fleet import EPOCH_KINDS, FleetDriver, Kind, LocalProcessFleet, Replica
from epochsvc.demo.service import EpochService
from epochsvc.demo.timeline import Timeline, build_timeline
from epochsvc.demo.timeline import summary as timeline_summary

DriverFactory = Callable[[Kind, Balancer], FleetDriver]
Log = Callable[[str], None]
FleetName = Literal["naive", "sticky", "plain", "epoch", "sidecar"]
ClientKind = Literal["plain", "epoch"]


@dataclass(frozen=True)
class FleetSpec:
    """One column of the demo: which servers, which clients, which balancer."""

    servers: Kind
    clients: ClientKind
    policy: Policy | None  # None: the scenario's balancer policy
    title: str


FLEETS: dict[FleetName, FleetSpec] = {
    "naive": FleetSpec("naive", "plain", None, "naive fleet"),
    "sticky": FleetSpec("sdk", "plain", "sticky", "SDK + affinity"),
    "plain": FleetSpec("epoch", "plain", None, "mcp-epoch, SDK clients"),
    "epoch": FleetSpec("epoch", "epoch", None, "mcp-epoch fleet"),
    "sidecar": FleetSpec("sidecar", "epoch", None, "sidecar, TS servers"),
}


@dataclass(frozen=True)
class ScenarioConfig:
    clients: int = 50
    replicas: int = 3
    duration: float = 22.0
    seed: int = 7
    drop_every: float = 8.0
    warm: float = 5.0
    cool: float = 3.0
    deploy_pause: float = 1.5
    policy: Policy = "link"
    buffer_events: int = 3000
    deploy: bool = True  # False: the same traffic and drops, no rolling deploy (a baseline)
    shape: CallShape = field(default_factory=CallShape)


@dataclass
class FleetResult:
    kind: FleetName
    tally: Tally
    reinits: int
    reinits_ok: int
    reinit_p50: float | None
    reinit_p99: float | None
    reasons: dict[str, int]
    drops: int
    requests: int
    replicas: list[dict[str, Any]]
    seconds: float
    errors: list[str]
    forwarded: int = 0
    drains: list[float] = field(default_factory=list)
    #: The handoff, from the replicas' own reports: sessions handed on and those a drain could
    #: not hand on, sessions taken, requests served on them, cursors served from a tail.
    handed: int = 0
    kept: int = 0
    adopted: int = 0
    served_handed: int = 0
    tail_replays: int = 0
    #: Drains that ran to their deadline, and what held each (request id, running/answered).
    deadline_drains: int = 0
    held_by: list[str] = field(default_factory=list)
    #: What happened when: the report's pictures (binned per second in :meth:`as_dict`).
    timeline: Timeline = field(default_factory=Timeline)

    @property
    def completion_pct(self) -> float:
        return (
            round(100.0 * self.tally.completed / self.tally.calls, 2) if self.tally.calls else 0.0
        )

    @property
    def completion_of_reachable_pct(self) -> float:
        """Completed of the calls a client could complete: without those a drop cut before
        their first event (no protocol can tell the client whether those ran)."""
        reachable = self.tally.calls - self.tally.cut_before_first_event
        return round(100.0 * self.tally.completed / reachable, 2) if reachable else 0.0

    @property
    def drain_p50(self) -> float | None:
        return percentile(self.drains, 50)

    @property
    def drain_max(self) -> float | None:
        return max(self.drains) if self.drains else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "fleet": self.kind,
            "title": FLEETS[self.kind].title,
            **asdict(self.tally),
            "completion_pct": self.completion_pct,
            "completion_of_reachable_pct": self.completion_of_reachable_pct,
            "failure_causes": {
                "refused_before_they_ran": self.tally.refused_calls,
                "lost_in_flight": self.tally.lost_in_flight,
                "cut_before_first_event": self.tally.cut_before_first_event,
                "hung": self.tally.hung,
            },
            "forwarded_requests": self.forwarded,
            "drain_p50_s": self.drain_p50,
            "drain_max_s": self.drain_max,
            "drains_at_deadline": self.deadline_drains,
            "drains_held_by": self.held_by,
            "sessions_handed_off": self.handed,
            "sessions_kept_at_drain_end": self.kept,
            "sessions_adopted": self.adopted,
            "handed_off_session_requests": self.served_handed,
            "cursors_served_from_tail": self.tail_replays,
            "rejections": self.reinits,
            "reinits_ok": self.reinits_ok,
            "reinit_p50_s": self.reinit_p50,
            "reinit_p99_s": self.reinit_p99,
            "rejection_reasons": self.reasons,
            "drops": self.drops,
            "proxied_requests": self.requests,
            "replicas": self.replicas,
            "seconds": round(self.seconds, 1),
            "client_errors": self.errors[:5],
            "timeline": timeline_summary(self.timeline),
        }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, int(q) - 1))]


def local_driver(
    workdir: Path, service: EpochService | None, buffer_events: int, log: Log
) -> DriverFactory:
    """Local processes; the mcp-epoch fleet gets the epoch service."""

    def make(kind: Kind, lb: Balancer) -> FleetDriver:
        return LocalProcessFleet(
            kind,
            lb,
            workdir,
            service=service if kind in EPOCH_KINDS else None,
            buffer_events=buffer_events,
            log=log,
        )

    return make


async def run_fleet(
    kind: FleetName,
    cfg: ScenarioConfig,
    factory: DriverFactory,
    log: Log,
    dump: Path | None = None,
) -> FleetResult:
    """Run the scenario on one fleet; ``dump`` gets one JSON line per call that was not a
    clean completion (and every client error), for looking into a run afterwards."""
    t_start = time.monotonic()
    spec = FLEETS[kind]
    lb = Balancer(spec.policy or cfg.policy)
    await lb.start()
    driver = factory(spec.servers, lb)
    stop = asyncio.Event()
    try:
        await driver.start(cfg.replicas)
        log(f"  {cfg.replicas} replicas up, balancer on {lb.url} ({lb.policy} routing)")
        clients = [
            make_client(spec.clients, i, lb.url, cfg.shape, stop) for i in range(cfg.clients)
        ]
        origin = time.monotonic()  # the timeline's 0 s: the first client starts
        tasks = []
        for c in clients:
            tasks.append(asyncio.create_task(c.run()))
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        log(f"  {cfg.clients} clients running; random drops every ~{cfg.drop_every:g}s per client")
        chaos = asyncio.create_task(_chaos(lb, clients, cfg, t0))
        await asyncio.sleep(max(0.0, t0 + cfg.warm - time.monotonic()))
        deploy: tuple[float, float] | None = None
        if cfg.deploy:
            log("  rolling deploy: replacing every replica, one at a time")
            began = time.monotonic()
            await driver.rolling_deploy(cfg.deploy_pause)
            deploy = (began, time.monotonic())
        end = max(t0 + cfg.duration, time.monotonic() + cfg.cool)
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        stop.set()
        stopped = time.monotonic()
        chaos.cancel()
        log(f"  traffic stopped; waiting up to {cfg.shape.deadline:.0f}s for calls in flight")
        done, pending = await asyncio.wait(tasks, timeout=cfg.shape.deadline + 15)
        for t in pending:
            t.cancel()
        results: list[ClientResult] = [t.result() for t in done if not t.exception()]
        errors = [repr(t.exception()) for t in done if t.exception()]
        if pending:
            errors.append(f"{len(pending)} clients did not finish")
        ended = time.monotonic()
    finally:
        stop.set()
        await driver.close()
        await lb.stop()
    if dump is not None:
        _dump(dump, results, errors, origin)
    replicas = driver.replicas()
    tl = build_timeline(origin, results, replicas, deploy=deploy, stopped=stopped, ended=ended)
    return _fold(kind, results, errors, lb, replicas, time.monotonic() - t_start, tl)


def _dump(path: Path, results: list[ClientResult], errors: list[str], origin: float) -> None:
    """Times in the dump are seconds from the traffic start, as in the timeline."""
    with path.open("w") as out:
        for r in results:
            for c in r.calls:
                if c.outcome != "completed" or not c.clean:
                    row = {k: v for k, v in asdict(c).items() if not k.startswith("_")}
                    for key in ("started_at", "ended_at"):
                        if row[key] is not None:
                            row[key] = round(row[key] - origin, 3)
                    out.write(json.dumps({"client": r.client, **row}) + "\n")
            for e in r.errors:
                out.write(json.dumps({"client": r.client, "error": e}) + "\n")
            for x in r.reinits:
                out.write(json.dumps({"client": r.client, "reinit": asdict(x)}) + "\n")
        for e in errors:
            out.write(json.dumps({"error": e}) + "\n")


async def _chaos(lb: Balancer, clients: list[DemoClient], cfg: ScenarioConfig, t0: float) -> None:
    """Cut each client's connections at its own random moments (seeded per client), and tell
    the client when that cut any (so its checker knows which failures a drop caused: the SDK
    client sends its next request on a pooled connection, so even an idle one matters)."""
    events: list[tuple[float, int]] = []
    horizon = cfg.duration + 60.0
    for i in range(len(clients)):
        rng = random.Random(cfg.seed * 100_003 + i)
        events += [(t, i) for t in drop_schedule(rng, cfg.drop_every, 0.5, horizon)]
    events.sort()
    for at, i in events:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        if lb.drop(clients[i].name):
            clients[i].dropped()


def _fold(
    kind: FleetName,
    results: list[ClientResult],
    errors: list[str],
    lb: Balancer,
    replicas: list[Replica],
    seconds: float,
    tl: Timeline,
) -> FleetResult:
    # Drains are the deploy's: not those of the replicas stopped when the scenario ended.
    deployed = [r for r in replicas if not r.at_teardown]
    tally = Tally()
    for r in results:
        by_uid: dict[str, list[CallCheck]] = {}
        for c in r.calls:
            by_uid.setdefault(c.uid, []).append(c)
        for calls in by_uid.values():
            tally.add_session(calls)
        errors += r.errors
    reinits = [x for r in results for x in r.reinits]
    took = sorted(x.seconds for x in reinits if x.seconds is not None)
    reasons: dict[str, int] = {}
    for r in results:
        for reason, n in r.reasons.items():
            reasons[reason] = reasons.get(reason, 0) + n
    return FleetResult(
        kind=kind,
        tally=tally,
        reinits=len(reinits),
        reinits_ok=len(took),
        reinit_p50=percentile(took, 50),
        reinit_p99=percentile(took, 99),
        reasons=reasons,
        drops=lb.stats.drops,
        requests=lb.stats.requests,
        replicas=[
            {
                "name": r.backend.name,
                "epoch": r.process_epoch or "(counter ids)",
                **({"stop_s": round(r.stop_seconds, 2)} if r.stop_seconds is not None else {}),
                **({"killed": True} if r.killed else {}),
                **{k: v for k, v in r.drain.items() if k != "held_by"},
            }
            for r in replicas
        ],
        seconds=seconds,
        errors=errors,
        forwarded=sum(int(r.drain.get("forwarded", 0)) for r in replicas),
        drains=sorted(float(r.drain["drained"]) for r in deployed if "drained" in r.drain),
        handed=sum(int(r.drain.get("handed", 0)) for r in deployed),
        kept=sum(int(r.drain.get("kept", 0)) for r in deployed),
        adopted=_counted(replicas, "adopted"),
        served_handed=_counted(replicas, "served_handed"),
        tail_replays=_counted(replicas, "tail_replays"),
        deadline_drains=sum(1 for r in deployed if r.drain.get("deadline")),
        held_by=[
            f"{r.backend.name}: {', '.join(r.drain['held_by'])}"
            for r in deployed
            if r.drain.get("held_by")
        ],
        timeline=tl,
    )


def _counted(replicas: list[Replica], key: str) -> int:
    """A handoff counter summed over replicas: the drain report's figure where the replica
    printed one, else what its ``/metrics`` said just before it was stopped."""
    return sum(int(max(r.drain.get(key, 0), r.counters.get(key, 0))) for r in replicas)
