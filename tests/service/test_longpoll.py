"""The long-poll notifier in-process: waiters are woken per server by notifications and never
poll; one catch-up pass reads each waited-on server once and wakes it if it moved unannounced."""

from __future__ import annotations

import asyncio

from epochsvc.service.longpoll import WAKE_BATCH, ChangeNotifier


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


def _waiter(
    notifier: ChangeNotifier, store: CountingStore, server: str, since: int = 0
) -> asyncio.Task[int | None]:
    return asyncio.create_task(notifier.wait_for_change(store, "ns", server, since, 60))  # type: ignore[arg-type]


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
        assert await notifier.wait_for_change(store, "ns", "a", 0, 0.3) is None  # type: ignore[arg-type]
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
        long = asyncio.create_task(notifier.wait_for_change(store, "ns", "a", 0, 30))  # type: ignore[arg-type]
        short = asyncio.create_task(notifier.wait_for_change(store, "ns", "a", 0, 0.2))  # type: ignore[arg-type]
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
        await asyncio.wait_for(notifier.wait_for_change(store, "ns", "a", 0, 60), 5)  # type: ignore[arg-type]
        assert store.reads == 2

    asyncio.run(scenario())


def test_close_answers_every_waiter_at_once() -> None:
    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        tasks = [_waiter(notifier, store, s) for s in ("a", "b", "c")]
        await _yield_to_waiters()
        notifier.close()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        await asyncio.wait_for(notifier.wait_for_change(store, "ns", "d", 0, 60), 5)  # type: ignore[arg-type]

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
