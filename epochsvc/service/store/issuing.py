"""Issuing epochs, one or a whole group commit's worth in the same few statements.

Issuing is the write of a burst: a Deployment scaled up admits its pods at once, and every
admission issues an epoch. Issued one by one, each costs a savepoint, a counter bump, a
lookup, an insert and a release: five round trips to PostgreSQL, held under the writer lock
the whole time. :func:`issue_all` issues a batch in four whatever its size: the writer lock,
one lookup of every request UID, one bump of the generation counter by the number of new
epochs, and one multi-row insert. The batch shares one revision, like any other single
transaction.

A request UID already in the ledger (an admission request retried) gets its epoch back and
spends nothing; the same UID twice in one batch is issued once.

On PostgreSQL, where each statement is a network round trip, the lookup, the bump and the
insert are one statement (:data:`ISSUE_SQL`), sent in one pipeline with the lock before it.
A commit of issues alone is one round trip in all: ``BEGIN``, the lock, the issue, the change
notification and ``COMMIT`` (:mod:`.pipeline`). The lock is its own statement, ahead of the
other, because under READ COMMITTED a statement sees what was committed when it began: the
lookup must begin after the lock is held to see another process's issue for the same
request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

from sqlalchemy import Connection

from epochsvc.service.lifecycle import State
from epochsvc.service.store import pipeline, queries
from epochsvc.service.store.base import EpochRecord
from epochsvc.service.store.schema import LEDGER_ROW

#: An issue's answer: the epoch, and whether this request made it (False: issued before).
Issued = tuple[EpochRecord, bool]


@dataclass(frozen=True, slots=True)
class IssueRequest:
    """One admission's issue, queued for the group committer (which runs a batch's issues
    together through :meth:`together`)."""

    namespace: str
    server: str
    request_uid: str
    ledger8: str

    def __call__(self, conn: Connection) -> Issued:
        return issue_all(conn, [self])[0]

    @staticmethod
    def together(conn: Connection, requests: list[IssueRequest]) -> list[Issued]:
        return issue_all(conn, requests)


def issue_all(conn: Connection, requests: list[IssueRequest]) -> list[Issued]:
    """Issue every request's epoch in one transaction, answers in the requests' order."""
    if not requests:
        return []
    ledger8 = requests[0].ledger8
    first_of: dict[str, IssueRequest] = {}
    for r in requests:
        first_of.setdefault(r.request_uid, r)
    if conn.dialect.name == "postgresql":
        found, made = _issue_pipelined(conn, list(first_of.values()), ledger8)
    else:
        found, made = _issue_statements(conn, first_of, ledger8)
    records = {**found, **made}
    # Made by this request only if it is the first of its UID in the batch: a twin is a retry.
    return [
        (records[r.request_uid], r.request_uid in made and first_of[r.request_uid] is r)
        for r in requests
    ]


def _issue_statements(
    conn: Connection, first_of: dict[str, IssueRequest], ledger8: str
) -> tuple[dict[str, EpochRecord], dict[str, EpochRecord]]:
    """The epochs found and made, by request UID: a statement at a time (SQLite, in-process)."""
    # The lock first, so the lookup also sees what another service process committed a
    # moment ago; it spends no revision, so a batch of retries changes nothing.
    queries.lock_writers(conn)
    found = queries.by_requests(conn, list(first_of), ledger8)
    new = [r for uid, r in first_of.items() if uid not in found]
    made: dict[str, EpochRecord] = {}
    if new:
        revision, first = queries.bump_generations(conn, len(new))
        now = time.time()
        rows = [
            {
                "generation": first + i,
                "namespace": r.namespace,
                "server": r.server,
                "request_uid": r.request_uid,
                "state": State.PENDING.value,
                "pod_name": None,
                "pod_uid": None,
                "incarnation": None,
                "address": None,
                "successor": None,
                "successor_of": None,
                "revision": revision,
                "created_at": now,
                "updated_at": now,
            }
            for i, r in enumerate(new)
        ]
        conn.execute(queries.INSERT, rows)
        made = {
            r.request_uid: queries.to_record(SimpleNamespace(**row), ledger8)
            for r, row in zip(new, rows, strict=True)
        }
    return found, made


LOCK_SQL = f"SELECT id FROM ledger WHERE id = {LEDGER_ROW} FOR UPDATE"

#: Every distinct request of a batch at once: those already issued are found, the others get
#: consecutive new generations in the batch's order under one new revision (and none is spent
#: when nothing is new). Each row says whether this statement made it.
ISSUE_SQL = f"""
WITH req AS (
    SELECT uid, ns, srv, ord
    FROM unnest(%(uids)s::text[], %(namespaces)s::text[], %(servers)s::text[])
        WITH ORDINALITY AS r(uid, ns, srv, ord)
), new AS (
    SELECT req.*, row_number() OVER (ORDER BY req.ord) AS k
    FROM req
    WHERE NOT EXISTS (SELECT 1 FROM epochs e WHERE e.request_uid = req.uid)
), bump AS (
    UPDATE ledger
    SET revision = revision + 1, generation = generation + (SELECT count(*) FROM new)
    WHERE id = {LEDGER_ROW} AND EXISTS (SELECT 1 FROM new)
    RETURNING revision, generation
), made AS (
    INSERT INTO epochs
        (generation, namespace, server, request_uid, state, revision, created_at, updated_at)
    SELECT bump.generation - (SELECT count(*) FROM new) + new.k, new.ns, new.srv, new.uid,
        %(state)s, bump.revision, %(now)s, %(now)s
    FROM new CROSS JOIN bump
    RETURNING *
)
SELECT made.*, true AS made_now FROM made
UNION ALL
SELECT e.*, false AS made_now FROM epochs e JOIN req ON e.request_uid = req.uid
"""


def _issue_pipelined(
    conn: Connection, distinct: list[IssueRequest], ledger8: str
) -> tuple[dict[str, EpochRecord], dict[str, EpochRecord]]:
    """The epochs found and made, by request UID: the lock and :data:`ISSUE_SQL` in one
    round trip (PostgreSQL)."""
    params = {
        "uids": [r.request_uid for r in distinct],
        "namespaces": [r.namespace for r in distinct],
        "servers": [r.server for r in distinct],
        "state": State.PENDING.value,
        "now": time.time(),
    }
    # Nothing follows the issue in its transaction: alone in a commit, it carries the COMMIT.
    _, rows = pipeline.run(conn, [(LOCK_SQL, None), (ISSUE_SQL, params)], last=True)
    found: dict[str, EpochRecord] = {}
    made: dict[str, EpochRecord] = {}
    for row in rows:
        (made if row.made_now else found)[row.request_uid] = queries.to_record(row, ledger8)
    return found, made
