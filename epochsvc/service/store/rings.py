"""The request-state key rings' statements, as plain functions of a connection (both backends).

The rotation logic is :mod:`epochsvc.service.keyring`; these only read and write its rows.
Writes run under the ledger's writer lock (``queries.lock_writers``).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from epochsvc.service.keyring import Holder, Phase, Ring
from epochsvc.service.lifecycle import State
from epochsvc.service.store.schema import epochs_table, ring_holders_table, rings_table

#: The pod epochs whose processes may seal or open a server's request state.
HOLDING_STATES = (State.LIVE.value, State.DRAINING.value)


def _ring_of(row: Any) -> Ring:
    return Ring(
        namespace=row.namespace,
        server=row.server,
        revision=int(row.revision),
        phase=Phase(row.phase),
        keys=tuple(base64.b64decode(k) for k in json.loads(row.keys)),
        ttl=float(row.ttl),
        updated_at=float(row.updated_at),
        started_at=None if row.started_at is None else float(row.started_at),
        switched_at=None if row.switched_at is None else float(row.switched_at),
    )


def _values(ring: Ring) -> dict[str, Any]:
    return {
        "revision": ring.revision,
        "phase": ring.phase.value,
        "keys": json.dumps([base64.b64encode(k).decode() for k in ring.keys]),
        "ttl": ring.ttl,
        "started_at": ring.started_at,
        "switched_at": ring.switched_at,
        "updated_at": ring.updated_at,
    }


def _where(namespace: str, server: str) -> Any:
    return sa.and_(rings_table.c.namespace == namespace, rings_table.c.server == server)


def read(conn: Connection, namespace: str, server: str) -> Ring | None:
    row = conn.execute(sa.select(rings_table).where(_where(namespace, server))).first()
    return None if row is None else _ring_of(row)


def revisions(conn: Connection) -> dict[tuple[str, str], int]:
    """Every ring's revision, by server: one statement for a whole catch-up pass."""
    c = rings_table.c
    rows = conn.execute(sa.select(c.namespace, c.server, c.revision))
    return {(row.namespace, row.server): row.revision for row in rows}


def insert(conn: Connection, ring: Ring) -> None:
    conn.execute(
        rings_table.insert().values(namespace=ring.namespace, server=ring.server, **_values(ring))
    )


def update(conn: Connection, ring: Ring) -> None:
    where = _where(ring.namespace, ring.server)
    conn.execute(rings_table.update().where(where).values(_values(ring)))


def report(conn: Connection, generation: int, incarnation: int, revision: int, now: float) -> None:
    """Record the ring revision one process holds. A newer process of the pod replaces an
    older one's report; a process's own reports only ever raise its revision (a late,
    reordered report cannot make it look further behind than it is)."""
    holders = ring_holders_table
    row = conn.execute(
        sa.select(holders.c.incarnation, holders.c.revision).where(
            holders.c.generation == generation
        )
    ).first()
    values = {"incarnation": incarnation, "revision": revision, "reported_at": now}
    if row is None:
        conn.execute(holders.insert().values(generation=generation, **values))
        return
    if incarnation < int(row.incarnation):
        return
    if incarnation == int(row.incarnation):
        values["revision"] = max(revision, int(row.revision))
    conn.execute(holders.update().where(holders.c.generation == generation).values(values))


def holders(conn: Connection, namespace: str, server: str) -> list[Holder]:
    """Every live or draining pod epoch of the server, with what its newest process holds."""
    e, h = epochs_table, ring_holders_table
    query = (
        sa.select(e.c.generation, e.c.pod_name, e.c.incarnation, h.c.incarnation, h.c.revision)
        .select_from(e.outerjoin(h, h.c.generation == e.c.generation))
        .where(e.c.namespace == namespace, e.c.server == server, e.c.state.in_(HOLDING_STATES))
        .order_by(e.c.generation)
    )
    found = []
    for generation, pod_name, newest, reported, revision in conn.execute(query):
        current = reported is not None and newest is not None and int(reported) == int(newest)
        held = int(revision) if current else None
        found.append(Holder(pod=pod_name or f"epoch {generation}", revision=held))
    return found


def forget_gone(conn: Connection) -> int:
    """Drop the reports of pod epochs that were compacted away."""
    h = ring_holders_table
    alive = sa.select(epochs_table.c.generation)
    return int(conn.execute(h.delete().where(h.c.generation.not_in(alive))).rowcount)
