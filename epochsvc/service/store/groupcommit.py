"""Group commit: concurrent writes share one transaction and one durable commit.

With ``synchronous=FULL`` (SQLite) or ``fsync`` (PostgreSQL) the commit's flush dominates the
cost of a write. Writers queue their operations; one writer thread runs every queued operation
in a single transaction, each in its own savepoint (one operation's error never spoils
another's), commits once, and only then answers each writer. A write is still acknowledged only
after it is on disk, while eight concurrent issuers pay for one flush instead of eight, and the
event loop hands the database one batch per thread hop instead of one statement.

The writer thread takes its next batch itself when a commit ends, and hands the outcomes back
to the event loop without waiting for it: a loop busy with HTTP would otherwise hold the next
commit back by its own latency (it left the writer idle a third of the time at eight PostgreSQL
issuers). How long a batch waits for the rest of its writers is :meth:`_next_batch`'s.

An operation may also say how to run together with the others of its kind (a ``together``
attribute: a function of the connection and the operations, answering each): a batch's
issues then cost a few statements in all instead of a few each. Such a function fails only
for what would fail each of its operations alone (the database), so its operations share
one savepoint and one outcome. A batch that is a single unit (one operation, or one kind)
needs no savepoint at all: there is nothing else for its error to spoil.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine, event

from epochsvc.service.store.base import CommitStats

T = TypeVar("T")
Op = Callable[[Connection], Any]
Batch = list[tuple[Op, "asyncio.Future[Any]"]]

MAX_BATCH = 64
#: The longest a batch waits for the rest of its group of writers (:meth:`_next_batch`).
MAX_GATHER = 0.002

log = logging.getLogger("epochsvc.store")

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


class Closer(Protocol):
    """How a transaction ends on this database beyond the ``COMMIT`` (PostgreSQL: the
    change notification, :class:`.pipeline.Closing`). A unit that ended the transaction
    itself said so to :func:`tally` (``commits``)."""

    def offer(self, conn: Connection) -> None:
        """The unit about to run is the whole transaction: it may end it itself."""

    def withdraw(self, conn: Connection) -> None:
        """The unit has run: take the offer back."""

    def close(self, conn: Connection) -> None:
        """End the transaction (one the unit did not end)."""


class CommitAlone:
    """The :class:`Closer` of a database where the ``COMMIT`` alone ends a transaction, which
    the engine's transaction sends (SQLite)."""

    def offer(self, conn: Connection) -> None:
        pass

    def withdraw(self, conn: Connection) -> None:
        pass

    def close(self, conn: Connection) -> None:
        pass


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
        closer: Closer | None = None,
    ) -> None:
        self._engine = engine
        self._closer = closer or CommitAlone()
        self._wrap = wrap_errors
        self._on_commit = on_commit
        # Queued by the event loop, taken by the writer thread, under the condition's lock.
        self._queued: Batch = []
        self._ready = threading.Condition()
        self._wake_due = False  # a wake-up is scheduled for the end of this loop turn
        self._closed = False
        self._group = 1  # writers in the last commit and queued behind it (_next_batch)
        self._gather = 0.0  # how long the next batch may wait for the rest of that group
        self._thread = threading.Thread(
            target=self._write_loop, name="epochsvc-writer", daemon=True
        )
        self._thread.start()
        self.stats = CommitStats()
        self._postgres = engine.dialect.name == "postgresql"
        # Statements are counted on the writer thread only (tally): on PostgreSQL the readers
        # and the follower share the engine.
        event.listen(engine, "before_cursor_execute", self._count_statement)

    def _count_statement(self, *_: Any) -> None:
        if getattr(_active, "committer", None) is self:
            tally(1)

    async def submit(self, op: Callable[[Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the group committer is closed")
            self._queued.append((op, future))
        if not self._wake_due:
            # Wake an idle writer once this loop turn has queued everything it will (a burst
            # of admissions is one batch), not at the first of them.
            self._wake_due = True
            loop.call_soon(self._wake)
        return await future

    def _wake(self) -> None:
        self._wake_due = False
        with self._ready:
            self._ready.notify()

    def _write_loop(self) -> None:
        """The writer thread: commit batches back to back while anything is queued. The
        writer never waits for the event loop between commits, which only hears the outcomes
        (in commit order)."""
        while (batch := self._next_batch()) is not None:
            spent = self.stats.seconds  # _commit adds its own time (only this thread writes it)
            try:
                outcomes = self._commit([op for op, _ in batch])
            except Exception as exc:
                self._hand_back(batch, self._fail, exc)
            else:
                self._hand_back(batch, self._answer, outcomes)
            with self._ready:
                # Writers come back as a group: those this commit answers, and those queued
                # behind it.
                self._group = len(batch) + len(self._queued)
                self._gather = min(MAX_GATHER, (self.stats.seconds - spent) / 2)

    def _next_batch(self) -> Batch | None:
        """What the next commit carries (None: closed, and nothing is left).

        Concurrent writers left to themselves split into two halves that take turns: the
        half answered by one commit comes back while the next commit, of the other half, is
        under way. Each commit then carries half of them, and every writer waits for two.
        So while fewer than the last group are queued, the writer waits for the rest, at most
        half a commit's time (and never more than :data:`MAX_GATHER`): a lone writer, or a
        group that shrank, pays that once. PostgreSQL's ``commit_delay`` makes the same trade.
        Only how writes are grouped depends on this wait, never what any of them does."""
        with self._ready:
            while not self._queued and not self._closed:
                self._ready.wait()
            deadline = time.monotonic() + self._gather
            while 0 < len(self._queued) < self._group and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._ready.wait(left)
            if not self._queued:
                return None
            batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
            return batch

    def _hand_back(self, batch: Batch, fn: Callable[[Batch, Any], None], arg: Any) -> None:
        try:
            batch[0][1].get_loop().call_soon_threadsafe(fn, batch, arg)
        except RuntimeError:  # the loop is closed: nobody is left to answer
            log.warning("a group commit ended after its event loop closed")

    def _fail(self, batch: Batch, exc: Exception) -> None:
        """Nothing in this batch is durable: every writer hears so, none is answered as if
        it were."""
        error = self._wrap(exc)
        for _, future in batch:
            if not future.done():
                future.set_exception(error)

    def _answer(self, batch: Batch, outcomes: list[tuple[bool, Any]]) -> None:
        """On the loop: the copy learns the commit before any writer hears of it."""
        if self._on_commit is not None:
            self._on_commit([value for ok, value in outcomes if ok])
        for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
            if future.done():
                continue  # the writer was cancelled (client went away); the write stands
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

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
                self._closer.close(conn)
            return outcomes
        finally:
            stats = self.stats
            # What no statement carried: COMMIT, and on PostgreSQL the BEGIN psycopg sends
            # before the first statement.
            extra = 0 if _active.committed else 1
            if self._postgres and not _active.began:
                extra += 1
            stats.round_trips += extra
            _active.committer = None
            stats.commits += 1
            stats.writes += len(ops)
            stats.seconds += time.perf_counter() - began

    def _commit_one(self, unit: _Unit) -> list[tuple[bool, Any]]:
        """A batch of one unit has nothing its error could spoil: no savepoint (two round
        trips fewer); an error or a no-op rolls the whole transaction back. Being the whole
        transaction, the unit may also end it with its own last statements (``offer``)."""
        closer = self._closer
        try:
            with self._engine.begin() as conn:
                closer.offer(conn)
                try:
                    outcomes, stands = _run(conn, unit)
                finally:
                    closer.withdraw(conn)
                if not stands:
                    raise _RolledBack(outcomes)
                if not _active.committed:
                    closer.close(conn)
        except _RolledBack as rolled_back:
            return rolled_back.outcomes
        return outcomes

    def close(self) -> None:
        """Commit what is queued, then stop the writer thread."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()


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
