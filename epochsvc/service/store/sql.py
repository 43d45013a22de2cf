"""The ledger on SQL: SQLite (embedded default) and PostgreSQL through SQLAlchemy 2 Core.

:class:`SqlEpochStore` puts the parts together: the statements (:mod:`.queries`), the
schema and its migrations (:mod:`.schema`, :mod:`.migrate`), the engines (:mod:`.engines`),
the group-committing writer (:mod:`.groupcommit`) and the in-memory copy of the epochs
(:mod:`.mirror`). A write that turns out to be a no-op rolls back, leaving the revision
untouched. The generation counter lives in the ``ledger`` row, apart from the epochs, so
compacting tombstones can never lower it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection, Engine

from epochsvc.service.lifecycle import (
    TOMBSTONES,
    Action,
    LifecycleError,
    State,
    check_handoff,
    check_incarnation,
    check_owner,
    check_successor,
    plan,
)
from epochsvc.service.store import migrate, pipeline, queries, rings
from epochsvc.service.store.barrier import RevisionBarrier
from epochsvc.service.store.base import (
    CommitStats,
    EpochRecord,
    EpochStore,
    RequestConflict,
    ServerSnapshot,
    SweepResult,
    UnknownEpoch,
)
from epochsvc.service.store.engines import (
    READ_THREADS,
    describe_url,
    driver_url,
    postgres_engine,
    postgres_revision_engine,
    postgres_writer_engine,
    read_once_more,
    sqlite_engines,
)
from epochsvc.service.store.errors import database_errors, store_error
from epochsvc.service.store.filelock import FileLock
from epochsvc.service.store.follower import Follower, change_notice, notify_reload
from epochsvc.service.store.groupcommit import GroupCommitter, NoChange
from epochsvc.service.store.issuing import IssueRequest
from epochsvc.service.store.mirror import LedgerMirror
from epochsvc.service.store.ring_operations import RingOperations
from epochsvc.service.store.schema import LEDGER_ROW, epochs_table, ledger_table
from mcp_epoch.contract import FALLBACK_INCARNATION_MIN, ProcessEpoch

log = logging.getLogger("epochsvc.store")

T = TypeVar("T")
_PG_INIT_LOCK = 0x6D6370  # advisory lock key: serialises schema set-up across processes


class SqlEpochStore(RingOperations, EpochStore):
    """The ledger on one SQL database, with every epoch also in memory.

    Reads are answered from the in-memory copy whenever it is known to be whole. SQLite:
    the process holds an exclusive lock on the ledger file (two writers on one file must never
    happen) and, being the only writer, its copy is complete by construction. PostgreSQL is
    shared by several service processes: a :class:`~.follower.Follower` keeps the copy
    current from their notifications, and while it is behind (after losing the database)
    reads go to the database.
    """

    def __init__(
        self,
        writer: Engine,
        reader: Engine,
        *,
        dialect: str,
        file_lock: FileLock | None = None,
        revision_reader: Engine | None = None,
    ) -> None:
        self._writer = writer
        self._reader = reader
        self._revision_reader = revision_reader  # PostgreSQL: the read barrier's
        self._lock = file_lock
        self.dialect = dialect
        self.ledger_id = ""
        #: Names this process's change notifications, which its own follower skips.
        self._sender = uuid.uuid4().hex[:12]
        # The same statement as text, sent with the COMMIT in one round trip: it announces
        # each commit to the other processes' followers (PostgreSQL delivers it at commit).
        literal = {"literal_binds": True}
        notice = change_notice(self._sender).compile(dialect=writer.dialect, compile_kwargs=literal)
        self._committer = GroupCommitter(
            writer,
            store_error,
            self._remember,
            closer=pipeline.Closing([(str(notice), None)]) if dialect == "postgresql" else None,
        )
        self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="epochsvc-reader")
        self._mirror = LedgerMirror()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._follower: Follower | None = None
        self._barrier = RevisionBarrier(self._database_revision)

    # --- set-up -------------------------------------------------------------------------

    @classmethod
    async def open(cls, url: str) -> SqlEpochStore:
        durl = driver_url(url)
        if durl.get_backend_name() == "sqlite":
            lock = FileLock.take(Path(durl.database or ""))
            store = cls(*sqlite_engines(durl), dialect="sqlite", file_lock=lock)
        else:
            writer = postgres_writer_engine(durl)
            engine = postgres_engine(durl)
            revisions = postgres_revision_engine(durl)
            store = cls(writer, engine, dialect="postgresql", revision_reader=revisions)
        try:
            await store._call(store._initialise)
            await store._reload_mirror()
        except BaseException:
            await store.close()
            raise
        return store

    def _initialise(self) -> None:
        """Schema (created or upgraded) and the ledger row, in one write transaction under
        the writer lock."""
        with self._tx() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_INIT_LOCK)))
            migrate.upgrade(conn)
            row = (conn.execute(sa.select(ledger_table.c.ledger_id))).first()
            if row is None:
                self.ledger_id = uuid.uuid4().hex
                conn.execute(
                    ledger_table.insert().values(
                        id=LEDGER_ROW,
                        ledger_id=self.ledger_id,
                        generation=0,
                        revision=0,
                        created_at=time.time(),
                    )
                )
                log.info("created ledger", extra={"ledger_id": self.ledger_id})
            else:
                self.ledger_id = row.ledger_id

    async def attach(self) -> None:
        """PostgreSQL: start following other processes' writes, delivered to the running
        loop. (SQLite has no other writer to follow.)"""
        if self.dialect != "postgresql" or self._follower is not None:
            return
        self._loop = asyncio.get_running_loop()
        await self._reload_mirror()  # anything written since open()
        self._follower = Follower(
            self._reader, self.ledger8, self._hand_over, self._lost, self._sender
        )
        self._follower.start()

    async def _reload_mirror(self) -> None:
        def read() -> tuple[list[EpochRecord], int]:
            with self._read() as conn:
                return queries.changes(conn, None, self.ledger8)

        records, revision = await self._call(read)
        self._mirror.replace(records, revision)

    def _remember(self, values: list[Any]) -> None:
        """After each group commit: this process's own writes are in its copy at once."""
        records = [v[0] if isinstance(v, tuple) else v for v in values]
        fresh = [r for r in records if isinstance(r, EpochRecord)]
        self._mirror.apply(fresh, max((r.revision for r in fresh), default=0))

    def _hand_over(self, records: list[EpochRecord], revision: int, full: bool) -> None:
        """From the follower's thread to the loop."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._apply_followed, records, revision, full)

    def _apply_followed(self, records: list[EpochRecord], revision: int, full: bool) -> None:
        mirror = self._mirror
        changed = mirror.replace(records, revision) if full else mirror.apply(records, revision)
        if changed and self.on_change is not None:
            newest: dict[tuple[str, str], int] = {}
            for r in records:
                key = (r.namespace, r.server)
                newest[key] = max(newest.get(key, 0), r.revision)
            self.on_change(None if full else newest)

    def _lost(self) -> None:
        """From the follower's thread: the copy may be behind until it has caught up."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._mark_unsynced)

    def _mark_unsynced(self) -> None:
        self._mirror.synced = False

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._close)

    def _close(self) -> None:
        if self._follower is not None:
            self._follower.stop()
        self._committer.close()
        self._readers.shutdown(wait=True)
        self._writer.dispose()
        if self._reader is not self._writer:
            self._reader.dispose()
        if self._revision_reader is not None:
            self._revision_reader.dispose()
        if self._lock is not None:
            self._lock.release()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with database_errors(), self._writer.begin() as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with database_errors(), self._reader.connect() as conn:
            yield conn

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run blocking database work off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._readers, fn)

    async def _write(self, op: Callable[[Connection], T]) -> T:
        with database_errors():
            return await self._committer.submit(op)

    async def _read_db(self, fn: Callable[[Connection], T]) -> T:
        def read() -> T:
            with self._read() as conn:
                return fn(conn)

        return await self._call(read)

    # --- writes -------------------------------------------------------------------------

    async def issue(
        self, namespace: str, server: str, request_uid: str
    ) -> tuple[EpochRecord, bool]:
        request = IssueRequest(namespace, server, request_uid, self.ledger8)
        record, created = await self._write(request)
        if (record.namespace, record.server) != (namespace, server):
            raise RequestConflict(
                f"request UID {request_uid} already issued epoch {record.epoch} for "
                f"{record.namespace}/{record.server}, not {namespace}/{server}"
            )
        return record, created

    async def transition(
        self,
        generation: int,
        action: Action,
        *,
        pod_name: str | None = None,
        pod_uid: str | None = None,
        address: str | None = None,
    ) -> EpochRecord:
        def op(conn: Connection) -> EpochRecord:
            revision, _ = queries.bump(conn)
            current = queries.fetch(conn, generation, self.ledger8)
            step = plan(
                current.epoch, current.state, action, bound_uid=current.pod_uid, pod_uid=pod_uid
            )
            values: dict[str, Any] = {}
            if step.target is not None:
                values["state"] = step.target.value
            if action is Action.BIND:
                if step.target is not None:
                    queries.check_pod_free(conn, generation, pod_uid, self.ledger8)
                    values.update(pod_name=pod_name, pod_uid=pod_uid)
                # The pod's IP comes after the pod is first seen: a repeated bind of the same
                # pod records it (the UID was checked by plan()).
                if (
                    address is not None
                    and address != current.address
                    and current.state not in TOMBSTONES
                ):
                    values["address"] = address
            if not values:
                raise NoChange(current)
            return queries.update(conn, generation, revision, self.ledger8, **values)

        return await self._write(op)

    async def register_incarnation(
        self,
        generation: int,
        *,
        pod_uid: str | None = None,
        pod_name: str | None = None,
        owner_only: bool = False,
    ) -> EpochRecord:
        def op(conn: Connection) -> EpochRecord:
            revision, _ = queries.bump(conn)
            current = queries.fetch(conn, generation, self.ledger8)
            check_incarnation(current.epoch, current.state)
            if owner_only:
                assert pod_uid is not None
                check_owner(current.epoch, current.pod_uid, pod_uid)
            elif pod_uid is not None and current.pod_uid not in (None, pod_uid):
                raise LifecycleError(
                    "pod-mismatch",
                    # Never the bound UID: a replica's caller must not learn another pod's.
                    f"epoch {current.epoch} is bound to another pod, not to pod UID {pod_uid}",
                )
            if pod_name is not None and current.pod_name not in (None, pod_name):
                raise LifecycleError(
                    "pod-mismatch",
                    f"epoch {current.epoch} is bound to another pod, not to pod {pod_name}",
                )
            nxt = 0 if current.incarnation is None else current.incarnation + 1
            if nxt >= FALLBACK_INCARNATION_MIN:
                raise LifecycleError(
                    "incarnations-exhausted", f"epoch {current.epoch} has no incarnations left"
                )
            return queries.update(conn, generation, revision, self.ledger8, incarnation=nxt)

        return await self._write(op)

    async def record_handoff(
        self,
        generation: int,
        incarnation: int,
        successor: ProcessEpoch,
        *,
        pod_uid: str | None = None,
    ) -> EpochRecord:
        def op(conn: Connection) -> EpochRecord:
            revision, _ = queries.bump(conn)
            current = queries.fetch(conn, generation, self.ledger8)
            if pod_uid is not None:
                check_owner(current.epoch, current.pod_uid, pod_uid)
            try:
                if successor.pod.ledger8 != self.ledger8:
                    raise UnknownEpoch(str(successor))
                target = queries.fetch(conn, successor.pod.generation, self.ledger8)
            except UnknownEpoch:
                raise LifecycleError(
                    "illegal-handoff", f"{successor} was never issued by this ledger"
                ) from None
            recorded = (current.successor, current.successor_of)
            if not check_handoff(
                current.epoch,
                current.state,
                current.incarnation,
                incarnation,
                recorded,
                str(successor),
            ):
                raise NoChange(current)
            check_successor(
                current.epoch,
                (current.namespace, current.server),
                str(successor),
                (target.namespace, target.server),
                target.state,
                target.incarnation,
                successor.incarnation,
            )
            return queries.update(
                conn,
                generation,
                revision,
                self.ledger8,
                successor=str(successor),
                successor_of=incarnation,
            )

        return await self._write(op)

    async def sweep(self, now: float, pending_timeout: float, tombstone_ttl: float) -> SweepResult:
        stale = sa.and_(
            epochs_table.c.state == State.PENDING.value,
            epochs_table.c.created_at < now - pending_timeout,
        )
        expired = sa.and_(
            epochs_table.c.state.in_([s.value for s in TOMBSTONES]),
            epochs_table.c.updated_at < now - tombstone_ttl,
        )

        def op(conn: Connection) -> SweepResult:
            pick = sa.select(epochs_table.c.generation)
            has_stale = (conn.execute(pick.where(stale).limit(1))).first()
            has_expired = (conn.execute(pick.where(expired).limit(1))).first()
            if has_stale is None and has_expired is None:
                raise NoChange(SweepResult(0, 0))
            revision, _ = queries.bump(conn)
            abandoned = (
                conn.execute(
                    epochs_table.update()
                    .where(stale)
                    .values(state=State.ABANDONED.value, revision=revision, updated_at=now)
                )
            ).rowcount
            compacted = (conn.execute(epochs_table.delete().where(expired))).rowcount
            if compacted:
                rings.forget_gone(conn)
            if self.dialect == "postgresql":
                notify_reload(conn)
            return SweepResult(abandoned=abandoned, compacted=compacted)

        result = await self._write(op)
        if result.abandoned or result.compacted:
            await self._reload_mirror()
        return result

    # --- reads: from the copy while it is whole and current, else from the database ------

    async def _copy_answers(self) -> bool:
        """May the copy answer a read now? It must be whole and, on PostgreSQL (where other
        processes commit too), hold every commit made before this read began (see
        :mod:`.barrier`). SQLite has one writer, this process, so its copy is current."""
        if not self._mirror.synced:
            return False
        if self.dialect == "sqlite":
            return True
        return self._mirror.revision >= await self._barrier.revision()

    async def _database_revision(self) -> int:
        engine = self._revision_reader
        if engine is None:
            return await self._read_db(queries.revision)

        def read() -> int:
            with database_errors():
                return read_once_more(engine, queries.revision)

        return await self._call(read)

    async def get(self, generation: int) -> EpochRecord:
        record = self._mirror.records.get(generation) if await self._copy_answers() else None
        if record is not None:
            return record
        if self.dialect == "sqlite":
            raise UnknownEpoch(f"{self.ledger8}-{generation}")
        # Not in the copy: perhaps issued by another process a moment ago.
        return await self._read_db(lambda conn: queries.fetch(conn, generation, self.ledger8))

    async def bound_to(self, pod_uid: str) -> EpochRecord | None:
        if await self._copy_answers():
            return self._mirror.bound_to(pod_uid)
        return await self._read_db(lambda conn: queries.bound_to(conn, pod_uid, self.ledger8))

    async def list_server(
        self, namespace: str, server: str, states: Iterable[State] = ()
    ) -> ServerSnapshot:
        wanted = {State(s) for s in states}
        if await self._copy_answers():
            records = self._mirror.list(namespace, server, wanted)
            return ServerSnapshot(self._mirror.revision, records)
        return await self._read_db(
            lambda conn: queries.list_server(conn, namespace, server, wanted, self.ledger8)
        )

    async def server_revision(self, namespace: str, server: str) -> tuple[int, int]:
        if await self._copy_answers():
            return self._mirror.server_revision(namespace, server), self._mirror.revision
        return await self._read_db(lambda conn: queries.server_revision(conn, namespace, server))

    def commit_stats(self) -> CommitStats:
        return self._committer.stats

    async def state_counts(self) -> list[tuple[str, str, str, int]]:
        return await self._read_db(queries.state_counts)

    async def ping(self) -> None:
        await self._read_db(lambda conn: conn.execute(sa.select(ledger_table.c.revision)))


async def open_store(url: str) -> SqlEpochStore:
    return await SqlEpochStore.open(url)


__all__ = ["SqlEpochStore", "describe_url", "open_store"]
