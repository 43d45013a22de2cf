"""A local copy of the ledger's epochs for this server, kept fresh by the service's long poll.

Readers (the guard, the store) only read :attr:`LiveEpochView.snapshot`, an immutable object
swapped atomically, so the hot path never does I/O. The follower keeps the last good snapshot
while the service is away and picks up where it left off when it returns; a new ``ledger_id``
(ledger wiped or replaced) replaces the copy wholesale, as does every answer (the service
always returns the full current list).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from mcp_epoch import api
from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch._internal.snapshot import EpochRecord, EpochSnapshot
from mcp_epoch.api_client import EpochServiceClient, EpochServiceError, EpochServiceUnavailable
from mcp_epoch.contract import MAX_WAIT_SECONDS

log = logging.getLogger(__name__)


class CredentialsRefused(RuntimeError):
    """The epoch service answered 401/403: retrying will not help until someone acts."""


class LiveEpochView:
    """Follows ``GET /v1/servers/{ns}/{server}/epochs?since=&wait=`` in the background."""

    def __init__(
        self,
        service_url: str,
        namespace: str,
        server: str,
        token: str | Callable[[], str | None] | None = None,
        *,
        wait: float = 25.0,
        min_backoff: float = 0.1,
        max_backoff: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._service_url = service_url
        self._namespace = namespace
        self._server = server
        # A callable is asked before every poll (a projected token file rotates in place).
        self._token = token
        self._wait = min(max(wait, 0.0), MAX_WAIT_SECONDS)
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._transport = transport
        self._snapshot = EpochSnapshot()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        #: True while the service refuses this replica's credentials (a safety path: loud).
        self.refused = False
        #: Polls the service refused for credentials, since start (``/metrics``).
        self.refusals = 0
        self.last_sync: float | None = None  # monotonic time of the last good answer

    @classmethod
    def from_config(cls, config: ReplicaConfig, **kwargs: Any) -> LiveEpochView | None:
        """A view for this server, or None when the environment does not name a service."""
        if not (config.service_url and config.namespace and config.server):
            return None
        return cls(config.service_url, config.namespace, config.server, config.credential, **kwargs)

    @property
    def snapshot(self) -> EpochSnapshot:
        return self._snapshot

    def _publish(self, snap: EpochSnapshot) -> None:
        old = self._snapshot
        if old.ledger_id is not None and old.ledger_id != snap.ledger_id:
            log.warning("ledger changed from %s to %s: copy reset", old.ledger_id, snap.ledger_id)
        with self._changed:
            self._snapshot = snap
            self.last_sync = time.monotonic()
            self.last_error = None
            self._changed.notify_all()

    def _refused(self, exc: CredentialsRefused) -> None:
        if not self.refused:  # loud once per outage, not once per retry
            log.error("%s", exc)
        with self._changed:
            self.refused = True
            self.refusals += 1
            self.last_error = str(exc)
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[EpochSnapshot], bool], timeout: float) -> bool:
        """Block a thread (not the event loop) until ``predicate(snapshot)`` holds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self._snapshot):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    async def poll_once(self, client: EpochServiceClient, since: int | None) -> EpochSnapshot:
        wait = self._wait if since is not None else None
        try:
            listing = await client.once(api.list_server(self._namespace, self._server, since, wait))
        except EpochServiceError as exc:
            if exc.status in (401, 403) and exc.code != "not-bound":
                raise CredentialsRefused(
                    f"the epoch service refused this replica's credentials ({exc.status}): "
                    "this process keeps its last copy of the ledger and cannot learn of new or "
                    "retired epochs, and reports not ready; check the pod's projected token "
                    "(MCP_EPOCH_SERVICE_TOKEN_FILE, audience mcp-epoch) or "
                    "MCP_EPOCH_SERVICE_TOKEN"
                ) from None
            raise
        records = [
            EpochRecord(e.epoch, e.state, e.incarnation, e.address, e.successor, e.successor_of)
            for e in listing.epochs
        ]
        return EpochSnapshot.of(listing.ledger_id, listing.revision, records)

    async def follow(self) -> None:
        """Run forever: long-poll, publish, back off on errors (keeping the last snapshot)."""
        backoff = self._min_backoff
        timeout = httpx.Timeout(5.0, read=self._wait + 10.0)
        async with EpochServiceClient(
            self._service_url, self._token, timeout=timeout, transport=self._transport
        ) as client:
            since: int | None = None
            while True:
                try:
                    snap = await self.poll_once(client, since)
                except (
                    EpochServiceError,
                    EpochServiceUnavailable,
                    RuntimeError,
                    ValueError,
                ) as exc:
                    if isinstance(exc, CredentialsRefused):
                        self._refused(exc)
                    else:
                        self.last_error = repr(exc)
                        log.debug("epoch view poll failed: %r", exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self._max_backoff)
                    since = None  # the service may have come back as another ledger
                    continue
                backoff = self._min_backoff
                if self.refused:
                    log.warning("the epoch service accepts this replica's credentials again")
                    self.refused = False
                if since is not None and snap.revision == since and snap == self._snapshot:
                    continue  # long poll timed out with no change
                self._publish(snap)
                since = snap.revision

    def start(self) -> None:
        """Follow in a daemon thread with its own event loop: works under any server."""
        if self._thread is not None:
            return
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._task = loop.create_task(self.follow())
            ready.set()
            try:
                loop.run_until_complete(self._task)
            except asyncio.CancelledError:
                pass
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="epoch-live-view", daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self, timeout: float = 5.0) -> None:
        thread, loop, task = self._thread, self._loop, self._task
        if thread is None or loop is None or task is None:
            return
        loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout)
        self._thread = None
