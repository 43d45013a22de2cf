"""The ledger on SQL: SQLite (embedded default) and PostgreSQL through SQLAlchemy 2 Core.

Both backends run the same statements. Every write transaction starts by bumping the single
``ledger`` row's revision: that row lock (PostgreSQL) or the database write lock taken by
``BEGIN IMMEDIATE`` (SQLite) serialises writers, so the generation counter and the revision
never race, also between several service processes sharing one PostgreSQL. A write that turns
out to be a no-op rolls back, leaving the revision untouched. The generation counter lives in
the ``ledger`` row, apart from the epochs, so compacting tombstones can never lower it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError, PendingRollbackError

from epochsvc.service.lifecycle import (
    TOMBSTONES,
    Action,
    LifecycleError,
    State,
    check_incarnation,
    check_owner,
    plan,
)
from epochsvc.service.store import migrate
from epochsvc.service.store.base import (
    EpochRecord,
    EpochStore,
    RequestConflict,
    ServerSnapshot,
    StoreUnavailable,
    SweepResult,
    UnknownEpoch,
)
from epochsvc.service.store.groupcommit import GroupCommitter, NoChange
from epochsvc.service.store.mirror import LedgerMirror
from epochsvc.service.store.schema import LEDGER_ROW, epochs_table, ledger_table
from mcp_epoch.contract import FALLBACK_INCARNATION_MIN

log = logging.getLogger("epochsvc.store")

T = TypeVar("T")
# PostgreSQL channel on which every commit announces itself to the other service processes.
_CHANNEL = "epochsvc_ledger"
# A follower also catches up this often without a notification (one could be lost).
_CATCH_UP_SECONDS = 1.0
# Threads for blocking reads (PostgreSQL; SQLite answers reads from memory).
READ_THREADS = 4

# Statements of the hot paths, built once: building an expression per call costs more than
# SQLite takes to run it.
_BUMP = (
    ledger_table.update()
    .where(ledger_table.c.id == LEDGER_ROW)
    .values(revision=ledger_table.c.revision + 1)
    .returning(ledger_table.c.revision, ledger_table.c.generation)
)
_BUMP_GENERATION = (
    ledger_table.update()
    .where(ledger_table.c.id == LEDGER_ROW)
    .values(revision=ledger_table.c.revision + 1, generation=ledger_table.c.generation + 1)
    .returning(ledger_table.c.revision, ledger_table.c.generation)
)
_BY_GENERATION = sa.select(epochs_table).where(
    epochs_table.c.generation == sa.bindparam("b_generation")
)
_BY_REQUEST = sa.select(epochs_table).where(
    epochs_table.c.request_uid == sa.bindparam("b_request_uid")
)
_INSERT = epochs_table.insert()
_UPDATE = (
    epochs_table.update()
    .where(epochs_table.c.generation == sa.bindparam("b_generation"))
    .returning(*epochs_table.c)
)
_PG_INIT_LOCK = 0x6D6370  # advisory lock key: serialises schema creation across processes


def _driver_url(url: str) -> sa.URL:
    """Map the user-facing URL to its driver (sqlite→pysqlite, postgresql→psycopg 3)."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        if not u.database or u.database == ":memory:":
            raise ValueError("the SQLite ledger must be a file (sqlite:///path/to/ledger.db)")
        return u.set(drivername="sqlite+pysqlite")
    if backend in ("postgresql", "postgres"):
        return u.set(drivername="postgresql+psycopg")
    raise ValueError(f"unsupported database URL scheme {u.drivername!r}: use sqlite or postgresql")


