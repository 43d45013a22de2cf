"""The admission epoch pool (``mcp_epoch_operator.pool``) against a real epoch service: what it
hands out keeps every invariant of an epoch issued at admission."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from mcp_epoch_operator.epochs import connect
from mcp_epoch_operator.pool import EpochPool, PoolUnavailable

from mcp_epoch import api
from mcp_epoch.api_client import EpochServiceClient, EpochServiceUnavailable, RetryPolicy
from tests.operator.support import wait_for
from tests.support.epochsvc_proc import EpochServiceProcess

KEY = ("team-a", "calc")
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EpochServiceProcess]:
    work = tmp_path_factory.mktemp("pool-epochsvc")
    # A pending epoch is abandoned 2 s after its issue, swept every 0.2 s.
    with EpochServiceProcess(
        f"sqlite:///{work}/ledger.db",
        work / "epochsvc.log",
        EPOCHSVC_PENDING_TIMEOUT_SECONDS="2",
        EPOCHSVC_SWEEP_INTERVAL_SECONDS="0.2",
    ) as svc:
        yield svc


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Counted:
    """The pool's issue: the real service's, counted."""

    def __init__(self, svc: EpochServiceClient) -> None:
        self.svc = svc
        self.calls = 0

    async def __call__(self, namespace: str, server: str, uids: list[str]) -> list[api.Epoch]:
        self.calls += 1
        return (await self.svc.send(api.issue_batch(namespace, server, uids))).epochs


@pytest.fixture
async def issue(service: EpochServiceProcess) -> AsyncIterator[Counted]:
    svc = connect(service.url, service.operator_token)
    yield Counted(svc)
    await svc.aclose()


def held(token: int | None = 1) -> Callable[[], int | None]:
    """The lease's tenure as the pool asks for it (None: not held)."""
    return lambda: token


def uid() -> str:
    return secrets.token_hex(8)


async def test_admissions_one_after_another_get_rising_generations_from_few_refills(
    issue: Counted,
) -> None:
    pool = EpochPool(issue, size=4)
    taken = [await pool.take(KEY, uid(), held()) for _ in range(10)]
    generations = [e.generation for e in taken]
    assert generations == sorted(generations) and len(set(generations)) == 10
    assert all(e.state == "pending" and (e.namespace, e.server) == KEY for e in taken)
    # Refills of 4 ahead, the next one started at half: one batch call per few admissions.
    assert issue.calls <= 5


async def test_concurrent_admissions_get_distinct_epochs_in_the_order_they_completed(
    issue: Counted,
) -> None:
    pool = EpochPool(issue, size=3)
    completed: list[int] = []

    async def admit() -> None:
        epoch = await pool.take(KEY, uid(), held())
        completed.append(epoch.generation)

    await asyncio.gather(*(admit() for _ in range(20)))
    assert len(set(completed)) == 20
    # The burst found the pool empty: this server's pool now holds more for the next one.
    assert pool.target(KEY) > 3
    # One after another again: each above everything handed out before it began.
    after = await pool.take(KEY, uid(), held())
    assert after.generation > max(completed)


async def test_a_retried_admission_gets_the_same_epoch(issue: Counted) -> None:
    pool = EpochPool(issue, size=2)
    request = uid()
    first = await pool.take(KEY, request, held())
    again = await pool.take(KEY, request, held())
    assert again == first
    other = await pool.take(KEY, uid(), held())
    assert other.generation > first.generation


async def test_without_the_lease_nothing_is_issued_or_handed_out(issue: Counted) -> None:
    pool = EpochPool(issue, size=2)
    with pytest.raises(PoolUnavailable):
        await pool.take(KEY, uid(), held(None))
    assert issue.calls == 0


async def test_a_new_tenure_starts_above_everything_the_last_one_pooled(
    issue: Counted, service: EpochServiceProcess
) -> None:
    pool = EpochPool(issue, size=4)
    first = await pool.take(KEY, uid(), held(1))
    assert pool.pooled(KEY) >= 1
    before = await issue.svc.send(api.list_server(*KEY))
    highest = max(e.generation for e in before.epochs)
    nxt = await pool.take(KEY, uid(), held(2))
    assert nxt.generation > highest > first.generation
    # What the first tenure pooled and never handed out is an ordinary pending epoch, and
    # the sweep abandons it as it abandons any epoch whose pod never appeared.
    unused = [e.epoch for e in before.epochs if e.generation > first.generation]
    assert unused

    def abandoned() -> bool:
        states = {e.epoch: e.state for e in asyncio.run(_listed(service)).epochs}
        return all(states[u] == "abandoned" for u in unused)

    await asyncio.to_thread(wait_for, abandoned, 20, "the unused pooled epochs abandoned")


async def _listed(service: EpochServiceProcess) -> api.EpochList:
    svc = connect(service.url, service.operator_token)
    try:
        return await svc.send(api.list_server(*KEY))
    finally:
        await svc.aclose()


async def test_a_pooled_epoch_too_old_is_never_handed_out(issue: Counted) -> None:
    clock = Clock()
    pool = EpochPool(issue, size=4, max_age=60.0, clock=clock)
    await pool.take(KEY, uid(), held())
    grown = pool.target(KEY)
    issued = await issue.svc.send(api.list_server(*KEY))
    clock.now += 61
    nxt = await pool.take(KEY, uid(), held())
    # A refill's epoch: above every epoch issued before the pooled ones aged.
    assert nxt.generation > max(e.generation for e in issued.epochs)
    # Epochs that aged unused were more than this server needed: it keeps fewer.
    assert pool.target(KEY) == max(4, grown // 2)


async def test_a_refill_the_service_cannot_answer_fails_the_admission(
    tmp_path: Path,
) -> None:
    with EpochServiceProcess(f"sqlite:///{tmp_path}/ledger.db", tmp_path / "svc.log") as down:
        url, token = down.url, down.operator_token
    quick = RetryPolicy(deadline=0.5, attempt_timeout=0.25)
    svc = connect(url, token)
    try:

        async def issue_once(namespace: str, server: str, uids: list[str]) -> list[api.Epoch]:
            return (await svc.send(api.issue_batch(namespace, server, uids), quick)).epochs

        pool = EpochPool(issue_once, size=2)
        with pytest.raises(EpochServiceUnavailable):
            await pool.take(KEY, uid(), held())
        assert pool.pooled(KEY) == 0
    finally:
        await svc.aclose()
