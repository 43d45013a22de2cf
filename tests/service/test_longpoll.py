"""The long-poll notifier in-process: waiters are woken per server by notifications and never
poll; one catch-up pass reads each waited-on server once and wakes it if it moved unannounced."""

from __future__ import annotations

import asyncio
from typing import Any

from epochsvc.service.longpoll import WAKE_BATCH, ChangeNotifier
from epochsvc.service.store.base import StoreUnavailable


class CountingStore:
    """``server_revision`` from a dict, counting the reads (each read is a waiter's pass)."""

    def __init__(self) -> None:
        self.revisions: dict[tuple[str, str], int] = {}
        self.reads = 0

    async def server_revision(self, namespace: str, server: str) -> tuple[int, int]:
        self.reads += 1
        newest = self.revisions.get((namespace, server), 0)
        return newest, max(self.revisions.values(), default=0)


async def _yield_to_waiters() -> None:
    """A few scheduler rounds: every task woken so far has run up to its next await."""
    for _ in range(3):
        await asyncio.sleep(0)


async def _woken_by(woken_by: int | None) -> bytes:
    """An answer that tells which notification woke its waiter (empty: none did)."""
    return b"" if woken_by is None else b"%d" % woken_by


async def _hold(notifier: ChangeNotifier, *args: Any) -> bytes:
    """A poll held as the app without its front holds it: begun, then waited for."""
    got = await notifier.begin(*args)
    return got if isinstance(got, bytes) else await got.wait()


async def _held(
    notifier: ChangeNotifier, store: CountingStore, server: str, since: int = 0, wait: float = 60
) -> int | None:
    """Hold a poll answered by :func:`_woken_by`, each waiter on its own (no share)."""
    body = await _hold(notifier, store, "ns", server, since, wait, _woken_by)
    return int(body) if body else None


def _waiter(
    notifier: ChangeNotifier, store: CountingStore, server: str, since: int = 0
) -> asyncio.Task[int | None]:
    return asyncio.create_task(_held(notifier, store, server, since))


def test_a_change_wakes_only_its_own_servers_waiters() -> None:
    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        a = [_waiter(notifier, store, "a") for _ in range(50)]
        b = _waiter(notifier, store, "b")
        await _yield_to_waiters()
        assert notifier.waiters == 51 and store.reads == 51
        store.revisions[("ns", "b")] = 1
        notifier.notify_server("ns", "b")
        await asyncio.wait_for(b, 5)
        await _yield_to_waiters()
        assert store.reads == 52  # only b's waiter read again; a's 50 never woke
        assert not any(t.done() for t in a)
        store.revisions[("ns", "a")] = 2
        notifier.notify_server("ns", "a")
        # Each says which notification woke it (2: b's was 1), for the read they share.
        assert await asyncio.wait_for(asyncio.gather(*a), 5) == [2] * 50
        assert b.result() == 1 and notifier.changes == 2
        assert notifier.waiters == 0 and not notifier._events  # nothing kept for idle servers

    asyncio.run(scenario())


def test_a_waiter_never_polls_until_its_wait_ends() -> None:
    async def scenario() -> int:
        store, notifier = CountingStore(), ChangeNotifier()
        # Its wait ran out: no notification woke it, so it shares no read.
        assert await _held(notifier, store, "a", wait=0.3) is None
        return store.reads

    assert asyncio.run(scenario()) == 1


def test_the_catch_up_reads_each_server_once_and_wakes_a_change_nobody_announced() -> None:
    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        a = [_waiter(notifier, store, "a") for _ in range(100)]
        b = [_waiter(notifier, store, "b") for _ in range(100)]
        await _yield_to_waiters()
        reads = store.reads
        assert await notifier.catch_up_once(store) == 0  # nothing moved since they looked
        assert store.reads == reads + 2  # one read per server, not per waiter
        store.revisions[("ns", "a")] = 5  # changed with no notification
        assert await notifier.catch_up_once(store) == 1
        await asyncio.wait_for(asyncio.gather(*a), 5)
        assert not any(t.done() for t in b)
        store.revisions[("ns", "b")] = 6
        notifier.notify_server("ns", "b")
        await asyncio.wait_for(asyncio.gather(*b), 5)
        assert await notifier.catch_up_once(store) == 0 and not notifier._seen

    asyncio.run(scenario())


def test_an_unannounced_change_before_the_first_catch_up_still_wakes() -> None:
    """The waiter looked (revision 0) and was held; another process changed the server, and
    its notification was lost, before the catch-up first read the server. The catch-up
    compares with what the waiter saw, so that change wakes it."""

    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        waiter = _waiter(notifier, store, "a")
        await _yield_to_waiters()
        store.revisions[("ns", "a")] = 3  # changed with no notification
        assert await notifier.catch_up_once(store) == 1
        await asyncio.wait_for(waiter, 5)

    asyncio.run(scenario())


