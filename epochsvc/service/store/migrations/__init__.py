"""Alembic migrations of the ledger (run by :mod:`epochsvc.service.store.migrate`)."""
