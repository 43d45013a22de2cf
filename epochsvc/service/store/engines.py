"""Connections to the ledger database: URLs, engines and SQLite's pragmas."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

T = TypeVar("T")

#: Threads (and pooled connections) for blocking reads.
READ_THREADS = 4


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


def postgres_engine(url: sa.URL) -> Engine:
    """One pool shared by the writer, the readers and the follower."""
    return create_engine(url, pool_size=READ_THREADS + 1, max_overflow=4, pool_pre_ping=True)


def postgres_revision_engine(url: sa.URL) -> Engine:
    """Connections for the read barrier's ``SELECT revision``: one statement, so autocommit
    (no BEGIN, no ROLLBACK) and no liveness ping at check-out, one round trip in all where
    the shared pool's took four. A connection the database dropped fails its statement, and
    the read is sent again on a fresh one (:func:`read_once_more`)."""
    return create_engine(url, pool_size=2, max_overflow=READ_THREADS, isolation_level="AUTOCOMMIT")


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
