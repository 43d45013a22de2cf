"""PostgreSQL: several service processes share the ledger, so each follows the others' writes.

Every commit sends a ``NOTIFY`` on :data:`CHANNEL` (:func:`change_notice`, or
:func:`notify_reload` after deletions). :class:`Follower` runs in a thread of its own: it
``LISTEN``\\ s, reads what changed since the revision it last saw (also every
:data:`CATCH_UP_SECONDS`, should a notification be lost), and hands each batch to
``deliver``; when the database is lost it calls ``lost`` and tries again every
:data:`RECONNECT_SECONDS`, so the store's readers fall back to the database until the copy is
whole again. It says so once when it loses the database and once when it is back, and a
connection the database dropped is discarded, never reset (a reset of a dead connection is
what made the pool log a traceback at every PostgreSQL crash).

Stopping does not wait out the catch-up: the follower waits on its connection's socket and on
a pipe of its own, and :meth:`Follower.stop` writes to the pipe (psycopg's ``notifies()`` wait
cannot be interrupted, so a service on PostgreSQL took up to a second longer to shut down).

A change notification names the process that committed it and the revision it committed,
and a follower reads nothing for its own process's commits: those are in its copy already
(the group committer puts them there). It only moves its mark past them. That is sound
because notifications arrive in commit order, which is revision order (the writer lock is
held from the bump to the commit): every other process's commit below that revision was
announced, and read, before it. Without this, every commit on a busy service cost one more
read of the ledger on the follower's thread, competing with the writer for the interpreter.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa
from psycopg import Connection as PgConnection
from psycopg import Notify
from sqlalchemy import Connection, Engine

from epochsvc.service.store import queries
from epochsvc.service.store.base import EpochRecord
from epochsvc.service.store.errors import store_error
from epochsvc.service.store.schema import LEDGER_ROW, ledger_table

log = logging.getLogger("epochsvc.store")

CHANNEL = "epochsvc_ledger"
#: How long a follower waits for a notification before it reads anyway.
CATCH_UP_SECONDS = 1.0
#: How soon a follower that lost the database tries again: a failed attempt costs one refused
#: connection, and the copy must be whole within a second of the database's return.
RECONNECT_SECONDS = 0.25

#: (records, revision, full): ``full`` replaces the copy, otherwise the records update it.
Deliver = Callable[[list[EpochRecord], int, bool], None]


def change_notice(sender: str) -> sa.Select[tuple[object]]:
    """The statement announcing a commit of ``sender``'s, delivered by PostgreSQL at commit
    to every service process's follower: ``change <sender> <revision>``."""
    payload = sa.literal(f"change {sender} ") + sa.cast(ledger_table.c.revision, sa.Text)
    return sa.select(sa.func.pg_notify(CHANNEL, payload)).where(ledger_table.c.id == LEDGER_ROW)


def own_revision(payload: str, sender: str) -> int | None:
    """The revision of a change notification ``sender`` sent itself (None: another's)."""
    kind, _, rest = payload.partition(" ")
    who, _, revision = rest.partition(" ")
    if kind != "change" or who != sender or not revision.isdigit():
        return None
    return int(revision)


def notify_reload(conn: Connection) -> None:
    """Rows were deleted: followers re-read their whole copy."""
    conn.execute(sa.select(sa.func.pg_notify(CHANNEL, "reload")))


class Follower:
    def __init__(
        self,
        engine: Engine,
        ledger8: str,
        deliver: Deliver,
        lost: Callable[[], None],
        sender: str,
    ) -> None:
        self._sender = sender
        self._engine = engine
        self._ledger8 = ledger8
        self._deliver = deliver
        self._lost = lost
        self._stop = threading.Event()
        self._down_since: float | None = None  # when it lost the database, while it has
        self._thread = threading.Thread(target=self._run, name="epochsvc-follower", daemon=True)
        #: Written once by :meth:`stop`: ends the follower's wait for a notification at once.
        self._wake_read, self._wake_write = os.pipe()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._wake_write < 0:
            return  # stopped already
        os.write(self._wake_write, b"!")
        if self._thread.is_alive():
            self._thread.join(timeout=CATCH_UP_SECONDS + 5)
        if not self._thread.is_alive():  # else it may still be waiting on the pipe
            os.close(self._wake_read)
            os.close(self._wake_write)
            self._wake_read = self._wake_write = -1

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self._engine.connect() as conn:
                    try:
                        self._follow(conn)
                    except Exception:
                        conn.invalidate()  # dead: drop it rather than reset it into the pool
                        raise
            except Exception as exc:
                self._lost()
                if self._down_since is None:
                    self._down_since = time.monotonic()
                    log.warning(
                        "ledger follower lost the database (%s); reading from it directly "
                        "until it is back",
                        store_error(exc),
                    )
                self._stop.wait(RECONNECT_SECONDS)

    def _follow(self, conn: Connection) -> None:
        """Listen, read the whole ledger, then each change, until stopped or the database
        fails (which raises)."""
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        raw = conn.connection.driver_connection
        assert raw is not None
        raw.execute(f"LISTEN {CHANNEL}")
        records, since = queries.changes(conn, None, self._ledger8)
        self._deliver(records, since, True)
        if self._down_since is not None:
            log.warning(
                "ledger follower is back on the database after %.1f s (revision %d)",
                time.monotonic() - self._down_since,
                since,
            )
            self._down_since = None
        while not self._stop.is_set():
            notes = self._next_notes(raw)
            if self._stop.is_set():
                return
            owns = [own_revision(n.payload, self._sender) for n in notes]
            if owns and None not in owns:  # only this process's commits
                since = max(since, *(r for r in owns if r is not None))
                continue
            full = any(n.payload == "reload" for n in notes)
            records, since = queries.changes(conn, None if full else since, self._ledger8)
            self._deliver(records, since, full)

    def _next_notes(self, raw: PgConnection[object]) -> list[Notify]:
        """The notifications that have arrived, waiting up to :data:`CATCH_UP_SECONDS` for
        one (none: time to read anyway), or until :meth:`stop`."""
        # First those psycopg took in during the last read on this connection: they are no
        # longer on the socket, so waiting on it would leave them there until the catch-up.
        notes = list(raw.notifies(timeout=0))
        if notes:
            return notes
        ready, _, _ = select.select([raw.fileno(), self._wake_read], [], [], CATCH_UP_SECONDS)
        return list(raw.notifies(timeout=0)) if raw.fileno() in ready else []
