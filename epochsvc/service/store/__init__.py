"""One storage interface (`EpochStore`), two backends (SQLite, PostgreSQL) on one SQL code path."""

from epochsvc.service.store.base import (
    EpochRecord,
    EpochStore,
    RequestConflict,
    StoreUnavailable,
    UnknownEpoch,
)
from epochsvc.service.store.sql import SqlEpochStore, open_store

__all__ = [
    "EpochRecord",
    "EpochStore",
    "RequestConflict",
    "SqlEpochStore",
    "StoreUnavailable",
    "UnknownEpoch",
    "open_store",
]
