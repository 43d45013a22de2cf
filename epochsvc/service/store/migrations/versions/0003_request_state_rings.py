"""0.3: the request-state key rings (MCP 2026-07-28) and the ring revision each pod holds.

New tables only: a ledger of an older release gains them empty, and a server's ring is made
the first time one of its pods asks for it.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "request_state_rings",
        sa.Column("namespace", sa.String(63), primary_key=True),
        sa.Column("server", sa.String(63), primary_key=True),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("keys", sa.Text, nullable=False),
        sa.Column("ttl", sa.Float, nullable=False),
        sa.Column("started_at", sa.Float),
        sa.Column("switched_at", sa.Float),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "request_state_holders",
        sa.Column("generation", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("incarnation", sa.BigInteger, nullable=False),
        sa.Column("revision", sa.BigInteger, nullable=False),
        sa.Column("reported_at", sa.Float, nullable=False),
    )
