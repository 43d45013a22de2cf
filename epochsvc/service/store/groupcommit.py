"""Group commit: concurrent writes share one transaction and one durable commit.

With ``synchronous=FULL`` (SQLite) or ``fsync`` (PostgreSQL) the commit's flush dominates the
cost of a write. Writers queue their operations; one writer thread runs every queued operation
in a single transaction, each in its own savepoint (one operation's error never spoils
another's), commits once, and only then answers each writer. A write is still acknowledged only
after it is on disk, while eight concurrent issuers pay for one flush instead of eight, and the
event loop hands the database one batch per thread hop instead of one statement.

An operation may also say how to run together with the others of its kind (a ``together``
attribute: a function of the connection and the operations, answering each): a batch's
issues then cost a few statements in all instead of a few each. Such a function fails only
for what would fail each of its operations alone (the database), so its operations share
one savepoint and one outcome. A batch that is a single unit (one operation, or one kind)
needs no savepoint at all: there is nothing else for its error to spoil.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, event

from epochsvc.service.store.base import CommitStats

T = TypeVar("T")
Op = Callable[[Connection], Any]

MAX_BATCH = 64

#: The committer whose commit runs on this thread, and what its round trips covered.
_active = threading.local()


def tally(statements: int, *, begins: bool = False, commits: bool = False) -> None:
    """Count ``statements`` sent in one round trip by the commit running on this thread (none:
    a read). ``begins``/``commits``: the same trip carried the transaction's BEGIN/COMMIT,
    which otherwise cost one each on PostgreSQL."""
    committer: GroupCommitter | None = getattr(_active, "committer", None)
    if committer is None:
        return
    committer.stats.statements += statements
    committer.stats.round_trips += 1
    _active.began = _active.began or begins
    _active.committed = _active.committed or commits


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
        self.stats = CommitStats()
        self._postgres = engine.dialect.name == "postgresql"
        # Statements are counted on the writer thread only (tally): on PostgreSQL the readers
        # and the follower share the engine.
        event.listen(engine, "before_cursor_execute", self._count_statement)

    def _count_statement(self, *_: Any) -> None:
        if getattr(_active, "committer", None) is self:
            tally(1)

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
        began = time.perf_counter()
        _active.committer, _active.began, _active.committed = self, False, False
        units = _units(ops)
        try:
            if len(units) == 1:
                return self._commit_one(units[0])
            outcomes: list[tuple[bool, Any]] = [(False, None)] * len(ops)
            with self._engine.begin() as conn:
                for unit in units:
                    for i, outcome in zip(unit.members, _isolated(conn, unit), strict=True):
                        outcomes[i] = outcome
                if self._before_commit is not None:
                    self._before_commit(conn)
            return outcomes
        finally:
            stats = self.stats
            # What no statement carried: COMMIT, and on PostgreSQL the BEGIN psycopg sends
            # before the first statement and the pool's liveness ping at check-out.
            extra = 0 if _active.committed else 1
            if self._postgres:
                extra += 1 + (0 if _active.began else 1)
            stats.round_trips += extra
            _active.committer = None
            stats.commits += 1
            stats.writes += len(ops)
            stats.seconds += time.perf_counter() - began

    def _commit_one(self, unit: _Unit) -> list[tuple[bool, Any]]:
        """A batch of one unit has nothing its error could spoil: no savepoint (two round
        trips fewer); an error or a no-op rolls the whole transaction back."""
        try:
            with self._engine.begin() as conn:
                outcomes, stands = _run(conn, unit)
                if not stands:
                    raise _RolledBack(outcomes)
                if self._before_commit is not None:
                    self._before_commit(conn)
        except _RolledBack as rolled_back:
            return rolled_back.outcomes
        return outcomes

    def close(self) -> None:
        self._thread.shutdown(wait=True)


class _RolledBack(Exception):
    """Leaves a transaction by rolling it back, carrying the answers its writers get."""

    def __init__(self, outcomes: list[tuple[bool, Any]]) -> None:
        super().__init__()
        self.outcomes = outcomes


@dataclass(frozen=True, slots=True)
class _Unit:
    """What runs as one: a lone operation, or every operation of a kind that goes together."""

    members: list[int]  # positions in the batch
    ops: list[Op]
    together: Callable[[Connection, list[Any]], list[Any]] | None

    def run(self, conn: Connection) -> list[Any]:
        if self.together is None:
            return [self.ops[0](conn)]
        return self.together(conn, self.ops)


def _units(ops: list[Op]) -> list[_Unit]:
    kinds: dict[Callable[[Connection, list[Any]], list[Any]], list[int]] = {}
    units: list[_Unit] = []
    for i, op in enumerate(ops):
        together = getattr(op, "together", None)
        if together is None:
            units.append(_Unit([i], [op], None))
        else:
            kinds.setdefault(together, []).append(i)
    for together, members in kinds.items():
        units.append(_Unit(members, [ops[i] for i in members], together))
    return units


def _run(conn: Connection, unit: _Unit) -> tuple[list[tuple[bool, Any]], bool]:
    """The unit's answers, and whether its writes stand (False: roll them back, after an
    error or a legal no-op)."""
    try:
        return [(True, value) for value in unit.run(conn)], True
    except NoChange as unchanged:
        return [(True, unchanged.value)], False
    except Exception as exc:
        return [(False, exc)] * len(unit.ops), False


def _isolated(conn: Connection, unit: _Unit) -> list[tuple[bool, Any]]:
    """A unit in a savepoint of its own: its error spoils nothing else in the batch."""
    try:
        with conn.begin_nested():
            outcomes, stands = _run(conn, unit)
            if not stands:
                raise _RolledBack(outcomes)
    except _RolledBack as rolled_back:
        return rolled_back.outcomes
    except Exception as exc:  # the savepoint itself failed (the database)
        return [(False, exc)] * len(unit.ops)
    return outcomes
