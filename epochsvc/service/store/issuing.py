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
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

from sqlalchemy import Connection

from epochsvc.service.lifecycle import State
from epochsvc.service.store import queries
from epochsvc.service.store.base import EpochRecord

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
    # The lock first, so the lookup also sees what another service process committed a
    # moment ago; it spends no revision, so a batch of retries changes nothing.
    queries.lock_writers(conn)
    first_of: dict[str, IssueRequest] = {}
    for r in requests:
        first_of.setdefault(r.request_uid, r)
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
    records = {**found, **made}
    # Made by this request only if it is the first of its UID in the batch: a twin is a retry.
    return [
        (records[r.request_uid], r.request_uid in made and first_of[r.request_uid] is r)
        for r in requests
    ]
