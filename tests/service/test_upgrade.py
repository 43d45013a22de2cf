"""A ledger written by release 0.1.0 is upgraded in place at start and keeps every epoch; a
ledger of a newer release is refused; the migrations build exactly this release's tables.

The fixtures were written by the 0.1.0 service code itself (commit c36dd76; how: the script
next to them): ``ledger-0.1.0.db`` on SQLite and ``ledger-0.1.0.postgres.sql``, a ``pg_dump``
of the same steps on PostgreSQL. Five epochs in every state, incarnations, the generation
counter at 5 and the revision at 14.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from epochsvc.service.store import migrate, open_store
from epochsvc.service.store.engines import driver_url as _driver_url
from epochsvc.service.store.schema import metadata
from mcp_epoch import api
from tests.conftest import ServiceFactory
from tests.support.postgres import PostgresServer

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = {
    1: ("live", "p0", 0),
    2: ("draining", "p1", 1),
    3: ("retired", "p2", None),
    4: ("abandoned", None, None),
    5: ("pending", None, None),
}


@pytest.fixture(params=["sqlite", "postgres"])
def old_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A ledger exactly as release 0.1.0 left it, on each backend."""
    if request.param == "sqlite":
        db = tmp_path / "old.db"
        shutil.copyfile(FIXTURES / "ledger-0.1.0.db", db)
        return f"sqlite:///{db}"
    pg: PostgresServer = request.getfixturevalue("postgres")
    url = pg.new_database()
    pg.load(url, FIXTURES / "ledger-0.1.0.postgres.sql")
    return url


def _schema_revision(url: str) -> str | None:
    engine = sa.create_engine(_driver_url(url))
    try:
        with engine.connect() as conn:
            return migrate.current(conn)
    finally:
        engine.dispose()


def test_a_0_1_ledger_is_upgraded_in_place_and_keeps_every_epoch(
    service_factory: ServiceFactory, old_ledger: str
) -> None:
    assert _schema_revision(old_ledger) is None  # 0.1.0 recorded no version
    svc = service_factory(old_ledger)
    assert _schema_revision(old_ledger) == migrate.head()
    listing = svc.client().get("/v1/servers/ns/echo/epochs").json()
    assert listing["revision"] == 14
    prefix = listing["ledger_id"][:8]
    got = {e["epoch"]: (e["state"], e["pod_name"], e["incarnation"]) for e in listing["epochs"]}
    assert got == {f"{prefix}-{g}": row for g, row in EXPECTED.items()}
    assert all(e["address"] is None for e in listing["epochs"])
    # The generation counter goes on from where 0.1 left it: never a repeat.
    assert svc.issue("ns", "echo", "after-upgrade") == f"{prefix}-6"
    # An old live epoch takes its address through a repeated bind of the same pod ...
    bound = svc.send(api.bind(f"{prefix}-1", "p0", "uid-0", "10.1.2.3:8080"))
    assert bound.address == "10.1.2.3:8080" and bound.state == "live"
    # ... and the upgraded ledger opens again unchanged (the upgrade is done once).
    svc.restart()
    again = svc.client().get(f"/v1/epochs/{prefix}-1").json()
    assert again["address"] == "10.1.2.3:8080" and again["incarnation"] == 0
    assert svc.client().get("/v1/servers/ns/echo/epochs").json()["revision"] == 16


def test_a_ledger_of_a_newer_release_is_refused_and_left_alone(
    database_url: str, tmp_path: Path
) -> None:
    store = asyncio.run(open_store(database_url))
    asyncio.run(store.close())
    engine = sa.create_engine(_driver_url(database_url))
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'f00d'"))
    engine.dispose()
    with pytest.raises(migrate.LedgerTooNew, match="revision f00d, written by a newer"):
        asyncio.run(open_store(database_url))
    assert _schema_revision(database_url) == "f00d"
    # The command line says it in one line and exits non-zero.
    done = subprocess.run(
        [sys.executable, "-m", "epochsvc.cli", "serve", "--port", "0"],
        env={
            "EPOCHSVC_DATABASE_URL": database_url,
            "EPOCHSVC_AUTH": "static",
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "newer mcp-epoch" in lines[0], done.stderr


def test_the_migrations_build_exactly_the_tables_of_this_release(database_url: str) -> None:
    store = asyncio.run(open_store(database_url))
    asyncio.run(store.close())
    engine = sa.create_engine(_driver_url(database_url))
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
    finally:
        engine.dispose()
    assert diff == []
