"""Long polls: hold a reader until its server's epochs change or its wait runs out.

Waiters are woken by the change notifications the service already has, per server: a write
made by this process (the routers, the sweeper) and, on PostgreSQL, a write of another
service process delivered by the store's follower. A change to one server wakes only that
server's waiters, so a fleet of servers never turns one write into a thundering herd.

Each waiter also re-reads its server's newest revision every ``poll_interval`` (from the
in-memory copy: no database read while the copy is whole). Waiting on notifications alone,
without these re-reads, made the end-to-end rolling deploy lose a call in about one run in
three, for a reason not found yet (branch ``wip/longpoll-no-poll``), so the re-reads stay.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from epochsvc.service.store.base import EpochStore

Key = tuple[str, str]


class ChangeNotifier:
    def __init__(self) -> None:
        self._events: dict[Key, asyncio.Event] = {}
        self._waiting: dict[Key, int] = {}
        self.waiters = 0
        self.closed = False

    def close(self) -> None:
        """The service is stopping: answer every long poll now, and later ones at once, so
        replicas move to another service replica instead of holding this one open."""
        self.closed = True
        self.notify()

    def notify(self, servers: Iterable[Key] | None = None) -> None:
        """Wake the current waiters of ``servers`` (every waiter when None: a change whose
        servers are not known, such as a reload of the whole copy). Later waiters wait for
        the next change."""
        keys = list(self._events) if servers is None else servers
        for key in keys:
            event = self._events.pop(key, None)
            if event is not None:
                event.set()

    def notify_server(self, namespace: str, server: str) -> None:
        self.notify(((namespace, server),))

    async def wait_for_change(
        self,
        store: EpochStore,
        namespace: str,
        server: str,
        since: int,
        wait: float,
        poll_interval: float,
    ) -> None:
        """Return once a change newer than ``since`` exists for the server, or ``wait`` passes."""
        key = (namespace, server)
        deadline = time.monotonic() + wait
        self.waiters += 1
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            while True:
                # Taken before the read: a change between the read and the wait still wakes.
                event = self._events.get(key)
                if event is None:
                    event = self._events[key] = asyncio.Event()
                newest, ledger = await store.server_revision(namespace, server)
                # since > ledger: the caller's copy came from another (replaced) ledger.
                if newest > since or since > ledger or self.closed:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                timeout = min(remaining, poll_interval)
                try:
                    async with asyncio.timeout(timeout):
                        await event.wait()
                except TimeoutError:
                    if time.monotonic() >= deadline:
                        return  # the caller reads the list anyway: no last look needed
        finally:
            self.waiters -= 1
            left = self._waiting[key] - 1
            if left:
                self._waiting[key] = left
            else:
                del self._waiting[key]
                self._events.pop(key, None)
