"""The ledger's tables, as this release has them (the migrations in ``migrations/`` build and
upgrade them; a test checks that both agree)."""

from __future__ import annotations

import sqlalchemy as sa

from mcp_epoch.contract import MAX_PROCESS_EPOCH_LEN

metadata = sa.MetaData()
ADDRESS_MAX_LEN = 300
PROCESS_EPOCH_MAX_LEN = MAX_PROCESS_EPOCH_LEN
#: The single row of ``ledger``.
LEDGER_ROW = 1

ledger_table = sa.Table(
    "ledger",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("ledger_id", sa.String(32), nullable=False),
    # The last generation issued; only ever incremented.
    sa.Column("generation", sa.BigInteger, nullable=False),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

epochs_table = sa.Table(
    "epochs",
    metadata,
    sa.Column("generation", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("namespace", sa.String(63), nullable=False),
    sa.Column("server", sa.String(63), nullable=False),
    sa.Column("request_uid", sa.String(128), nullable=False, unique=True),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("pod_name", sa.String(253)),
    sa.Column("pod_uid", sa.String(128), unique=True),
    sa.Column("incarnation", sa.BigInteger),
    # Since 0.2 (migration 0002): where the pod serves, for forwarding to a session's owner.
    sa.Column("address", sa.String(ADDRESS_MAX_LEN)),
    # Since 0.4 (migration 0004): the handoff rule of this pod's process ``successor_of``
    # (an incarnation): its sessions went to the process epoch ``successor``. One rule per
    # process, not a row per session, so the live view stays as small as the fleet.
    sa.Column("successor", sa.String(PROCESS_EPOCH_MAX_LEN)),
    sa.Column("successor_of", sa.BigInteger),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Index("ix_epochs_server", "namespace", "server", "revision"),
    sa.Index("ix_epochs_state_updated", "state", "updated_at"),
)

# Since 0.3 (migration 0003): each MCP server's request-state key ring (keyring.py), and which
# ring revision each live pod's newest process holds. Apart from ``epochs``: a ring step or a
# report changes no epoch, so it wakes none of the servers' live views.
rings_table = sa.Table(
    "request_state_rings",
    metadata,
    sa.Column("namespace", sa.String(63), primary_key=True),
    sa.Column("server", sa.String(63), primary_key=True),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("phase", sa.String(16), nullable=False),
    # JSON list of base64 keys, keys[0] seals. Secret: the ledger is as sensitive as a Secret.
    sa.Column("keys", sa.Text, nullable=False),
    sa.Column("ttl", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float),
    sa.Column("switched_at", sa.Float),
    sa.Column("updated_at", sa.Float, nullable=False),
)

ring_holders_table = sa.Table(
    "request_state_holders",
    metadata,
    sa.Column("generation", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("incarnation", sa.BigInteger, nullable=False),
    sa.Column("revision", sa.BigInteger, nullable=False),
    sa.Column("reported_at", sa.Float, nullable=False),
)
