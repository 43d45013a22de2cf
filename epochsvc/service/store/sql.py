"""The ledger on SQL: SQLite (embedded default) and PostgreSQL through SQLAlchemy 2 Core.

Both backends run the same statements. Every write transaction starts by bumping the single
``ledger`` row's revision: that row lock (PostgreSQL) or the database write lock taken by
``BEGIN IMMEDIATE`` (SQLite) serialises writers, so the generation counter and the revision
never race, also between several service processes sharing one PostgreSQL. A write that turns
out to be a no-op rolls back, leaving the revision untouched. The generation counter lives in
the ``ledger`` row, apart from the epochs, so compacting tombstones can never lower it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from epochsvc.service.lifecycle import (
    TOMBSTONES,
    Action,
    LifecycleError,
    State,
    check_incarnation,
    plan,
)
from epochsvc.service.store.base import (
    EpochRecord,
    EpochStore,
    RequestConflict,
    ServerSnapshot,
    StoreUnavailable,
    SweepResult,
    UnknownEpoch,
)
from epochsvc.tokens import FALLBACK_INCARNATION_MIN

log = logging.getLogger("epochsvc.store")

metadata = sa.MetaData()

ledger_table = sa.Table(
    "ledger",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("ledger_id", sa.String(32), nullable=False),
    # The last generation issued; only ever incremented.
    sa.Column("generation", sa.BigInteger, nullable=False),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

epochs_table = sa.Table(
    "epochs",
    metadata,
    sa.Column("generation", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("server", sa.String(63), nullable=False),
    sa.Column("request_uid", sa.String(128), nullable=False, unique=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("pod_name", sa.String(253)),
    sa.Column("pod_uid", sa.String(128), unique=True),
    sa.Column("incarnation", sa.BigInteger),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Index("ix_epochs_server", "namespace", "server", "revision"),
    sa.Index("ix_epochs_state_updated", "state", "updated_at"),
)

_LEDGER_ROW = 1
_PG_INIT_LOCK = 0x6D6370  # advisory lock key: serialises schema creation across processes


def _async_url(url: str) -> sa.URL:
    """Map the user-facing URL to the async driver (sqlite→aiosqlite, postgresql→asyncpg)."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        if not u.database or u.database == ":memory:":
            raise ValueError("the SQLite ledger must be a file (sqlite:///path/to/ledger.db)")
        return u.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres"):
        return u.set(drivername="postgresql+asyncpg")
    raise ValueError(f"unsupported database URL scheme {u.drivername!r}: use sqlite or postgresql")


