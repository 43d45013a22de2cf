"""The store in-process, on both backends: the writes' rules, the in-memory copy, and (on
PostgreSQL) a second process's writes reaching this one's copy through notifications."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from epochsvc.service.lifecycle import Action, LifecycleError, State
from epochsvc.service.store import (
    RequestConflict,
    SqlEpochStore,
    UnknownEpoch,
    engines,
    follower,
    open_store,
)
from epochsvc.service.store.base import StoreUnavailable
from epochsvc.service.store.follower import own_revision
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[SqlEpochStore]:
    s = await open_store(database_url)
    await s.attach()
    try:
        yield s
    finally:
        await s.close()


async def test_issue_is_idempotent_per_request_and_never_reuses_a_generation(
    store: SqlEpochStore,
) -> None:
    first, created = await store.issue("ns", "echo", "req-1")
    again, created_again = await store.issue("ns", "echo", "req-1")
    assert created and not created_again and again == first
    with pytest.raises(RequestConflict):
        await store.issue("ns", "other", "req-1")
    second, _ = await store.issue("ns", "echo", "req-2")
    assert second.generation == first.generation + 1
    assert second.revision > first.revision


async def test_a_burst_of_issues_shares_one_commit_and_each_request_gets_one_epoch(
    store: SqlEpochStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines, "WRITER_IDLE_PING_SECONDS", 3600.0)  # no ping in the count
    before, _ = await store.issue("ns", "echo", "already")
    stats = store.commit_stats()
    commits, statements, trips = stats.commits, stats.statements, stats.round_trips
    uids = [f"burst-{i}" for i in range(16)]
    # Every request of a burst queued before the writer runs: retries of one admission
    # (twice in the burst, and one issued before) come back with the same epoch.
    requests = [*uids, "burst-3", "burst-3", "already", "burst-15"]
    answers = await asyncio.gather(*(store.issue("ns", "echo", uid) for uid in requests))
    assert store.commit_stats().commits == commits + 1
    # Lock, lookup, bump, insert (no savepoint: the batch is one unit), whatever the size.
    assert store.commit_stats().statements - statements <= 5
    if store.dialect == "postgresql":
        # BEGIN, the lock, the issue, the NOTIFY and the COMMIT: one pipeline.
        assert store.commit_stats().round_trips - trips == 1
    made = {uid: rec for uid, (rec, created) in zip(requests, answers, strict=True) if created}
    assert sorted(made) == sorted(uids)
    for uid, (rec, _) in zip(requests, answers, strict=True):
        assert rec == (before if uid == "already" else made[uid])
    generations = sorted(rec.generation for rec in made.values())
    assert generations == list(range(before.generation + 1, before.generation + 17))
    for rec in made.values():
        assert (await store.get(rec.generation)) == rec  # durable, as answered


async def test_in_a_mixed_batch_one_write_failing_spoils_none_of_the_others(
    store: SqlEpochStore,
) -> None:
    rec, _ = await store.issue("ns", "echo", "first")
    commits = store.commit_stats().commits
    results = await asyncio.gather(
        store.issue("ns", "echo", "a"),
        store.transition(rec.generation, Action.DRAIN),  # a pending epoch cannot drain
        store.issue("ns", "echo", "b"),
        return_exceptions=True,
    )
    assert store.commit_stats().commits == commits + 1
    assert isinstance(results[1], LifecycleError)
    assert (await store.get(rec.generation)).state is State.PENDING
    for issued in (results[0], results[2]):
        assert not isinstance(issued, BaseException)
        assert (await store.get(issued[0].generation)) == issued[0]


async def test_a_batch_of_retries_spends_no_revision(store: SqlEpochStore) -> None:
    rec, _ = await store.issue("ns", "echo", "once")
    answers = await asyncio.gather(*(store.issue("ns", "echo", "once") for _ in range(4)))
    assert all(again == (rec, False) for again in answers)
    assert (await store.list_server("ns", "echo")).revision == rec.revision


async def test_bind_register_drain_retire_and_the_rules_on_the_way(store: SqlEpochStore) -> None:
    rec, _ = await store.issue("ns", "echo", "r")
    other, _ = await store.issue("ns", "echo", "r2")
    with pytest.raises(LifecycleError):  # no incarnation before the epoch is bound
        await store.register_incarnation(rec.generation, pod_uid="uid-a", owner_only=True)
    live = await store.transition(rec.generation, Action.BIND, pod_name="a", pod_uid="uid-a")
    assert live.state is State.LIVE and live.pod_uid == "uid-a"
    with pytest.raises(LifecycleError, match="is already bound to epoch"):
        await store.transition(other.generation, Action.BIND, pod_name="a", pod_uid="uid-a")
    # A repeated bind of the same pod records its address, and is otherwise a no-op.
    addressed = await store.transition(
        rec.generation, Action.BIND, pod_name="a", pod_uid="uid-a", address="10.0.0.1:8080"
    )
    assert addressed.address == "10.0.0.1:8080" and addressed.revision > live.revision
    same = await store.transition(
        rec.generation, Action.BIND, pod_name="a", pod_uid="uid-a", address="10.0.0.1:8080"
    )
    assert same.revision == addressed.revision
    incs = [
        (
            await store.register_incarnation(rec.generation, pod_uid="uid-a", owner_only=True)
        ).incarnation
        for _ in range(3)
    ]
    assert incs == [0, 1, 2]
    with pytest.raises(LifecycleError):
        await store.register_incarnation(rec.generation, pod_uid="uid-b", owner_only=True)
    assert (await store.transition(rec.generation, Action.DRAIN)).state is State.DRAINING
    assert (await store.transition(rec.generation, Action.RETIRE)).state is State.RETIRED
    with pytest.raises(LifecycleError):
        await store.register_incarnation(rec.generation, pod_uid="uid-a", owner_only=True)
    assert await store.bound_to("uid-a") == await store.get(rec.generation)


async def test_sweep_abandons_and_compacts_but_the_counter_never_goes_back(
    store: SqlEpochStore,
) -> None:
    stale, _ = await store.issue("ns", "echo", "stale")
    done, _ = await store.issue("ns", "echo", "done")
    await store.transition(done.generation, Action.BIND, pod_name="p", pod_uid="u")
    await store.transition(done.generation, Action.RETIRE)
    result = await store.sweep(now=stale.created_at + 100, pending_timeout=10, tombstone_ttl=1e9)
    assert (result.abandoned, result.compacted) == (1, 0)
    assert (await store.get(stale.generation)).state is State.ABANDONED
    result = await store.sweep(now=stale.created_at + 1e10, pending_timeout=10, tombstone_ttl=1)
    assert result.compacted == 2
    for gone in (stale, done):
        with pytest.raises(UnknownEpoch):
            await store.get(gone.generation)
    assert (await store.list_server("ns", "echo")).epochs == []
    nxt, _ = await store.issue("ns", "echo", "after")
    assert nxt.generation == done.generation + 1


async def _until(changed: asyncio.Event, check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Re-check after every change the follower delivers (``on_change``), for at most 10 s."""
    try:
        async with asyncio.timeout(10):
            while True:
                changed.clear()
                if await check():
                    return
                await changed.wait()
    except TimeoutError:
        raise AssertionError(f"within 10 s: {what}") from None


