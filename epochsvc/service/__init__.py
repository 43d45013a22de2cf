"""The epoch service: the durable epoch ledger behind a FastAPI API (needs the `service` extra)."""