class SqlEpochStore(EpochStore):
    """The ledger on one SQL database.

    With SQLite the process holds an exclusive lock on the ledger file (two writers on one
    file must never happen) and, being the only writer, keeps a write-through mirror of the
    epochs in memory, so lookups and lists never touch the disk. PostgreSQL is shared by
    several service processes, so its reads always go to the database.
    """

    def __init__(
        self,
        writer: Engine,
        reader: Engine,
        *,
        dialect: str,
        file_lock: _FileLock | None = None,
    ) -> None:
        self._writer = writer
        self._reader = reader
        self._lock = file_lock
        self.dialect = dialect
        self.ledger_id = ""
        self._committer = GroupCommitter(
            writer,
            _store_error,
            self._remember,
            before_commit=_notify_followers if dialect == "postgresql" else None,
        )
        self._readers = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="epochsvc-reader")
        self._mirror = LedgerMirror()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_following = threading.Event()
        self._follower: threading.Thread | None = None

    # --- set-up -------------------------------------------------------------------------

    @classmethod
    async def open(cls, url: str) -> SqlEpochStore:
        durl = _driver_url(url)
        if durl.get_backend_name() == "sqlite":
            lock = _FileLock.take(Path(durl.database or ""))
            store = cls(*_sqlite_engines(durl), dialect="sqlite", file_lock=lock)
        else:
            engine = create_engine(
                durl, pool_size=READ_THREADS + 1, max_overflow=4, pool_pre_ping=True
            )
            store = cls(engine, engine, dialect="postgresql")
        try:
            await store._call(store._initialise)
            await store._reload_mirror()
        except BaseException:
            await store.close()
            raise
        return store

    def _initialise(self) -> None:
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
        """Start following other processes' writes, delivering them to the running loop.

        SQLite: this process is the only writer, so its copy is complete by construction.
        PostgreSQL: other service processes write too; a follower thread keeps the copy
        current from their NOTIFYs (and a periodic catch-up), and readers use the database
        whenever the copy may be behind.
        """
        if self.dialect != "postgresql" or self._follower is not None:
            return
        self._loop = asyncio.get_running_loop()
        await self._reload_mirror()  # anything written since open()
        self._follower = threading.Thread(
            target=self._follow, name="epochsvc-follower", daemon=True
        )
        self._follower.start()

    def _changes(self, conn: Connection, since: int | None) -> tuple[list[EpochRecord], int]:
        """Every epoch (``since`` None) or those changed after ``since``, and the revision."""
        with conn.begin():
            revision = int(conn.execute(sa.select(ledger_table.c.revision)).scalar_one())
            query = sa.select(epochs_table)
            if since is not None:
                query = query.where(epochs_table.c.revision > since)
            rows = conn.execute(query).all()
        return [self._record(r) for r in rows], revision

    async def _reload_mirror(self) -> None:
        def read() -> tuple[list[EpochRecord], int]:
            with self._read() as conn:
                return self._changes(conn, None)

        records, revision = await self._call(read)
        self._mirror.replace(records, revision)

    def _remember(self, values: list[Any]) -> None:
        """After each group commit: this process's own writes are in its copy at once."""
        records = [v[0] if isinstance(v, tuple) else v for v in values]
        fresh = [r for r in records if isinstance(r, EpochRecord)]
        self._mirror.apply(fresh, max((r.revision for r in fresh), default=0))

    def _follow(self) -> None:
        """PostgreSQL: LISTEN for other processes' commits and pull what changed."""
        backoff = 0.5
        while not self._stop_following.is_set():
            try:
                with self._reader.connect() as conn:
                    conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                    raw = conn.connection.driver_connection
                    assert raw is not None
                    raw.execute(f"LISTEN {_CHANNEL}")
                    records, since = self._changes(conn, None)
                    self._hand_over(records, since, full=True)
                    backoff = 0.5
                    while not self._stop_following.is_set():
                        notes = list(raw.notifies(timeout=_CATCH_UP_SECONDS, stop_after=1))
                        full = any(n.payload == "reload" for n in notes)
                        records, since = self._changes(conn, None if full else since)
                        self._hand_over(records, since, full=full)
            except Exception as exc:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._mark_unsynced)
                log.warning("ledger follower lost the database: %s", _store_error(exc))
                self._stop_following.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _hand_over(self, records: list[EpochRecord], revision: int, *, full: bool) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._apply_followed, records, revision, full)

    def _apply_followed(self, records: list[EpochRecord], revision: int, full: bool) -> None:
        mirror = self._mirror
        changed = mirror.replace(records, revision) if full else mirror.apply(records, revision)
        if changed and self.on_change is not None:
            self.on_change()

    def _mark_unsynced(self) -> None:
        self._mirror.synced = False

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._close)

    def _close(self) -> None:
        self._stop_following.set()
        if self._follower is not None:
            self._follower.join(timeout=_CATCH_UP_SECONDS + 5)
        self._committer.close()
        self._readers.shutdown(wait=True)
        self._writer.dispose()
        if self._reader is not self._writer:
            self._reader.dispose()
        if self._lock is not None:
            self._lock.release()

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with _database_errors(), self._writer.begin() as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with _database_errors(), self._reader.connect() as conn:
            yield conn

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run blocking database work off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._readers, fn)

    async def _write(self, op: Callable[[Connection], T]) -> T:
        with _database_errors():
            return await self._committer.submit(op)

    # --- helpers ------------------------------------------------------------------------

    def _bump(self, conn: Connection, *, generation: bool = False) -> tuple[int, int]:
        """Take the writer lock and return the new (revision, generation)."""
        row = conn.execute(_BUMP_GENERATION if generation else _BUMP).one()
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
            address=row.address,
        )

    def _fetch(self, conn: Connection, generation: int) -> EpochRecord:
        row = conn.execute(_BY_GENERATION, {"b_generation": generation}).first()
        if row is None:
            raise UnknownEpoch(f"{self.ledger8}-{generation}")
        return self._record(row)

    def _update(
        self, conn: Connection, generation: int, revision: int, **values: Any
    ) -> EpochRecord:
        values.update(revision=revision, updated_at=time.time())
        row = conn.execute(_UPDATE, {"b_generation": generation, **values}).one()
        return self._record(row)

    # --- writes -------------------------------------------------------------------------

    async def issue(
        self, namespace: str, server: str, request_uid: str
    ) -> tuple[EpochRecord, bool]:
        def op(conn: Connection) -> tuple[EpochRecord, bool]:
            # Bump first: it takes the writer lock, so the check below also sees a row that
            # another service process committed a moment ago. A retry rolls the bump back.
            revision, generation = self._bump(conn, generation=True)
            existing = conn.execute(_BY_REQUEST, {"b_request_uid": request_uid}).first()
            if existing is not None:  # a retry of an admission request: same epoch
                raise NoChange((self._record(existing), False))
            now = time.time()
            row = {
                "generation": generation,
                "namespace": namespace,
                "server": server,
                "request_uid": request_uid,
                "state": State.PENDING.value,
                "pod_name": None,
                "pod_uid": None,
                "incarnation": None,
                "address": None,
                "revision": revision,
                "created_at": now,
                "updated_at": now,
            }
            conn.execute(_INSERT, row)
            return self._record(SimpleNamespace(**row)), True

        record, created = await self._write(op)
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
            revision, _ = self._bump(conn)
            current = self._fetch(conn, generation)
            step = plan(
                current.epoch, current.state, action, bound_uid=current.pod_uid, pod_uid=pod_uid
            )
            values: dict[str, Any] = {}
            if step.target is not None:
                values["state"] = step.target.value
            if action is Action.BIND:
                if step.target is not None:
                    self._check_pod_free(conn, generation, pod_uid)
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
            return self._update(conn, generation, revision, **values)

        return await self._write(op)

    def _check_pod_free(self, conn: Connection, generation: int, pod_uid: str | None) -> None:
        other = (
            conn.execute(
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
        self, generation: int, *, pod_uid: str | None = None, owner_only: bool = False
    ) -> EpochRecord:
        def op(conn: Connection) -> EpochRecord:
            revision, _ = self._bump(conn)
            current = self._fetch(conn, generation)
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
            nxt = 0 if current.incarnation is None else current.incarnation + 1
            if nxt >= FALLBACK_INCARNATION_MIN:
                raise LifecycleError(
                    "incarnations-exhausted", f"epoch {current.epoch} has no incarnations left"
                )
            return self._update(conn, generation, revision, incarnation=nxt)

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
            revision, _ = self._bump(conn)
            abandoned = (
                conn.execute(
                    epochs_table.update()
                    .where(stale)
                    .values(state=State.ABANDONED.value, revision=revision, updated_at=now)
                )
            ).rowcount
            compacted = (conn.execute(epochs_table.delete().where(expired))).rowcount
            if self.dialect == "postgresql":  # deletions: followers reload their whole copy
                conn.execute(sa.select(sa.func.pg_notify(_CHANNEL, "reload")))
            return SweepResult(abandoned=abandoned, compacted=compacted)

        result = await self._write(op)
        if result.abandoned or result.compacted:
            await self._reload_mirror()
        return result

    # --- reads --------------------------------------------------------------------------

    async def get(self, generation: int) -> EpochRecord:
        record = self._mirror.records.get(generation) if self._mirror.synced else None
        if record is not None:
            return record
        if self.dialect == "sqlite":
            raise UnknownEpoch(f"{self.ledger8}-{generation}")
        # Not in the copy: perhaps issued by another process a moment ago.

        def read() -> EpochRecord:
            with self._read() as conn:
                return self._fetch(conn, generation)

        return await self._call(read)

    async def bound_to(self, pod_uid: str) -> EpochRecord | None:
        if self._mirror.synced:
            return self._mirror.bound_to(pod_uid)
        query = sa.select(epochs_table).where(epochs_table.c.pod_uid == pod_uid).limit(1)

        def read() -> EpochRecord | None:
            with self._read() as conn:
                row = conn.execute(query).first()
            return None if row is None else self._record(row)

        return await self._call(read)

    async def list_server(
        self, namespace: str, server: str, states: Iterable[State] = ()
    ) -> ServerSnapshot:
        wanted = {State(s) for s in states}
        if self._mirror.synced:
            records = self._mirror.list(namespace, server, wanted)
            return ServerSnapshot(self._mirror.revision, records)
        query = (
            sa.select(epochs_table)
            .where(epochs_table.c.namespace == namespace, epochs_table.c.server == server)
            .order_by(epochs_table.c.generation)
        )
        if wanted:
            query = query.where(epochs_table.c.state.in_([s.value for s in wanted]))

        def read() -> ServerSnapshot:
            with self._read() as conn, conn.begin():
                # One read transaction: the revision and the rows are one consistent snapshot.
                revision = conn.execute(sa.select(ledger_table.c.revision)).scalar_one()
                rows = conn.execute(query).all()
            return ServerSnapshot(int(revision), [self._record(r) for r in rows])

        return await self._call(read)

    async def server_revision(self, namespace: str, server: str) -> tuple[int, int]:
        if self._mirror.synced:
            return self._mirror.server_revision(namespace, server), self._mirror.revision

        def read() -> tuple[int, int]:
            with self._read() as conn:
                newest = conn.execute(
                    sa.select(sa.func.max(epochs_table.c.revision)).where(
                        epochs_table.c.namespace == namespace, epochs_table.c.server == server
                    )
                ).scalar()
                ledger = conn.execute(sa.select(ledger_table.c.revision)).scalar_one()
            return int(newest or 0), int(ledger)

        return await self._call(read)

    async def state_counts(self) -> list[tuple[str, str, str, int]]:
        query = sa.select(
            epochs_table.c.namespace,
            epochs_table.c.server,
            epochs_table.c.state,
            sa.func.count(),
        ).group_by(epochs_table.c.namespace, epochs_table.c.server, epochs_table.c.state)

        def read() -> list[tuple[str, str, str, int]]:
            with self._read() as conn:
                return [(r[0], r[1], r[2], int(r[3])) for r in conn.execute(query).all()]

        return await self._call(read)

    async def ping(self) -> None:
        def read() -> None:
            with self._read() as conn:
                conn.execute(sa.select(ledger_table.c.revision))

        await self._call(read)


def _notify_followers(conn: Connection) -> None:
    """Delivered by PostgreSQL at commit, to every other service process's follower."""
    conn.execute(sa.select(sa.func.pg_notify(_CHANNEL, "change")))


@contextmanager
def _database_errors() -> Iterator[None]:
    """Lost-database errors leave as StoreUnavailable; every other error passes unchanged."""
    try:
        yield
    except Exception as exc:
        mapped = _store_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc


def _store_error(exc: BaseException) -> BaseException:
    """Connection-level failures become StoreUnavailable (503); anything else is a bug.

    ``PendingRollbackError`` is one of them: when the database dies inside a group commit,
    a statement after the failed one (the ``pg_notify``) finds the transaction invalid.
    """
    if isinstance(exc, OperationalError | PendingRollbackError | OSError | ConnectionError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        cause = getattr(exc, "orig", None) or exc
        brief = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        return StoreUnavailable(f"the ledger database is unavailable: {brief}")
    return exc


class _FileLock:
    """An exclusive ``flock`` on ``<ledger>.lock``; the kernel drops it if the process dies."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def take(cls, db: Path) -> _FileLock:
        db.parent.mkdir(parents=True, exist_ok=True)
        path = db.with_name(db.name + ".lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(
                f"another epoch service process is using the ledger {db}: a SQLite ledger has "
                "one service process; use PostgreSQL (EPOCHSVC_DATABASE_URL=postgresql://...) "
                "to run several"
            ) from None
        return cls(fd, path)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)


def _sqlite_engines(url: sa.URL) -> tuple[Engine, Engine]:
    """One writer connection (writes queue in-process, never on SQLite's busy lock) and a
    small pool of readers, which WAL lets run beside the writer."""
    path = Path(url.database or "")
    path.parent.mkdir(parents=True, exist_ok=True)
    # Connections move between the loop's helper threads; each is used by one at a time.
    args = {"check_same_thread": False}
    writer = create_engine(url, pool_size=1, max_overflow=0, pool_timeout=30, connect_args=args)
    reader = create_engine(url, pool_size=READ_THREADS, max_overflow=0, connect_args=args)
    for engine, immediate in ((writer, True), (reader, False)):
        _configure_sqlite(engine, immediate=immediate)
    return writer, reader


def _configure_sqlite(engine: Engine, *, immediate: bool) -> None:
    @event.listens_for(engine, "connect")
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

    @event.listens_for(engine, "begin")
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
