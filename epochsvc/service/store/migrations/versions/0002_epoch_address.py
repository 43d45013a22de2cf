"""0.2: ``epochs.address``, where the pod serves (for forwarding a request to its owner).

Nullable: an epoch of an older release has no address, and its sessions are refused as before
rather than forwarded.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("epochs", sa.Column("address", sa.String(300)))
