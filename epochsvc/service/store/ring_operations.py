"""The SQL store's request-state ring operations (``keyring.py`` decides, ``rings.py`` holds
the statements): each a read, or one write under the ledger's writer lock.

A mixin of :class:`~epochsvc.service.store.sql.SqlEpochStore`, which provides the two ways in:
``_read_db`` (a read on the reader pool) and ``_write`` (the group committer's transaction).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import Connection

from epochsvc.service import keyring
from epochsvc.service.keyring import Holder, Ring, Step
from epochsvc.service.lifecycle import LifecycleError
from epochsvc.service.store import queries, rings

T = TypeVar("T")


class RingOperations:
    ledger8: str

    if TYPE_CHECKING:  # provided by SqlEpochStore

        async def _read_db(self, fn: Callable[[Connection], T]) -> T: ...

        async def _write(self, op: Callable[[Connection], T]) -> T: ...

    def _locked_ring(self, conn: Connection, namespace: str, server: str, ttl: float) -> Ring:
        """The ring, for this write to change; made if it does not exist yet. Under the writer
        lock: two service processes on one PostgreSQL never make or step one ring twice."""
        queries.lock_writers(conn)
        ring = rings.read(conn, namespace, server)
        if ring is None:
            ring = keyring.new_ring(namespace, server, ttl, time.time())
            rings.insert(conn, ring)
        return ring

    async def ring(self, namespace: str, server: str, ttl: float) -> Ring:
        found = await self._read_db(lambda conn: rings.read(conn, namespace, server))
        if found is not None:
            return found
        return await self._write(lambda conn: self._locked_ring(conn, namespace, server, ttl))

    async def ring_status(self, namespace: str, server: str) -> tuple[Ring | None, list[Holder]]:
        def read(conn: Connection) -> tuple[Ring | None, list[Holder]]:
            return rings.read(conn, namespace, server), rings.holders(conn, namespace, server)

        return await self._read_db(read)

    async def ring_revision(self, namespace: str, server: str) -> int:
        found = await self._read_db(lambda conn: rings.read(conn, namespace, server))
        return 0 if found is None else found.revision

    async def ring_revisions(self) -> dict[tuple[str, str], int]:
        return await self._read_db(rings.revisions)

    async def report_ring(self, generation: int, incarnation: int, revision: int) -> Step:
        """Record the report; the report that leaves no live pod behind takes the rotation's
        step there and then (the ring returned is the one after it). The step waits for the
        last holder, so it is taken at that holder's report, not at someone's next look."""

        def op(conn: Connection) -> Step:
            queries.lock_writers(conn)  # the step below: one ring, one writer at a time
            current = queries.fetch(conn, generation, self.ledger8)
            if current.incarnation != incarnation:
                raise LifecycleError(
                    "stale-incarnation",
                    f"process {current.epoch}.{incarnation} is not the newest process of its "
                    "pod; only the newest reports what it holds",
                )
            ring = rings.read(conn, current.namespace, current.server)
            if ring is None or revision > ring.revision or revision < 1:
                raise LifecycleError(
                    "unknown-ring-revision",
                    f"{current.namespace}/{current.server} has no ring revision {revision}",
                )
            now = time.time()
            rings.report(conn, generation, incarnation, revision, now)
            return self._step(conn, ring, now)[0]

        return await self._write(op)

    async def rotate_ring(
        self, namespace: str, server: str, ttl: float
    ) -> tuple[Ring, list[Holder]]:
        def op(conn: Connection) -> tuple[Ring, list[Holder]]:
            ring = self._locked_ring(conn, namespace, server, ttl)
            rotating = keyring.start_rotation(ring, time.time())
            rings.update(conn, rotating)
            return rotating, rings.holders(conn, namespace, server)

        return await self._write(op)

    async def advance_ring(
        self, namespace: str, server: str, ttl: float
    ) -> tuple[Step, list[Holder]]:
        def op(conn: Connection) -> tuple[Step, list[Holder]]:
            ring = self._locked_ring(conn, namespace, server, ttl)
            return self._step(conn, ring, time.time())

        return await self._write(op)

    @staticmethod
    def _step(conn: Connection, ring: Ring, now: float) -> tuple[Step, list[Holder]]:
        """At most one step of ``ring``'s rotation, given its live pods now (writer lock held)."""
        holders = rings.holders(conn, ring.namespace, ring.server)
        step = keyring.advance(ring, holders, now)
        if step.ring != ring:
            rings.update(conn, step.ring)
        return step, holders
