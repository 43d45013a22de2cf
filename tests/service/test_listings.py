"""Rendered epoch lists: one render per (server, filter, view, revision), never shared across
views or revisions; one read per notification for the waiters it woke."""

from __future__ import annotations

import asyncio

import pytest

from epochsvc.service.lifecycle import State
from epochsvc.service.listings import RenderedLists
from epochsvc.service.store.base import StoreUnavailable


def test_one_render_per_revision_and_view() -> None:
    lists = RenderedLists()
    calls: list[str] = []

    def render(text: str) -> bytes:
        calls.append(text)
        return text.encode()

    op = lists.key("L", "ns", "echo", (), operator=True)
    pod = lists.key("L", "ns", "echo", (), operator=False)
    assert [lists.get(op, 7, lambda: render("op@7")) for _ in range(1000)] == [b"op@7"] * 1000
    assert lists.get(pod, 7, lambda: render("pod@7")) == b"pod@7"  # another view
    assert lists.get(op, 8, lambda: render("op@8")) == b"op@8"  # a newer revision
    live = lists.key("L", "ns", "echo", (State.LIVE,), operator=True)
    assert lists.get(live, 8, lambda: render("live@8")) == b"live@8"  # another filter
    assert calls == ["op@7", "pod@7", "op@8", "live@8"] and lists.rendered == 4


def test_the_cache_is_bounded() -> None:
    lists = RenderedLists(max_entries=3)
    for i in range(10):
        lists.get(lists.key("L", "ns", f"s{i}", (), True), 1, lambda: b"x")
    first = lists.key("L", "ns", "s0", (), True)
    rendered = lists.rendered
    lists.get(first, 1, lambda: b"x")
    assert lists.rendered == rendered + 1  # s0 had been dropped


def test_the_waiters_one_notification_woke_share_one_read_begun_after_it() -> None:
    async def scenario() -> None:
        lists = RenderedLists()
        key = lists.key("L", "ns", "echo", (), operator=False)
        reads: list[int] = []
        gate = asyncio.Event()
        state = {"revision": 7}

        async def read() -> bytes:
            reads.append(state["revision"])
            await gate.wait()  # still in flight while the others arrive
            return f"list@{state['revision']}".encode()

        # Notification 3 woke 100 waiters; the notifier had counted 3 when they read.
        first = [asyncio.ensure_future(lists.after_change(key, 3, 3, read)) for _ in range(100)]
        await asyncio.sleep(0)
        gate.set()
        assert set(await asyncio.gather(*first)) == {b"list@7"} and reads == [7]
        # A waiter of the same notification resuming after the read finished takes it too.
        assert await lists.after_change(key, 3, 3, read) == b"list@7" and reads == [7]
        # Notification 4 (a newer change): the read begun at 3 may predate it, so a new one.
        state["revision"] = 8
        assert await lists.after_change(key, 4, 4, read) == b"list@8" and reads == [7, 8]
        assert lists.shared_reads == 2
        # Another view of the same server is another answer, read on its own.
        op = lists.key("L", "ns", "echo", (), operator=True)
        assert await lists.after_change(op, 4, 4, read) == b"list@8" and reads == [7, 8, 8]

    asyncio.run(scenario())


def test_a_failed_shared_read_fails_its_own_waiters_and_not_the_next_change() -> None:
    async def scenario() -> None:
        lists = RenderedLists()
        key = lists.key("L", "ns", "echo", (), operator=False)

        async def down() -> bytes:
            raise StoreUnavailable("the ledger database went away")

        async def up() -> bytes:
            return b"list"

        for _ in range(2):
            with pytest.raises(StoreUnavailable):
                await lists.after_change(key, 5, 5, down)
        assert await lists.after_change(key, 6, 6, up) == b"list"

    asyncio.run(scenario())
