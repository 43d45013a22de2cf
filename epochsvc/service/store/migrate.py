"""The ledger's schema version, and upgrades in place (Alembic).

Alembic is SQLAlchemy's own migration tool: the store already speaks SQLAlchemy Core on both
backends, and Alembic records the version in the database (``alembic_version``), runs
``ALTER TABLE`` portably (batch mode on SQLite) and fits inside an existing transaction.

:func:`upgrade` runs on the connection of the store's first write transaction: the same lock
that keeps writers exclusive (the SQLite file lock, the PostgreSQL advisory lock) covers the
upgrade, so two processes never migrate at once and no writer sees half a schema. It handles:

- an empty database: every migration from the first (the tables of this release);
- a ledger of release 0.1.0, made before versions were recorded: recognised by its tables,
  marked as revision ``0001`` and upgraded from there;
- a ledger at an older revision: upgraded to this release's head;
- a ledger written by a **newer** release: refused with :class:`LedgerTooNew` (nothing is
  changed), since this code cannot know what the newer columns mean.
"""

from __future__ import annotations

import logging
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection

log = logging.getLogger("epochsvc.store")

MIGRATIONS = Path(__file__).with_name("migrations")
#: The revision of a ledger made by 0.1.0 (no ``alembic_version`` table yet).
UNVERSIONED_BASELINE = "0001"
#: The first revision that has ``epochs.address`` (development builds added it without a
#: version before Alembic came in).
ADDRESS_REVISION = "0002"


class LedgerTooNew(RuntimeError):
    """The ledger's schema is newer than this release knows."""


def _config(conn: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def head() -> str:
    """This release's schema revision."""
    script = ScriptDirectory(str(MIGRATIONS))
    current = script.get_current_head()
    assert current is not None, "no migrations"
    return current


def current(conn: Connection) -> str | None:
    """The ledger's recorded revision, or None when it records none."""
    heads = MigrationContext.configure(conn).get_current_heads()
    return heads[0] if heads else None


def upgrade(conn: Connection) -> tuple[str | None, str]:
    """Bring the ledger on ``conn`` to :func:`head`; returns (revision before, after)."""
    config = _config(conn)
    script = ScriptDirectory.from_config(config)
    before = current(conn)
    if before is None:
        tables = set(sa.inspect(conn).get_table_names())
        if "ledger" in tables:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("epochs")}
            baseline = ADDRESS_REVISION if "address" in columns else UNVERSIONED_BASELINE
            command.stamp(config, baseline)
            log.warning("ledger had no schema version; recorded", extra={"revision": baseline})
            before = baseline
    else:
        try:
            script.get_revision(before)
        except CommandError:
            known = head()
            raise LedgerTooNew(
                f"the ledger's schema is revision {before}, written by a newer mcp-epoch; this "
                f"release knows revisions up to {known}. Run the newer release (an upgrade "
                "cannot be undone in place), or restore a backup taken before it ran"
            ) from None
    target = head()
    if before != target:
        command.upgrade(config, "head")
        if before is None:
            log.info("ledger schema created", extra={"revision": target})
        else:
            log.warning(
                "ledger schema upgraded",
                extra={"from_revision": before, "to_revision": target},
            )
    return before, target
