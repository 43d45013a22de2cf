"""The ledger as release 0.1.0 created it (before schema versions existed).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ledger",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("ledger_id", sa.String(32), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "epochs",
        sa.Column("generation", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("server", sa.String(63), nullable=False),
        sa.Column("request_uid", sa.String(128), nullable=False, unique=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("pod_name", sa.String(253)),
        sa.Column("pod_uid", sa.String(128), unique=True),
        sa.Column("incarnation", sa.BigInteger),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_epochs_server", "epochs", ["namespace", "server", "revision"])
    op.create_index("ix_epochs_state_updated", "epochs", ["state", "updated_at"])
