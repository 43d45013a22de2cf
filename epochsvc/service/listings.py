"""A server's epoch list, rendered once per revision and shared by every caller asking the same.

One change to a server wakes every long poll held on it, and they all answer with the same
list at the same ledger revision. Building the models and the JSON once per (server, state
filter, view, revision), instead of once per waiter, is what keeps waking thousands of
waiters short and lets ``/healthz`` and every other request interleave.

The revision is the ledger's (one consistent snapshot), so one revision is one content. The
view is the caller's kind: pod UIDs are shown to the operator only.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

from epochsvc.service.lifecycle import State

#: Distinct (server, filter, view) answers kept; the oldest goes first.
MAX_ENTRIES = 1024

ListKey = tuple[str, str, str, tuple[str, ...], bool]


class RenderedLists:
    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._max = max_entries
        self._entries: collections.OrderedDict[ListKey, tuple[int, bytes]] = (
            collections.OrderedDict()
        )
        self.rendered = 0  # how many times a list was actually built (tests, metrics)

    @staticmethod
    def key(
        ledger_id: str, namespace: str, server: str, states: Iterable[State], operator: bool
    ) -> ListKey:
        return (ledger_id, namespace, server, tuple(sorted(s.value for s in states)), operator)

    def get(self, key: ListKey, revision: int, render: Callable[[], bytes]) -> bytes:
        """The list at ``revision``, rendered by ``render`` unless it already was."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] == revision:
            self._entries.move_to_end(key)
            return entry[1]
        body = render()
        self.rendered += 1
        self._entries[key] = (revision, body)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
        return body
