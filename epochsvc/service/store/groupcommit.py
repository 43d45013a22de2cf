"""Group commit: concurrent writes share one transaction and one durable commit.

With ``synchronous=FULL`` (SQLite) or ``fsync`` (PostgreSQL) the commit's flush dominates the
cost of a write. Writers queue their operations; one writer thread runs every queued operation
in a single transaction, each in its own savepoint (one operation's error never spoils
another's), commits once, and only then answers each writer. A write is still acknowledged only
after it is on disk, while eight concurrent issuers pay for one flush instead of eight, and the
event loop hands the database one batch per thread hop instead of one statement.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

T = TypeVar("T")
Op = Callable[[Connection], Any]

MAX_BATCH = 64


class NoChange(Exception):
    """Raised by an operation that turned out to be a legal no-op: its savepoint is rolled
    back (so no revision is spent) and ``value`` is its answer."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class GroupCommitter:
    def __init__(
        self,
        engine: Engine,
        wrap_errors: Callable[[BaseException], BaseException],
        on_commit: Callable[[list[Any]], None] | None = None,
        before_commit: Callable[[Connection], None] | None = None,
    ) -> None:
        self._engine = engine
        self._before_commit = before_commit
        self._wrap = wrap_errors
        self._on_commit = on_commit
        self._pending: list[tuple[Op, asyncio.Future[Any]]] = []
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="epochsvc-writer")
        self._running = False
        self._drainer: asyncio.Task[None] | None = None

    async def submit(self, op: Callable[[Connection], T]) -> T:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((op, future))
        if not self._running:
            self._running = True
            self._drainer = asyncio.create_task(self._drain(), name="epochsvc-group-commit")
        return await future

    async def _drain(self) -> None:
        """Commit batches until nobody waits; writes queued during a commit form the next."""
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
                try:
                    outcomes = await loop.run_in_executor(
                        self._thread, self._commit, [op for op, _ in batch]
                    )
                except Exception as exc:
                    # Nothing in this batch is durable: every writer hears so, none is answered
                    # as if it were.
                    error = self._wrap(exc)
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                if self._on_commit is not None:
                    self._on_commit([value for ok, value in outcomes if ok])
                for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue  # the writer was cancelled (client went away); the write stands
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            self._running = False

    def _commit(self, ops: list[Op]) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = []
        with self._engine.begin() as conn:
            for op in ops:
                try:
                    with conn.begin_nested():
                        outcomes.append((True, op(conn)))
                except NoChange as unchanged:
                    outcomes.append((True, unchanged.value))
                except Exception as exc:
                    outcomes.append((False, exc))
            if self._before_commit is not None:
                self._before_commit(conn)
        return outcomes

    def close(self) -> None:
        self._thread.shutdown(wait=True)