@asynccontextmanager
async def _two_processes(
    postgres: object, closing: list[float] | None = None
) -> AsyncIterator[tuple[SqlEpochStore, SqlEpochStore, asyncio.Event]]:
    """Two service processes' stores on one new PostgreSQL database, both following it;
    the event is set whenever the first one's copy takes in the other's writes. ``closing``
    is given the seconds the first one's close took."""
    url = postgres.new_database()  # type: ignore[attr-defined]
    here, there = await open_store(url), await open_store(url)
    changed = asyncio.Event()
    here.on_change = lambda _servers: changed.set()
    try:
        await here.attach()
        await there.attach()
        yield here, there, changed
    finally:
        began = time.monotonic()
        await here.close()
        if closing is not None:
            closing.append(time.monotonic() - began)
        await there.close()


async def test_postgres_a_second_process_writes_reach_this_copy(postgres: object) -> None:
    async with _two_processes(postgres) as (here, there, changed):
        rec, _ = await there.issue("ns", "echo", "from-there")
        await _until(changed, lambda: _has(here, rec.generation), "the other process's epoch")
        await there.transition(rec.generation, Action.BIND, pod_name="p", pod_uid="u")

        async def bound() -> bool:
            return (await here.get(rec.generation)).state is State.LIVE

        await _until(changed, bound, "the bind")
        assert (await here.list_server("ns", "echo")).revision == (
            await there.list_server("ns", "echo")
        ).revision


