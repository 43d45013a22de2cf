"""0.4: ``epochs.successor`` and ``epochs.successor_of``, the session handoff rule.

A draining process hands its sessions to one live peer of its server and records that once:
``successor_of`` is the incarnation whose sessions moved, ``successor`` the process epoch that
took them. Nullable: an epoch of an older release handed nothing on.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("epochs", sa.Column("successor", sa.String(48)))
    op.add_column("epochs", sa.Column("successor_of", sa.BigInteger))
