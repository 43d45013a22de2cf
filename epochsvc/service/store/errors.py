"""Which database failures mean "the ledger is unavailable" (503, retry) and which are bugs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy.exc import DBAPIError, OperationalError, PendingRollbackError

from epochsvc.service.store.base import StoreUnavailable


@contextmanager
def database_errors() -> Iterator[None]:
    """Lost-database errors leave as StoreUnavailable; every other error passes unchanged."""
    try:
        yield
    except Exception as exc:
        mapped = store_error(exc)
        if mapped is exc:
            raise
        raise mapped from exc


def store_error(exc: BaseException) -> BaseException:
    """Connection-level failures become StoreUnavailable (503); anything else is a bug.

    ``PendingRollbackError`` is one of them: when the database dies inside a group commit,
    a statement after the failed one (the ``pg_notify``) finds the transaction invalid.
    The driver's own ``OperationalError`` is one too: statements sent in a pipeline
    (:mod:`.pipeline`) reach psycopg without SQLAlchemy's wrapping.
    """
    lost = OperationalError | PendingRollbackError | psycopg.OperationalError
    if isinstance(exc, lost | OSError | ConnectionError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        cause = getattr(exc, "orig", None) or exc
        brief = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        return StoreUnavailable(f"the ledger database is unavailable: {brief}")
    return exc
