"""The long-poll notifier in-process: waiters are woken per server by notifications."""

from __future__ import annotations

import asyncio

from epochsvc.service.longpoll import ChangeNotifier


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
    """One scheduler round: every task woken so far has run up to its next await."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_change_wakes_only_its_own_servers_waiters() -> None:
    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        a = [
            asyncio.create_task(notifier.wait_for_change(store, "ns", "a", 0, 60, 1))  # type: ignore[arg-type]
            for _ in range(50)
        ]
        b = asyncio.create_task(notifier.wait_for_change(store, "ns", "b", 0, 60, 1))  # type: ignore[arg-type]
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
        await asyncio.wait_for(asyncio.gather(*a), 5)
        assert notifier.waiters == 0 and not notifier._events  # nothing kept for idle servers

    asyncio.run(scenario())


def test_a_change_between_the_read_and_the_wait_is_not_missed() -> None:
    """The event is taken before the revision is read: a notify that lands in between
    (while the read is in progress) still wakes the waiter."""

    class Racing(CountingStore):
        async def server_revision(self, namespace: str, server: str) -> tuple[int, int]:
            result = await super().server_revision(namespace, server)
            if self.reads == 1:  # the change lands while the first read is in flight
                self.revisions[(namespace, server)] = 1
                notifier.notify_server(namespace, server)
            return result

    notifier = ChangeNotifier()

    async def scenario() -> None:
        store = Racing()
        await asyncio.wait_for(notifier.wait_for_change(store, "ns", "a", 0, 60, 60), 5)  # type: ignore[arg-type]
        assert store.reads == 2

    asyncio.run(scenario())


def test_close_answers_every_waiter_at_once() -> None:
    async def scenario() -> None:
        store, notifier = CountingStore(), ChangeNotifier()
        tasks = [
            asyncio.create_task(notifier.wait_for_change(store, "ns", s, 0, 60, 60))  # type: ignore[arg-type]
            for s in ("a", "b", "c")
        ]
        await _yield_to_waiters()
        notifier.close()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        # And a later one returns at once.
        await asyncio.wait_for(notifier.wait_for_change(store, "ns", "d", 0, 60, 60), 5)  # type: ignore[arg-type]

    asyncio.run(scenario())
