"""Long polls: hold a reader until its server's epochs change or its wait runs out.

Waiters are woken by the change notifications the service already has, per server: a write
made by this process (the routers, the sweeper) and, on PostgreSQL, a write of another
service process delivered by the store's follower. A change to one server wakes only that
server's waiters, so a fleet of servers never turns one write into a thundering herd. A
notification names the server's revision when it knows it, so a woken waiter decides without
reading the store again (on PostgreSQL that read would cost each waiter a round trip of the
read barrier); only a notification without one (a reload of the whole copy) makes the
waiters look.

A waiter never polls. One catch-up task (:meth:`ChangeNotifier.catch_up`) reads, every
``poll_interval``, the newest revision of each server that has waiters (one read per server,
not per waiter) and wakes a server's waiters when it moved without a notification: changes
the store could not announce (the PostgreSQL follower lost the database and caught up) are
then answered within a second. It costs one in-memory read per server with waiters per
interval, whatever the number of waiters.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping

from epochsvc.service.store.base import EpochStore, StoreUnavailable

log = logging.getLogger("epochsvc.longpoll")

Key = tuple[str, str]

#: Waiters resumed per turn of the event loop when one change wakes many. Between turns the
#: loop reads its sockets, so ``/healthz`` and every other request interleave with a wake of
#: thousands instead of queueing behind all of them.
WAKE_BATCH = 256


#: The newest revision of what a key's waiters wait for, and the newest revision there is
#: (a caller's ``since`` above it came from another ledger): for a server's epochs, the
#: server's and the ledger's revisions.
RevisionOf = Callable[[EpochStore, str, str], Awaitable[tuple[int, int]]]


async def epochs_revision(store: EpochStore, namespace: str, server: str) -> tuple[int, int]:
    return await store.server_revision(namespace, server)


#: The newest revisions of many keys at once, for a catch-up pass (None: one read per key).
RevisionsOf = Callable[[EpochStore, list[tuple[str, str]]], Awaitable[dict[tuple[str, str], int]]]


async def ring_revision(store: EpochStore, namespace: str, server: str) -> tuple[int, int]:
    """A server's request-state ring: its revision is its own (0 before it is made)."""
    revision = await store.ring_revision(namespace, server)
    return revision, revision


async def ring_revisions(
    store: EpochStore, keys: list[tuple[str, str]]
) -> dict[tuple[str, str], int]:
    """The rings' revisions live in the database only: one statement per catch-up pass, not
    one per server with waiters."""
    every = await store.ring_revisions()
    return {key: every.get(key, 0) for key in keys}


#: What wakes a waiter: the notification's number and the server's revision it announced
#: (None: not known); None when its wait ran out.
Woken = tuple[int, int | None] | None
#: What a waiter's future resolves with: what woke it, or its answer, made by the wake.
Outcome = Woken | bytes

#: What a held poll answers with, given the number of the notification that woke it and found
#: its server changed (None: it found the change at once, or its wait ran out). A read begun
#: after that notification is what the waiters it woke may share.
Answer = Callable[[int | None], Awaitable[bytes]]


def _resolve(future: asyncio.Future[Outcome], woken: Outcome = None) -> None:
    if not future.done():
        future.set_result(woken)


class _Waiter:
    """One held poll: what its server's wake needs to answer it without resuming it first
    (:meth:`_Wake.fire`), and what its front waits on (:class:`epochsvc.service.held.Waiting`).
    """

    __slots__ = (
        *("answer", "deadline", "future", "held", "key", "left"),
        *("notifier", "share", "since", "store", "wake"),
    )
    #: The wake it is registered with, and its future there: set by each look
    #: (:meth:`ChangeNotifier._look`), the first made as it begins.
    wake: _Wake
    future: asyncio.Future[Outcome]

    def __init__(
        self,
        notifier: ChangeNotifier,
        store: EpochStore,
        key: Key,
        since: int,
        deadline: float,
        answer: Answer,
        share: Hashable,
    ) -> None:
        self.notifier, self.store, self.key, self.since = notifier, store, key, since
        self.deadline, self.answer, self.share = deadline, answer, share
        self.held = False  # counted in ``waiters``: its first look found nothing newer
        self.left = False  # counted out again (by itself, or by the wake that answered it)

    async def wait(self) -> bytes:
        """Its answer: handed over by the wake, or read once it has decided for itself."""
        try:
            result = await self.future
        except BaseException:
            self.abandon()
            raise
        return result if type(result) is bytes else await self.finish(result)

    def finish(self, result: Outcome) -> Awaitable[bytes]:
        """Its answer, once its future resolved with anything but that answer."""
        return self.notifier._finish(self, result)

    def abandon(self) -> None:
        """It stops waiting without an answer (cancelled, or its shared answer failed)."""
        self.notifier._leave(self)


