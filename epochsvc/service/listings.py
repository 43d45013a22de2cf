"""A server's epoch list, rendered once per revision and shared by every caller asking the same.

One change to a server wakes every long poll held on it, and they all answer with the same
list at the same ledger revision. Building the models and the JSON once per (server, state
filter, view, revision), instead of once per waiter, is what keeps waking thousands of
waiters short and lets ``/healthz`` and every other request interleave.

The revision is the ledger's (one consistent snapshot), so one revision is one content. The
view is the caller's kind: pod UIDs are shown to the operator only.

The read is shared too (:meth:`RenderedLists.after_change`): the waiters one notification woke
take the answer of one read begun after that notification, instead of one read each.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Iterable

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
        # Per answer: the read serving waiters woken by a notification, and the notification
        # count when it began (a read begun at count n sees every change up to n).
        self._reads: collections.OrderedDict[ListKey, tuple[int, asyncio.Future[bytes]]] = (
            collections.OrderedDict()
        )
        self.shared_reads = 0  # reads begun by after_change (tests)

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

    def after_change(
        self, key: ListKey, woken_by: int, changes: int, read: Callable[[], Awaitable[bytes]]
    ) -> Awaitable[bytes]:
        """The answer for a waiter that notification number ``woken_by`` woke, when the
        notifier has counted ``changes``: the answer of a read begun at ``woken_by`` or later
        if one exists (finished or not), else of a new ``read()`` that later waiters share.

        Not a coroutine: most of a wake's waiters find the read done, and awaiting a done
        future costs them no frame."""
        entry = self._reads.get(key)
        if entry is None or entry[0] < woken_by:
            entry = (changes, asyncio.ensure_future(read()))
            self.shared_reads += 1
            self._reads[key] = entry
            self._reads.move_to_end(key)
            while len(self._reads) > self._max:
                self._reads.popitem(last=False)
        # Shielded: a waiter whose request ends does not cancel the others' read (a done read
        # is handed back as it is).
        return asyncio.shield(entry[1])
