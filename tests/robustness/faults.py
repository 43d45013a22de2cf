"""Faults, each run as its own history against real epoch service processes.

Every fault starts the service (on SQLite or on a real PostgreSQL), drives it with
:class:`~tests.robustness.workload.Workload`, makes the fault happen a third of the way
through (and undoes it after :data:`OUTAGE` seconds), then checks the history. What each one
does, for real: SIGKILL of a service process and a restart on the same ledger; SIGKILL of
PostgreSQL and a restart on its data directory; two service processes on one PostgreSQL, one
of them killed and restarted; a service process stopped with SIGSTOP for longer than its
clients wait, then continued, after its peer moved the ledger on.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.robustness import linearizability
from tests.robustness.history import Op, save
from tests.robustness.netns import DATABASE_ADDRESS, Namespaces, namespaces
from tests.robustness.workload import REQUEST_TIMEOUT, Workload
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.postgres import PostgresServer

#: How long a fault lasts before it is undone.
OUTAGE = 1.5


@dataclass
class Rig:
    """What a fault acts on: the service processes, on PostgreSQL the database, and the
    network namespaces when the scenario partitions them."""

    services: list[EpochServiceProcess]
    pg: PostgresServer | None
    ns: Namespaces | None = None
    uds: str | None = None  # how the clients reach the service in its namespace


Fault = Callable[[Rig], Awaitable[None]]


async def _none(_: Rig) -> None:
    return None


async def _kill_service(rig: Rig) -> None:
    svc = rig.services[-1]
    await asyncio.to_thread(svc.kill)
    await asyncio.sleep(OUTAGE)
    await asyncio.to_thread(svc.start)


async def _kill_postgres(rig: Rig) -> None:
    assert rig.pg is not None
    await asyncio.to_thread(rig.pg.kill)
    await asyncio.sleep(OUTAGE)
    await asyncio.to_thread(rig.pg.launch)


async def _partition(rig: Rig) -> None:
    assert rig.ns is not None
    await asyncio.to_thread(rig.ns.cut)
    await asyncio.sleep(REQUEST_TIMEOUT + OUTAGE)  # requests hang on the database, unanswered
    await asyncio.to_thread(rig.ns.heal)


async def _pause_service(rig: Rig) -> None:
    svc = rig.services[-1]
    assert svc.proc is not None
    svc.proc.send_signal(signal.SIGSTOP)
    await asyncio.sleep(REQUEST_TIMEOUT + OUTAGE)  # its clients give up; its peer goes on
    svc.proc.send_signal(signal.SIGCONT)


@dataclass(frozen=True)
class Scenario:
    name: str
    backend: str  # "sqlite" or "postgres"
    fault: Fault
    processes: int = 1
    netns: bool = False  # the service and PostgreSQL each in a namespace of their own


SCENARIOS = [
    Scenario("no fault", "sqlite", _none),
    Scenario("kill -9 service, restart", "sqlite", _kill_service),
    Scenario("pause service (SIGSTOP)", "sqlite", _pause_service),
    Scenario("no fault", "postgres", _none),
    Scenario("kill -9 service, restart", "postgres", _kill_service),
    Scenario("kill -9 PostgreSQL, restart", "postgres", _kill_postgres),
    Scenario("two services, one killed", "postgres", _kill_service, processes=2),
    Scenario("two services, one paused (SIGSTOP)", "postgres", _pause_service, processes=2),
    Scenario("partition service | PostgreSQL", "postgres", _partition, netns=True),
]


@dataclass
class Result:
    scenario: Scenario
    operations: int
    unknown: int
    errors_5xx: Counter[str]
    status_500: int
    recovery_s: float | None
    verdict: linearizability.Verdict | None
    undecided: str | None = None
    history_file: Path | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@contextlib.contextmanager
def _rig(scenario: Scenario, workdir: Path) -> Iterator[Rig]:
    with contextlib.ExitStack() as stack:
        ns = stack.enter_context(namespaces()) if scenario.netns else None
        pg = None
        if scenario.backend == "postgres":
            pg = PostgresServer(**({"host": DATABASE_ADDRESS, "netns": ns.database} if ns else {}))
            stack.callback(pg.stop)
            pg.start()
        url = pg.new_database() if pg else f"sqlite:///{workdir / 'ledger.db'}"
        services: list[EpochServiceProcess] = []
        stack.callback(_stop_all, services)
        for n in range(scenario.processes):
            svc = EpochServiceProcess(
                url, workdir / f"epochsvc-{n}.log", netns=ns.service if ns else None
            )
            if services:  # one ledger, one set of credentials
                svc.operator_token = services[0].operator_token
                svc.replica_token = services[0].replica_token
            services.append(svc.start())
        uds = None
        if ns is not None:
            uds = stack.enter_context(ns.relay(services[0].port, workdir / "epochsvc.sock"))
        yield Rig(services, pg, ns, uds)


def _stop_all(services: list[EpochServiceProcess]) -> None:
    for svc in services:
        if svc.proc is not None:
            with contextlib.suppress(Exception):
                svc.proc.send_signal(signal.SIGCONT)
        svc.stop()


async def run(
    scenario: Scenario,
    operations: int,
    workdir: Path,
    *,
    seed: int = 0,
    check_timeout: float = 300.0,
    progress: Callable[[str], None] | None = None,
) -> Result:
    """Run one scenario and check its history."""
    with _rig(scenario, workdir) as rig:
        urls = ["http://epochsvc"] if rig.uds else [s.url for s in rig.services]
        work = Workload(urls, rig.services[0].operator_token, operations, seed=seed, uds=rig.uds)
        work.mark = operations // 3
        restored: list[float] = []

        async def inject() -> None:
            await work.reached.wait()
            await scenario.fault(rig)
            restored.append(time.monotonic())

        def said(n: int) -> None:
            if progress is not None:
                progress(f"  {scenario.name} ({scenario.backend}): {n}/{operations} operations")

        await asyncio.gather(work.run(said), inject())
        history = work.history
    return judge(scenario, history, restored[0] if restored else None, workdir, check_timeout)


def judge(
    scenario: Scenario,
    history: list[Op],
    restored: float | None,
    workdir: Path,
    check_timeout: float,
) -> Result:
    unknown = sum(op.output is None for op in history)
    errors = Counter(f"{op.status} {op.code}" for op in history if (op.status or 0) >= 500)
    status_500 = sum(op.status == 500 for op in history)
    recovery = None
    if restored is not None:
        after = [op.returned for op in history if op.called >= restored and op.output]
        recovery = (min(after) - restored) if after else None
    result = Result(scenario, len(history), unknown, errors, status_500, recovery, None)
    try:
        result.verdict = linearizability.check(history, timeout=check_timeout)
        result.problems += result.verdict.problems
    except linearizability.Undecided as exc:
        result.undecided = str(exc)
        result.problems.append(f"undecided: {exc}")
    if status_500:
        result.problems.append(f"{status_500} responses with status 500")
    if not result.ok:
        result.history_file = workdir / "history.jsonl"
        save(history, result.history_file)
    return result
