"""Alembic's entry point: migrations run on the connection the store hands over (inside its
write transaction, under its writer lock), never on a connection of their own."""

from __future__ import annotations

from alembic import context

from epochsvc.service.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
