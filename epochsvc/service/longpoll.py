"""Long polls: hold a reader until its server's epochs change or its wait runs out.

Writes made by this process wake waiters at once; every waiter also re-reads the store every
``poll_interval`` so that changes made by another service replica (sharing PostgreSQL) are seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from epochsvc.service.store.base import EpochStore


class ChangeNotifier:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.waiters = 0
        self.closed = False

    def close(self) -> None:
        """The service is stopping: answer every long poll now, and later ones at once, so
        replicas move to another service replica instead of holding this one open."""
        self.closed = True
        self.notify()

    def notify(self) -> None:
        """Wake every current waiter; later waiters wait for the next change."""
        self._event.set()
        self._event = asyncio.Event()

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
        deadline = time.monotonic() + wait
        self.waiters += 1
        try:
            while True:
                event = self._event
                newest, ledger = await store.server_revision(namespace, server)
                # since > ledger: the caller's copy came from another (replaced) ledger.
                if newest > since or since > ledger or self.closed:
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(remaining, poll_interval))
        finally:
            self.waiters -= 1
