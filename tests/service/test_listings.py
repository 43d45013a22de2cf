"""Rendered epoch lists: one render per (server, filter, view, revision), never shared across
views or revisions."""

from __future__ import annotations

from epochsvc.service.lifecycle import State
from epochsvc.service.listings import RenderedLists


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
