"""Statements sent to PostgreSQL together: one round trip for several (psycopg's pipeline mode).

A group commit on PostgreSQL waits on the network more than on anything else: each statement
SQLAlchemy sends is a round trip, and so are the ``BEGIN`` psycopg sends before the first and
the ``COMMIT``. In pipeline mode psycopg sends a list of statements (the ``BEGIN`` and the
``COMMIT`` included) and reads their results after one sync, so a commit whose statements do
not need each other's answers on the client costs one round trip for all of them.

The statements go through the driver's own connection, under the transaction SQLAlchemy
began, so they are part of it; SQLAlchemy's commit afterwards finds nothing left to commit.
Errors are the driver's (:func:`.errors.store_error` maps its connection failures).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import pq
from psycopg.rows import namedtuple_row
from sqlalchemy import Connection

from epochsvc.service.store.groupcommit import tally

Statement = tuple[str, Mapping[str, Any] | None]


def run(conn: Connection, statements: Sequence[Statement], *, commit: bool = False) -> list[Any]:
    """Run ``statements`` (and the ``COMMIT`` when ``commit``) in one round trip; the rows of
    each, in order (an empty list for a statement that returns none)."""
    raw = conn.connection.driver_connection
    assert raw is not None
    begins = raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
    cursors = []
    with raw.pipeline():
        for sql, params in statements:
            cursor = raw.cursor(row_factory=namedtuple_row)
            cursor.execute(sql, params)
            cursors.append(cursor)
        if commit:
            raw.commit()
    tally(len(statements), begins=begins, commits=commit)
    return [cursor.fetchall() if cursor.description is not None else [] for cursor in cursors]