def test_each_waiter_ends_at_its_own_deadline_though_they_share_one_timer() -> None:
    """A server's waiters share one loop timer: a shorter wait registered after a longer one
    still ends at its own deadline, never before it, and a change leaves no timer behind."""

    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        loop = asyncio.get_running_loop()
        begun = loop.time()
        long = asyncio.create_task(_held(notifier, store, "a", wait=30))
        short = asyncio.create_task(_held(notifier, store, "a", wait=0.2))
        assert await asyncio.wait_for(short, 10) is None  # its wait ran out
        assert loop.time() - begun >= 0.2
        assert not long.done()
        wake = notifier._events[("ns", "a")]
        store.revisions[("ns", "a")] = 1
        notifier.notify_server("ns", "a", 1)
        assert wake._timer is None and not wake._deadlines  # disarmed by the change
        assert await asyncio.wait_for(long, 5) == 1  # woken by the change, not its deadline

    asyncio.run(scenario())


def test_a_change_between_the_read_and_the_wait_is_not_missed() -> None:
    """The event is taken before the revision is read: a notify that lands while the read is
    in progress still wakes the waiter."""
    notifier = ChangeNotifier()

    class Racing(CountingStore):
        async def server_revision(self, namespace: str, server: str) -> tuple[int, int]:
            result = await super().server_revision(namespace, server)
            if self.reads == 1:
                self.revisions[(namespace, server)] = 1
                notifier.notify_server(namespace, server)
            return result

    async def scenario() -> None:
        store = Racing()
        await asyncio.wait_for(_held(notifier, store, "a"), 5)
        assert store.reads == 2

    asyncio.run(scenario())


def test_close_answers_every_waiter_at_once() -> None:
    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        tasks = [_waiter(notifier, store, s) for s in ("a", "b", "c")]
        await _yield_to_waiters()
        notifier.close()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        await asyncio.wait_for(_held(notifier, store, "d"), 5)

    asyncio.run(scenario())


def test_a_wake_of_many_waiters_lets_other_work_run_between_its_batches() -> None:
    async def scenario() -> list[int]:
        store, notifier = CountingStore(), ChangeNotifier()
        n = 4 * WAKE_BATCH
        tasks = [_waiter(notifier, store, "a") for _ in range(n)]
        await _yield_to_waiters()
        base = store.reads
        store.revisions[("ns", "a")] = 1
        notifier.notify_server("ns", "a")
        seen: list[int] = []  # waiters resumed so far, at each turn of another task
        while len(seen) < 50 and store.reads - base < n:
            await asyncio.sleep(0)
            seen.append(store.reads - base)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        return seen

    seen = asyncio.run(scenario())
    assert any(0 < resumed < 4 * WAKE_BATCH for resumed in seen), seen


def test_a_notification_that_names_a_newer_revision_spares_every_waiter_a_read() -> None:
    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        store.revisions[("ns", "a")] = 4
        waiters = [_waiter(notifier, store, "a", since=4) for _ in range(100)]
        await _yield_to_waiters()
        assert store.reads == 100  # each looked once, on arrival
        # A write that changed nothing (its record's revision is the one they have): they
        # wait on, each looking once more after registering anew (a change notified in
        # between would otherwise be missed).
        notifier.notify_server("ns", "a", 4)
        await _yield_to_waiters()
        assert not any(t.done() for t in waiters) and store.reads == 200
        store.revisions[("ns", "a")] = 5
        notifier.notify_server("ns", "a", 5)
        assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [2] * 100
        assert store.reads == 200  # woken by the revision, not by a read each

    asyncio.run(scenario())


def test_a_change_notified_while_a_waiter_registers_anew_is_not_missed() -> None:
    """A no-op write wakes the waiter; a real change is notified before it has registered
    again (no waiter of the server to wake then). Its next look finds the change."""

    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        store.revisions[("ns", "a")] = 4
        waiter = _waiter(notifier, store, "a", since=4)
        await _yield_to_waiters()
        notifier.notify_server("ns", "a", 4)  # changed nothing: the waiter is resumed...
        store.revisions[("ns", "a")] = 5
        notifier.notify_server("ns", "a", 5)  # ...and this lands before it registers anew
        assert await asyncio.wait_for(waiter, 5) is not None

    asyncio.run(scenario())