class _Wake:
    """The waiters of one server for its next change; :meth:`fire` resumes them in batches.

    Their deadlines share one loop timer, set for the earliest, instead of one timer each: a
    timer made for every waiter and cancelled at its wake was a tenth of what a wake of
    thousands costs."""

    def __init__(self, notifier: ChangeNotifier, key: Key) -> None:
        self._notifier, self._key = notifier, key
        self._waiters: dict[asyncio.Future[Outcome], _Waiter] = {}  # in arrival order
        self._deadlines: list[tuple[float, int, asyncio.Future[Outcome]]] = []  # a heap
        self._timer: asyncio.TimerHandle | None = None

    def add(self, waiter: _Waiter) -> asyncio.Future[Outcome]:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiters[future] = waiter
        return future

    def expire_at(self, future: asyncio.Future[Outcome], deadline: float) -> None:
        """Resolve ``future`` with None at ``deadline`` (the loop's clock) unless woken first."""
        heapq.heappush(self._deadlines, (deadline, id(future), future))
        if self._timer is None or deadline < self._timer.when():
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(deadline, self._expire)

    def _expire(self) -> None:
        loop = asyncio.get_running_loop()
        now, heap = loop.time(), self._deadlines
        while heap and heap[0][0] <= now:
            _resolve(heapq.heappop(heap)[2])
        self._timer = loop.call_at(heap[0][0], self._expire) if heap else None

    def disarm(self) -> None:
        """A change wakes every waiter: no deadline is left to keep."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deadlines.clear()

    def discard(self, future: asyncio.Future[Outcome]) -> None:
        """A waiter left without being woken (its wait ended): forget it. Its deadline, if
        set, stays until it passes, as a no-op (a waiter leaves so only when cancelled)."""
        future.cancel()
        self._waiters.pop(future, None)

    async def fire(self, change: int, revision: int | None, closed: bool) -> None:
        """Resume every waiter, in batches of :data:`WAKE_BATCH` per loop turn.

        The held waiters this change answers (their server moved past their ``since``, or the
        service is closing) that share an answer (``share``) are handed it here, made once
        for all of them after the notification: one read per change serves every waiter of
        a server, ring loads as much as epoch lists (each ring load read the ring itself, a
        thousand reads per step for a thousand replicas). They are counted out here too, all
        at once, so that each only sends its answer when it resumes. Every other waiter
        resumes with the change's number and revision and decides itself
        (:meth:`_Waiter.finish`)."""
        waiters = list(self._waiters.values())
        self._waiters.clear()
        woken: Woken = (change, revision)
        shared: dict[Hashable, list[_Waiter]] = {}
        decide: list[asyncio.Future[Outcome]] = []
        answered = 0
        for waiter in waiters:
            if (
                waiter.held
                and not waiter.left
                and waiter.share is not None
                and (closed or (revision is not None and revision > waiter.since))
            ):
                waiter.left = True
                answered += 1
                shared.setdefault(waiter.share, []).append(waiter)
            else:
                decide.append(waiter.future)
        if answered:
            self._notifier._count_out(self._key, answered, answered)
        await _in_batches(decide, woken)
        for group in shared.values():
            try:
                body = await group[0].answer(change)
            except asyncio.CancelledError:
                await _in_batches([w.future for w in group], woken)  # they read themselves
                raise
            except Exception as exc:  # each answers it as its own read's failure would be
                for waiter in group:
                    if not waiter.future.done():
                        waiter.future.set_exception(exc)
                continue
            await _in_batches([w.future for w in group], body)


async def _in_batches(futures: list[asyncio.Future[Outcome]], result: Outcome) -> None:
    """Resolve ``futures`` with ``result``, :data:`WAKE_BATCH` per turn of the loop."""
    for start in range(0, len(futures), WAKE_BATCH):
        if start:
            await asyncio.sleep(0)  # one loop turn: let sockets be read
        for future in futures[start : start + WAKE_BATCH]:
            _resolve(future, result)  # one that left cancelled its own


class ChangeNotifier:
    """The waiters of every server for one kind of change: a server's epochs (the default),
    or its request-state ring (``revision_of=ring_revision``), each kind with its own
    notifications so that neither wakes the other's waiters."""

    def __init__(
        self, revision_of: RevisionOf = epochs_revision, revisions_of: RevisionsOf | None = None
    ) -> None:
        self._revision_of = revision_of
        self._revisions_of = revisions_of
        self._events: dict[Key, _Wake] = {}
        self._firing: set[asyncio.Task[None]] = set()
        self._waiting: dict[Key, int] = {}
        self._seen: dict[Key, int] = {}  # the catch-up's last reading, per server
        self.waiters = 0
        self.closed = False
        #: Notifications so far. A read begun once this is ``n`` sees change ``n``: the
        #: writes are committed before they are notified.
        self.changes = 0

    def close(self) -> None:
        """The service is stopping: answer every long poll now, and later ones at once, so
        replicas move to another service replica instead of holding this one open."""
        self.closed = True
        self.notify()

    def notify(self, servers: Mapping[Key, int | None] | None = None) -> None:
        """Wake the current waiters of ``servers``, each with the server's revision if known
        (every waiter when None: a change whose servers are not known, such as a reload of
        the whole copy). Later waiters wait for the next change."""
        self.changes += 1
        changed = dict.fromkeys(self._events) if servers is None else servers
        seen = self._seen
        for key, revision in changed.items():
            if revision is not None and key in seen and revision > seen[key]:
                # Announced: the catch-up's baseline moves to it. Every waiter held now is
                # woken here, and a look after this sees at least ``revision`` (the write is
                # committed before it is notified), so a later unannounced change is still
                # above the baseline. Left behind, the next pass "found" this change again
                # and woke every replica that had polled again since, for nothing.
                seen[key] = revision
            wake = self._events.pop(key, None)
            if wake is not None:
                wake.disarm()
                task = asyncio.get_running_loop().create_task(
                    wake.fire(self.changes, revision, self.closed)
                )
                self._firing.add(task)
                task.add_done_callback(self._firing.discard)

    def notify_server(self, namespace: str, server: str, revision: int | None = None) -> None:
        """A write to one server: ``revision`` is the written record's (for a write that
        changed nothing, the record's unchanged one: its waiters wait on)."""
        self.notify({(namespace, server): revision})

    async def catch_up_once(self, store: EpochStore) -> int:
        """One pass of the safety net; returns how many servers it had to wake."""
        woken = 0
        keys = list(self._waiting)
        if self._revisions_of is not None:
            readings = await self._revisions_of(store, keys) if keys else {}
        else:
            readings = {key: (await self._revision_of(store, *key))[0] for key in keys}
        for key, newest in readings.items():
            if self._seen.get(key) != newest:
                if key in self._seen:
                    woken += 1
                    self.notify({key: newest})
                self._seen[key] = newest
        for key in [k for k in self._seen if k not in self._waiting]:
            del self._seen[key]
        return woken

    async def catch_up(self, store: EpochStore, interval: float) -> None:
        """Run :meth:`catch_up_once` every ``interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.catch_up_once(store)
            except StoreUnavailable as exc:  # the next pass tries again; readers see the 503
                log.debug("long-poll catch-up skipped: %s", exc)

    async def begin(
        self,
        store: EpochStore,
        namespace: str,
        server: str,
        since: int,
        wait: float,
        answer: Answer,
        share: Hashable = None,
    ) -> bytes | _Waiter:
        """Hold a poll until a change newer than ``since`` exists for the server, or ``wait``
        passes: its answer at once if the server already moved past ``since``, else the
        registered waiter, whose :meth:`~_Waiter.wait` gives the answer. The answer is
        ``answer(n)``, ``n`` the number of the notification (:attr:`changes`) that woke it
        and found the server changed (None: it found the change at once, or its wait ran
        out).

        Waiters of one server with the same ``share`` (not None) have the same answer for the
        same ``n``: those one notification wakes take one answer, made once by the wake
        (:meth:`_Wake.fire`), with one read begun after that notification
        (:meth:`RenderedLists.after_change`).

        A front that waits on ``waiter.future`` itself, as :meth:`~_Waiter.wait` does, keeps
        no frame of this method while it waits (:class:`epochsvc.service.held.HeldPolls`).
        Either way the poll keeps its place until it is answered, gives up or is cancelled."""
        key = (namespace, server)
        deadline = asyncio.get_running_loop().time() + wait
        waiter = _Waiter(self, store, key, since, deadline, answer, share)
        self._waiting[key] = self._waiting.get(key, 0) + 1
        body = await self._look(waiter, None)
        return waiter if body is None else body

    async def _look(self, waiter: _Waiter, woken_by: int | None) -> bytes | None:
        """Register ``waiter`` with its server's next wake, then look at the server once: the
        answer if it moved past the waiter's ``since`` (or the service is closing), else None
        and the waiter waits on its new future. ``woken_by``: the notification that woke it
        last (its answer's argument should this look find the change)."""
        key = waiter.key
        # Registered before the read: a change between the read and the wait still wakes.
        wake = self._events.get(key)
        if wake is None:
            wake = self._events[key] = _Wake(self, key)
        waiter.wake, waiter.future = wake, wake.add(waiter)
        try:
            newest, ledger = await self._revision_of(waiter.store, *key)
        except BaseException:
            self._leave(waiter)
            raise
        # since > ledger: the caller's copy came from another (replaced) ledger.
        if newest > waiter.since or waiter.since > ledger or self.closed:
            self._leave(waiter)
            return await waiter.answer(woken_by)
        # The catch-up's baseline is what the waiters saw, not its own first reading: a
        # change made between this look and that reading would otherwise become the
        # baseline, and never wake anyone.
        self._seen.setdefault(key, newest)
        if not waiter.held:
            waiter.held = True
            self.waiters += 1
        # Not asyncio.timeout(), whose context and cancellation bookkeeping every one of
        # thousands of waiters would hold.
        wake.expire_at(waiter.future, waiter.deadline)
        return None

    async def _finish(self, waiter: _Waiter, result: Outcome) -> bytes:
        """The rest of a held poll whose future resolved with something other than its
        answer: its wait ran out (None), or a change woke it to decide for itself."""
        while type(result) is not bytes:
            if result is None:  # its wait ran out: the answer is read anyway
                self._leave(waiter)
                return await waiter.answer(None)
            woken_by, revision = result
            if self.closed or (revision is not None and revision > waiter.since):
                self._leave(waiter)
                return await waiter.answer(woken_by)
            # Nothing newer than the caller has (a write that changed nothing), or not known:
            # look again once registered anew, since a change notified before then would find
            # no waiter of this server to wake.
            body = await self._look(waiter, woken_by)
            if body is not None:
                return body
            try:
                result = await waiter.future
            except BaseException:
                self._leave(waiter)
                raise
        return result

    def _leave(self, waiter: _Waiter) -> None:
        """Count ``waiter`` out, once: the wake that answered it may have done so already."""
        if waiter.left:
            return
        waiter.left = True
        waiter.wake.discard(waiter.future)  # a no-op once woken
        self._count_out(waiter.key, 1, int(waiter.held))

    def _count_out(self, key: Key, leaving: int, held: int) -> None:
        """``leaving`` waiters of ``key`` are gone, ``held`` of them counted in ``waiters``."""
        self.waiters -= held
        left = self._waiting[key] - leaving
        if left:
            self._waiting[key] = left
        else:
            del self._waiting[key]
            self._events.pop(key, None)