async def test_postgres_a_follower_hears_writes_by_notification_and_stops_without_waiting(
    postgres: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With the catch-up read a minute away, only the notification can bring the other
    # process's write, and only the wake can end the follower's wait before that minute.
    monkeypatch.setattr(follower, "CATCH_UP_SECONDS", 60.0)
    closing: list[float] = []
    async with _two_processes(postgres, closing) as (here, there, changed):
        rec, _ = await there.issue("ns", "echo", "heard")
        await _until(changed, lambda: _has(here, rec.generation), "the other process's epoch")
    assert closing[0] < 30, f"close took {closing[0]:.1f} s: it waited out the catch-up"


async def test_postgres_own_commits_between_anothers_never_hide_its_writes(
    postgres: object,
) -> None:
    # The follower skips this process's own change notices and moves its mark past them;
    # writes of another process committed in between must still reach the copy.
    async with _two_processes(postgres) as (here, there, changed):
        theirs = []
        for round_ in range(5):
            mine = [here.issue("ns", "echo", f"here-{round_}-{i}") for i in range(8)]
            other = there.issue("ns", "echo", f"there-{round_}")
            *_, (rec, _) = await asyncio.gather(*mine, other)
            theirs.append(rec.generation)
        for generation in theirs:
            await _until(
                changed,
                lambda g=generation: _has(here, g),
                f"the other process's epoch {generation}",
            )
        assert len((await here.list_server("ns", "echo")).epochs) == 5 * 9


async def _has(store: SqlEpochStore, generation: int) -> bool:
    """In the in-memory copy (``list_server`` answers from it while it is whole)."""
    listing = await store.list_server("ns", "echo")
    return any(e.generation == generation for e in listing.epochs)


async def test_a_ring_is_made_once_and_reports_count_only_for_the_newest_process(
    store: SqlEpochStore,
) -> None:
    first, again = await asyncio.gather(
        store.ring("ns", "echo", 60.0), store.ring("ns", "echo", 60.0)
    )
    assert first == again and first.revision == 1 and len(first.keys[0]) == 32
    rec, _ = await store.issue("ns", "echo", "r")
    await store.transition(rec.generation, Action.BIND, pod_name="p", pod_uid="u")
    inc = await store.register_incarnation(rec.generation, pod_uid="u", owner_only=True)
    assert inc.incarnation is not None
    _, holders = await store.ring_status("ns", "echo")
    assert [(h.pod, h.revision) for h in holders] == [("p", None)]
    await store.report_ring(rec.generation, inc.incarnation, 1)
    assert [h.revision for h in (await store.ring_status("ns", "echo"))[1]] == [1]
    await store.register_incarnation(rec.generation, pod_uid="u", owner_only=True)  # a restart
    assert [h.revision for h in (await store.ring_status("ns", "echo"))[1]] == [None]


async def test_postgres_two_processes_stepping_one_ring_step_it_once(postgres: object) -> None:
    async with _two_processes(postgres) as (here, there, _changed):
        made = await asyncio.gather(here.ring("ns", "echo", 0.0), there.ring("ns", "echo", 0.0))
        assert made[0].keys == made[1].keys  # one ring, although both made it at once
        await here.rotate_ring("ns", "echo", 0.0)
        # No live pod, TTL 0: every step may go. Three pairs of concurrent calls take exactly
        # the three steps (switch, observe, drop), one at a time, whoever asks.
        steps = []
        for _ in range(3):
            pair = await asyncio.gather(
                here.advance_ring("ns", "echo", 0.0), there.advance_ring("ns", "echo", 0.0)
            )
            steps += [step for step, _holders in pair]
        assert sum(s.advanced for s in steps) == 3, steps
        assert max(s.ring.revision for s in steps) == 4
        ring, _ = await here.ring_status("ns", "echo")
        assert ring is not None and ring.phase.value == "steady" and len(ring.keys) == 1


async def test_postgres_statements_are_planned_for_their_parameters(
    postgres: PostgresServer,
) -> None:
    """Every session plans each statement for its parameters, prepared or not. A generic plan
    made while the ledger was small read the whole epochs table on every issue ever after,
    slower as the ledger grew."""
    store = await open_store(postgres.new_database())
    try:
        for n in range(12):  # past psycopg's threshold (5) and the server's custom plans (5)
            await store.issue("ns", "echo", f"r{n}")
            await store.list_server("ns", "echo")
        # The writer's one session, a reader's, the read barrier's.
        for engine in (store._writer, store._reader, store._revision_reader):
            assert engine is not None
            with engine.connect() as conn:
                mode = conn.exec_driver_sql("SHOW plan_cache_mode").scalar()
                assert mode == "force_custom_plan"
    finally:
        await store.close()


async def test_postgres_a_writer_connection_lost_while_idle_is_found_before_a_commit(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer has no ping at every check-out (it cost a round trip a commit); a
    connection idle for long is still pinged, so one the database dropped meanwhile costs
    no write a failure."""
    monkeypatch.setattr(engines, "WRITER_IDLE_PING_SECONDS", 0.0)  # every commit is "idle"
    url = postgres.new_database()
    store = await open_store(url)
    try:
        await store.issue("ns", "echo", "before")
        postgres.drop_connections(url)
        rec, created = await store.issue("ns", "echo", "after")
        assert created and (await store.get(rec.generation)) == rec
    finally:
        await store.close()


async def test_postgres_a_writer_connection_lost_mid_commit_fails_that_commit_only(
    postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the idle ping, the commit that finds the connection dead fails (503, nothing
    written), and the connection is thrown away at once: the next commit succeeds, and the
    pool never logs a failed reset of the dead one."""
    monkeypatch.setattr(engines, "WRITER_IDLE_PING_SECONDS", 3600.0)
    url = postgres.new_database()
    store = await open_store(url)
    try:
        await store.issue("ns", "echo", "before")
        revision = (await store.list_server("ns", "echo")).revision
        postgres.drop_connections(url)
        with pytest.raises(StoreUnavailable):
            await store.issue("ns", "echo", "lost")
        rec, created = await store.issue("ns", "echo", "after")
        assert created and rec.revision == revision + 1  # the failed commit wrote nothing
        assert [r.request_uid for r in (await store.list_server("ns", "echo")).epochs] == [
            "before",
            "after",
        ]
    finally:
        await store.close()
    assert "Exception during reset" not in caplog.text


def test_a_follower_tells_its_own_change_notices_from_other_processes() -> None:
    assert own_revision("change abc 41", "abc") == 41
    assert own_revision("change other 41", "abc") is None
    assert own_revision("reload", "abc") is None
    assert own_revision("change abc", "abc") is None  # malformed: read, never skip
