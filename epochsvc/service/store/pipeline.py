"""Statements sent to PostgreSQL together: one round trip for several (psycopg's pipeline mode).

A group commit on PostgreSQL waits on the network more than on anything else: each statement
SQLAlchemy sends is a round trip, and so are the ``BEGIN`` psycopg sends before the first and
the ``COMMIT``. In pipeline mode psycopg sends a list of statements (the ``BEGIN`` and the
``COMMIT`` included) and reads their results after one sync, so a commit whose statements do
not need each other's answers on the client costs one round trip for all of them.

The statements go through the driver's own connection, under the transaction SQLAlchemy
began, so they are part of it; SQLAlchemy's commit afterwards finds nothing left to commit.
Errors are the driver's (:func:`.errors.store_error` maps its connection failures); a
connection that failed is thrown away, so the next transaction gets a new one.

A transaction's last statements can carry its end too. The group committer offers the
statements that close a transaction (:meth:`Closing.offer`: the change notification) when one
unit of work is the whole transaction; that unit's last pipeline (``last=True``) then sends
them and the ``COMMIT`` with its own, and a commit of issues is one round trip in all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection

from epochsvc.service.store.groupcommit import tally

Statement = tuple[str, Mapping[str, Any] | None]

_CLOSING = "epochsvc.closing"  # Connection.info: the statements offered (Closing.offer)


@dataclass(frozen=True, slots=True)
class Closing:
    """The statements that end every transaction of a group committer (its
    :class:`~.groupcommit.Closer`), sent with the ``COMMIT`` in one round trip."""

    statements: Sequence[Statement]

    def offer(self, conn: Connection) -> None:
        """The transaction on ``conn`` may end with its next ``last`` pipeline, which then
        sends these statements and the ``COMMIT`` with its own (and tells :func:`.tally`)."""
        conn.info[_CLOSING] = self.statements

    def withdraw(self, conn: Connection) -> None:
        """Take the offer back: the info lasts as long as the connection, and an offer left
        there would let a later transaction's pipeline commit it halfway."""
        conn.info.pop(_CLOSING, None)

    def close(self, conn: Connection) -> None:
        """End the transaction with these statements and the ``COMMIT``."""
        run(conn, self.statements, commit=True)


def run(
    conn: Connection,
    statements: Sequence[Statement],
    *,
    commit: bool = False,
    last: bool = False,
) -> list[Any]:
    """Run ``statements`` (and the ``COMMIT`` when ``commit``) in one round trip; the rows of
    each, in order (an empty list for a statement that returns none).

    ``last``: nothing of the transaction's work follows these statements, so when the
    committer offered its closing statements (:meth:`Closing.offer`), they and the ``COMMIT``
    go in this round trip too. A caller passes it only when nothing after this call can undo
    the transaction (it raises nothing but a bug)."""
    closing: Sequence[Statement] = conn.info.pop(_CLOSING, ()) if last else ()
    commit = commit or bool(closing)
    raw = conn.connection.driver_connection
    assert raw is not None
    begins = raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
    cursors = []
    try:
        with raw.pipeline():
            for sql, params in (*statements, *closing):
                cursor = raw.cursor(row_factory=namedtuple_row)
                cursor.execute(sql, params)
                cursors.append(cursor)
            if commit:
                raw.commit()
    except psycopg.OperationalError:
        if raw.broken or raw.closed:  # lost, not refused: the next transaction gets a new one
            conn.invalidate()
        raise
    tally(len(cursors), begins=begins, commits=commit)
    return [c.fetchall() if c.description is not None else [] for c in cursors[: len(statements)]]