def test_a_change_already_announced_is_not_announced_again_by_the_catch_up() -> None:
    """Every woken replica polls again at once, from the revision it was told. The catch-up
    must take the announced revision as its baseline: were it to keep the one the first
    waiters saw, its next pass would "find" the announced change again and wake every new
    waiter for nothing, each reading the store once more (one spurious wake of the whole
    fleet per change)."""

    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        first = [_waiter(notifier, store, "a") for _ in range(50)]
        await _yield_to_waiters()
        assert await notifier.catch_up_once(store) == 0
        store.revisions[("ns", "a")] = 1
        notifier.notify_server("ns", "a", 1)
        await asyncio.wait_for(asyncio.gather(*first), 5)
        again = [_waiter(notifier, store, "a", since=1) for _ in range(50)]
        await _yield_to_waiters()
        reads = store.reads
        assert await notifier.catch_up_once(store) == 0
        await _yield_to_waiters()
        assert store.reads == reads + 1  # the catch-up's own read, no waiter's
        assert not any(t.done() for t in again) and notifier.waiters == 50
        # An unannounced change after the announced one still wakes them.
        store.revisions[("ns", "a")] = 2
        assert await notifier.catch_up_once(store) == 1
        await asyncio.wait_for(asyncio.gather(*again), 5)

    asyncio.run(scenario())


class _SharedAnswer:
    """An answer that waiters share: it says the server's revision when it was made, and
    counts how often it was made (once per change for all of them, not once per waiter)."""

    def __init__(self, store: CountingStore, fail_first: bool = False) -> None:
        self.store, self.fail_first, self.made = store, fail_first, 0

    async def __call__(self, woken_by: int | None) -> bytes:
        self.made += 1
        if self.fail_first and self.made == 1:
            raise StoreUnavailable("the database is down")
        return b"revision %d" % self.store.revisions.get(("ns", "a"), 0)


def _sharing(
    notifier: ChangeNotifier, store: CountingStore, answer: _SharedAnswer, since: int = 0
) -> asyncio.Task[bytes]:
    return asyncio.create_task(_hold(notifier, store, "ns", "a", since, 60, answer, "list"))


def test_the_waiters_a_change_answers_share_one_answer_made_after_it() -> None:
    """Waiters of one server with the same answer take it made once, by the wake, after the
    notification (so it shows the change); one this change does not answer (it already has
    the announced revision) waits on, and one that left early is simply skipped."""

    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        store.revisions[("ns", "b")] = 3  # the ledger is at 3 (another server's change)
        answer = _SharedAnswer(store)
        sharing = [_sharing(notifier, store, answer) for _ in range(3 * WAKE_BATCH)]
        ahead = _sharing(notifier, store, answer, since=3)
        await _yield_to_waiters()
        sharing.pop().cancel()  # its request ended while it was held
        await _yield_to_waiters()
        assert notifier.waiters == 3 * WAKE_BATCH and answer.made == 0
        store.revisions[("ns", "a")] = 3
        notifier.notify_server("ns", "a", 3)
        bodies = await asyncio.wait_for(asyncio.gather(*sharing), 5)
        assert set(bodies) == {b"revision 3"} and len(bodies) == 3 * WAKE_BATCH - 1
        assert answer.made == 1  # one answer for all of them
        # Each looked once on arrival; since, only the one it did not answer looked again.
        assert store.reads == 3 * WAKE_BATCH + 1 + 1
        assert not ahead.done() and notifier.waiters == 1
        store.revisions[("ns", "a")] = 4
        notifier.notify_server("ns", "a", 4)
        assert await asyncio.wait_for(ahead, 5) == b"revision 4" and notifier.waiters == 0
        assert not notifier._events and not notifier._waiting  # nothing kept for idle servers

    asyncio.run(scenario())


def test_a_shared_answer_that_fails_fails_each_of_its_waiters_and_not_the_next_change() -> None:
    """A store down when the shared answer is made: every waiter it was for gets the error
    (the API answers each with its 503), and the next change is answered afresh."""

    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        answer = _SharedAnswer(store, fail_first=True)
        first = [_sharing(notifier, store, answer) for _ in range(10)]
        await _yield_to_waiters()
        store.revisions[("ns", "a")] = 1
        notifier.notify_server("ns", "a", 1)
        results = await asyncio.wait_for(asyncio.gather(*first, return_exceptions=True), 5)
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        again = [_sharing(notifier, store, answer, since=1) for _ in range(10)]
        await _yield_to_waiters()
        store.revisions[("ns", "a")] = 2
        notifier.notify_server("ns", "a", 2)
        assert await asyncio.wait_for(asyncio.gather(*again), 5) == [b"revision 2"] * 10
        assert answer.made == 2 and notifier.waiters == 0

    asyncio.run(scenario())