class SqlEpochStore(EpochStore):
    def __init__(self, writer: AsyncEngine, reader: AsyncEngine, *, dialect: str) -> None:
        self._writer = writer
        self._reader = reader
        self.dialect = dialect
        self.ledger_id = ""

    # --- set-up -------------------------------------------------------------------------

    @classmethod
    async def open(cls, url: str) -> SqlEpochStore:
        aurl = _async_url(url)
        if aurl.get_backend_name() == "sqlite":
            store = cls(*_sqlite_engines(aurl), dialect="sqlite")
        else:
            engine = create_async_engine(aurl, pool_size=10, max_overflow=10, pool_pre_ping=True)
            store = cls(engine, engine, dialect="postgresql")
        try:
            await store._initialise()
        except BaseException:
            await store.close()
            raise
        return store

    async def _initialise(self) -> None:
        async with self._tx() as conn:
            if self.dialect == "postgresql":
                await conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_INIT_LOCK)))
            await conn.run_sync(metadata.create_all)
            row = (await conn.execute(sa.select(ledger_table.c.ledger_id))).first()
            if row is None:
                self.ledger_id = uuid.uuid4().hex
                await conn.execute(
                    ledger_table.insert().values(
                        id=_LEDGER_ROW,
                        ledger_id=self.ledger_id,
                        generation=0,
                        revision=0,
                        created_at=time.time(),
                    )
                )
                log.info("created ledger", extra={"ledger_id": self.ledger_id})
            else:
                self.ledger_id = row.ledger_id

    async def close(self) -> None:
        await self._writer.dispose()
        if self._reader is not self._writer:
            await self._reader.dispose()

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[AsyncConnection]:
        try:
            async with self._writer.begin() as conn:
                yield conn
        except (OperationalError, OSError) as exc:
            raise StoreUnavailable(f"the ledger database is unavailable: {exc}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise StoreUnavailable(f"lost the ledger database connection: {exc}") from exc
            raise

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        try:
            async with self._reader.connect() as conn:
                yield conn
        except (OperationalError, OSError) as exc:
            raise StoreUnavailable(f"the ledger database is unavailable: {exc}") from exc

    # --- helpers ------------------------------------------------------------------------

    async def _bump(self, conn: AsyncConnection, *, generation: bool = False) -> tuple[int, int]:
        """Take the writer lock and return the new (revision, generation)."""
        values: dict[str, Any] = {"revision": ledger_table.c.revision + 1}
        if generation:
            values["generation"] = ledger_table.c.generation + 1
        row = (
            await conn.execute(
                ledger_table.update()
                .where(ledger_table.c.id == _LEDGER_ROW)
                .values(**values)
                .returning(ledger_table.c.revision, ledger_table.c.generation)
            )
        ).one()
        return int(row.revision), int(row.generation)

    def _record(self, row: Any) -> EpochRecord:
        return EpochRecord(
            ledger8=self.ledger8,
            generation=int(row.generation),
            namespace=row.namespace,
            server=row.server,
            request_uid=row.request_uid,
            state=State(row.state),
            pod_name=row.pod_name,
            pod_uid=row.pod_uid,
            incarnation=None if row.incarnation is None else int(row.incarnation),
            revision=int(row.revision),
            created_at=float(row.created_at),
            updated_at=float(row.updated_at),
        )

    async def _fetch(self, conn: AsyncConnection, generation: int) -> EpochRecord:
        row = (
            await conn.execute(
                sa.select(epochs_table).where(epochs_table.c.generation == generation)
            )
        ).first()
        if row is None:
            raise UnknownEpoch(f"{self.ledger8}-{generation}")
        return self._record(row)

    async def _update(
        self, conn: AsyncConnection, generation: int, revision: int, **values: Any
    ) -> EpochRecord:
        values.update(revision=revision, updated_at=time.time())
        await conn.execute(
            epochs_table.update().where(epochs_table.c.generation == generation).values(**values)
        )
        return await self._fetch(conn, generation)

    # --- writes -------------------------------------------------------------------------

    async def issue(
        self, namespace: str, server: str, request_uid: str
    ) -> tuple[EpochRecord, bool]:
        by_uid = sa.select(epochs_table).where(epochs_table.c.request_uid == request_uid)
        async with self._read() as conn:
            row = (await conn.execute(by_uid)).first()
        if row is None:
            try:
                async with self._tx() as conn:
                    revision, generation = await self._bump(conn, generation=True)
                    # Re-check under the writer lock: a concurrent retry may have won.
                    row = (await conn.execute(by_uid)).first()
                    if row is None:
                        now = time.time()
                        await conn.execute(
                            epochs_table.insert().values(
                                generation=generation,
                                namespace=namespace,
                                server=server,
                                request_uid=request_uid,
                                state=State.PENDING.value,
                                revision=revision,
                                created_at=now,
                                updated_at=now,
                            )
                        )
                        return await self._fetch(conn, generation), True
                    await conn.rollback()
            except IntegrityError:
                async with self._read() as conn:
                    row = (await conn.execute(by_uid)).first()
                if row is None:
                    raise
        record = self._record(row)
        if (record.namespace, record.server) != (namespace, server):
            raise RequestConflict(
                f"request UID {request_uid} already issued epoch {record.epoch} for "
                f"{record.namespace}/{record.server}, not {namespace}/{server}"
            )
        return record, False

    async def transition(
        self,
        generation: int,
        action: Action,
        *,
        pod_name: str | None = None,
        pod_uid: str | None = None,
    ) -> EpochRecord:
        async with self._tx() as conn:
            revision, _ = await self._bump(conn)
            current = await self._fetch(conn, generation)
            step = plan(
                current.epoch, current.state, action, bound_uid=current.pod_uid, pod_uid=pod_uid
            )
            if step.target is None:
                await conn.rollback()
                return current
            values: dict[str, Any] = {"state": step.target.value}
            if action is Action.BIND:
                await self._check_pod_free(conn, generation, pod_uid)
                values.update(pod_name=pod_name, pod_uid=pod_uid)
            return await self._update(conn, generation, revision, **values)

    async def _check_pod_free(
        self, conn: AsyncConnection, generation: int, pod_uid: str | None
    ) -> None:
        other = (
            await conn.execute(
                sa.select(epochs_table.c.generation).where(
                    epochs_table.c.pod_uid == pod_uid, epochs_table.c.generation != generation
                )
            )
        ).first()
        if other is not None:
            raise LifecycleError(
                "pod-already-bound",
                f"pod UID {pod_uid} is already bound to epoch {self.ledger8}-{other.generation}",
            )

    async def register_incarnation(
        self, generation: int, *, pod_uid: str | None = None
    ) -> EpochRecord:
        async with self._tx() as conn:
            revision, _ = await self._bump(conn)
            current = await self._fetch(conn, generation)
            check_incarnation(current.epoch, current.state)
            if pod_uid is not None and current.pod_uid not in (None, pod_uid):
                raise LifecycleError(
                    "pod-mismatch",
                    f"epoch {current.epoch} belongs to pod UID {current.pod_uid}, not {pod_uid}",
                )
            nxt = 0 if current.incarnation is None else current.incarnation + 1
            if nxt >= FALLBACK_INCARNATION_MIN:
                raise LifecycleError(
                    "incarnations-exhausted", f"epoch {current.epoch} has no incarnations left"
                )
            return await self._update(conn, generation, revision, incarnation=nxt)

    async def sweep(self, now: float, pending_timeout: float, tombstone_ttl: float) -> SweepResult:
        stale = sa.and_(
            epochs_table.c.state == State.PENDING.value,
            epochs_table.c.created_at < now - pending_timeout,
        )
        expired = sa.and_(
            epochs_table.c.state.in_([s.value for s in TOMBSTONES]),
            epochs_table.c.updated_at < now - tombstone_ttl,
        )
        async with self._read() as conn:
            has_stale = (
                await conn.execute(sa.select(epochs_table.c.generation).where(stale).limit(1))
            ).first()
            has_expired = (
                await conn.execute(sa.select(epochs_table.c.generation).where(expired).limit(1))
            ).first()
        abandoned = compacted = 0
        if has_stale is not None:
            async with self._tx() as conn:
                revision, _ = await self._bump(conn)
                result = await conn.execute(
                    epochs_table.update()
                    .where(stale)
                    .values(state=State.ABANDONED.value, revision=revision, updated_at=now)
                )
                abandoned = result.rowcount
        if has_expired is not None:
            async with self._tx() as conn:
                await self._bump(conn)
                compacted = (await conn.execute(epochs_table.delete().where(expired))).rowcount
        return SweepResult(abandoned=abandoned, compacted=compacted)

    # --- reads --------------------------------------------------------------------------

    async def get(self, generation: int) -> EpochRecord:
        async with self._read() as conn:
            return await self._fetch(conn, generation)

    async def list_server(
        self, namespace: str, server: str, states: Iterable[State] = ()
    ) -> ServerSnapshot:
        query = (
            sa.select(epochs_table)
            .where(epochs_table.c.namespace == namespace, epochs_table.c.server == server)
            .order_by(epochs_table.c.generation)
        )
        wanted = [s.value for s in states]
        if wanted:
            query = query.where(epochs_table.c.state.in_(wanted))
        async with self._read() as conn, conn.begin():
            # One read transaction: the revision and the rows are one consistent snapshot.
            revision = (await conn.execute(sa.select(ledger_table.c.revision))).scalar_one()
            rows = (await conn.execute(query)).all()
        return ServerSnapshot(int(revision), [self._record(r) for r in rows])

    async def server_revision(self, namespace: str, server: str) -> tuple[int, int]:
        async with self._read() as conn:
            newest = (
                await conn.execute(
                    sa.select(sa.func.max(epochs_table.c.revision)).where(
                        epochs_table.c.namespace == namespace, epochs_table.c.server == server
                    )
                )
            ).scalar()
            ledger = (await conn.execute(sa.select(ledger_table.c.revision))).scalar_one()
        return int(newest or 0), int(ledger)

    async def state_counts(self) -> list[tuple[str, str, str, int]]:
        query = sa.select(
            epochs_table.c.namespace,
            epochs_table.c.server,
            epochs_table.c.state,
            sa.func.count(),
        ).group_by(epochs_table.c.namespace, epochs_table.c.server, epochs_table.c.state)
        async with self._read() as conn:
            return [(r[0], r[1], r[2], int(r[3])) for r in (await conn.execute(query)).all()]

    async def ping(self) -> None:
        async with self._read() as conn:
            await conn.execute(sa.select(ledger_table.c.revision))


def _sqlite_engines(url: sa.URL) -> tuple[AsyncEngine, AsyncEngine]:
    """One writer connection (writes queue in-process, never on SQLite's busy lock) and a
    small pool of readers, which WAL lets run beside the writer."""
    path = Path(url.database or "")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = create_async_engine(url, pool_size=1, max_overflow=0, pool_timeout=30)
    reader = create_async_engine(url, pool_size=4, max_overflow=4)
    for engine, immediate in ((writer, True), (reader, False)):
        _configure_sqlite(engine, immediate=immediate)
    return writer, reader


def _configure_sqlite(engine: AsyncEngine, *, immediate: bool) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk (WAL fsynced) before the caller hears about it.
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA busy_timeout=10000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        # IMMEDIATE takes the write lock up front, so a read-then-write never deadlocks.
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


async def open_store(url: str) -> SqlEpochStore:
    return await SqlEpochStore.open(url)


def describe_url(url: str) -> str:
    """The URL without its password, for logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


__all__ = ["SqlEpochStore", "describe_url", "open_store"]
