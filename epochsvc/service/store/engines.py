"""Connections to the ledger database: URLs, engines and SQLite's pragmas."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError

from epochsvc.service.store.groupcommit import tally

T = TypeVar("T")

#: Threads (and pooled connections) for blocking reads.
READ_THREADS = 4
#: A writer connection unused for this long is pinged before its next commit.
WRITER_IDLE_PING_SECONDS = 1.0


def driver_url(url: str) -> sa.URL:
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


def describe_url(url: str) -> str:
    """The URL without its password, for logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def plan_for_parameters(engine: Engine) -> Engine:
    """Every session of ``engine`` plans each statement for its own parameters
    (``plan_cache_mode = force_custom_plan``), prepared or not.

    psycopg prepares a statement on the server once it has run five times, and PostgreSQL
    may then keep one generic plan for any parameters. Made while the ledger was small, the
    issue's generic plan read the whole epochs table twice (hash joins) on every commit ever
    after: 2.1 ms at 4,000 epochs, 8.8 ms at 19,000. Only an autoanalyze replaced it.
    Unprepared, each issue cost 2.2-2.7 ms (its text parsed each time); prepared and planned
    each time, 1.7 ms, whatever the ledger's size. A ``SET`` at connect, not a startup option,
    so that a pooler in session mode passes it."""

    @event.listens_for(engine, "connect")
    def _custom_plans(dbapi_conn: Any, _record: Any) -> None:
        autocommit = dbapi_conn.autocommit
        dbapi_conn.autocommit = True
        try:
            dbapi_conn.execute("SET plan_cache_mode = force_custom_plan")
        finally:
            dbapi_conn.autocommit = autocommit

    return engine


def postgres_engine(url: sa.URL) -> Engine:
    """One pool shared by the readers and the follower."""
    return plan_for_parameters(
        create_engine(url, pool_size=READ_THREADS + 1, max_overflow=3, pool_pre_ping=True)
    )


def postgres_writer_engine(url: sa.URL) -> Engine:
    """The group committer's one connection, without the pool's liveness ping on every
    check-out: under load that ping was one of a commit's three round trips.

    Only a connection left unused for :data:`WRITER_IDLE_PING_SECONDS` is pinged (a database
    restarted while the writer was idle is then found before a commit, not by it). A
    connection that fails during a commit is thrown away at once (:mod:`.pipeline`, or
    SQLAlchemy for its own statements), so the next commit gets a new one. What neither
    catches, a connection lost between a busy writer's commits, fails that one commit with
    503, as the database failing mid-commit always could; the ledger stays whole either way.
    """
    engine = plan_for_parameters(create_engine(url, pool_size=1, max_overflow=0, pool_timeout=30))

    @event.listens_for(engine, "checkin")
    def _note_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        # The pool retries the check-out on a new connection when this raises
        # DisconnectionError. A fresh connection has no idle time, and needs no ping.
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < WRITER_IDLE_PING_SECONDS:
            return
        tally(1)
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(str(exc)) from exc

    return engine


def postgres_revision_engine(url: sa.URL) -> Engine:
    """Connections for the read barrier's ``SELECT revision``: one statement, so autocommit
    (no BEGIN, no ROLLBACK) and no liveness ping at check-out, one round trip in all where
    the shared pool's took four. A connection the database dropped fails its statement, and
    the read is sent again on a fresh one (:func:`read_once_more`)."""
    return plan_for_parameters(
        create_engine(url, pool_size=2, max_overflow=READ_THREADS, isolation_level="AUTOCOMMIT")
    )


def read_once_more(engine: Engine, fn: Callable[[Connection], T]) -> T:
    """``fn`` on a connection of ``engine``; once more on a new one if the first turned out
    dead (SQLAlchemy then discards the pool's older connections too). Reads only: a read
    sent twice is still one read."""
    try:
        with engine.connect() as conn:
            return fn(conn)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
    with engine.connect() as conn:
        return fn(conn)


def sqlite_engines(url: sa.URL) -> tuple[Engine, Engine]:
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
