"""Pod epochs issued durably ahead of need, per server, and bound at admission.

An admission used to wait for the epoch service's durable issue; with the machine busy that
wait was ~97% of the operator's admission time. The admission lease's holder (:mod:`.lease`)
keeps a few epochs per server already issued, and an admission takes the lowest. Why each
invariant still holds:

* **never reused:** every pooled epoch was issued by the service, durably, before it is
  handed out, and it is handed out once (popped) by the one process holding the lease;
* **later pods, later generations:** a refill issues part after part, and starts only when
  the previous refill has ended, so every part's generations are above everything pooled
  before it, and an admission takes the lowest left; the lease makes this process the only
  one handing out, and a new tenure starts with an empty pool (refilled above everything
  issued until then);
* **a dry run takes nothing:** the admission never asks for one;
* **unused becomes abandoned:** a pooled epoch is an ordinary ``pending`` epoch. One never
  handed out (dropped at a lease change, or older than ``max_age``) is abandoned by the
  service's sweep like any pending epoch whose pod never appeared;
* **fail closed:** an admission that finds the pool empty waits for the refill, and a
  refill the service refuses or cannot answer fails the admission exactly as before.

``max_age`` keeps a pooled epoch far from the service's pending time limit (10 minutes by
default), so a pod admitted with it is bound long before the sweep could abandon it.

A server's pool starts at ``size``, doubles (up to 16 times ``size``) whenever an admission
finds it empty, and halves when epochs age out unused: a server scaled by hundreds of pods at
once finds enough pooled the next time, and a quiet one keeps few.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from mcp_epoch import api

log = logging.getLogger("mcp_epoch_operator.pool")
Key = tuple[str, str]
#: ``issue(namespace, server, request_uids)``: one durable batch issue (the service's answer:
#: an epoch per UID, lowest generation first).
Issue = Callable[[str, str, list[str]], Awaitable[list[api.Epoch]]]

#: A refill issues at most this many epochs per call, part after part.
PART = api.MAX_ISSUE_BATCH
#: A server's pool grows (doubling whenever an admission found it empty) to at most this many
#: times the configured size.
MAX_GROWTH = 16
#: Request UIDs remembered, so an admission retried with the same UID gets the same epoch
#: (the service's issue is idempotent on it; the pool must be too).
REMEMBERED = 4096


class PoolUnavailable(Exception):
    """This process does not hold the admission lease (any more): nothing may be handed out."""


@dataclass(frozen=True, slots=True)
class Pooled:
    epoch: api.Epoch
    issued_at: float


class EpochPool:
    """Per-server queues of issued epochs, lowest generation first, for one tenure at a time."""

    def __init__(
        self,
        issue: Issue,
        *,
        size: int = 8,
        max_age: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if size < 1:
            raise ValueError("an epoch pool holds at least one epoch")
        self._issue = issue
        self.size = size
        self.max_age = max_age
        self.clock = clock
        self._tenure: int | None = None
        self._queues: dict[Key, deque[Pooled]] = {}
        self._refills: dict[Key, asyncio.Task[None]] = {}
        self._arrivals: dict[Key, asyncio.Future[None]] = {}
        self._targets: dict[Key, int] = {}
        self._filled: set[Key] = set()
        self._given: OrderedDict[str, tuple[Key, api.Epoch]] = OrderedDict()
        #: Admissions that found their pool empty and waited for a refill (a metric).
        self.waits = 0

    def pooled(self, key: Key | None = None) -> int:
        """Epochs pooled for ``key``, or for every server."""
        if key is None:
            return sum(len(q) for q in self._queues.values())
        return len(self._queues.get(key, ()))

    def _begin(self, tenure: int) -> None:
        """A tenure other than the pool's: drop everything (the sweep abandons it)."""
        if tenure == self._tenure:
            return
        dropped = sum(len(q) for q in self._queues.values())
        if dropped:
            log.info("a new admission lease tenure: %d pooled epochs left to be abandoned", dropped)
        for task in self._refills.values():
            task.cancel()
        self._queues.clear()
        self._refills.clear()
        for future in self._arrivals.values():
            if not future.done():
                future.set_result(None)
        self._arrivals.clear()
        self._filled.clear()
        self._tenure = tenure

    async def take(self, key: Key, request_uid: str, tenure: Callable[[], int | None]) -> api.Epoch:
        """The epoch for one admission of ``key``'s pod. ``tenure()`` is the lease's current
        token (None: not held), asked again right before an epoch is popped.

        Raises :class:`PoolUnavailable` when the lease is not held, and what the service's
        issue raised when a needed refill failed."""
        given = self._given.get(request_uid)
        if given is not None and given[0] == key:
            return given[1]
        while True:
            current = tenure()
            if current is None:
                raise PoolUnavailable("this operator process does not hold the admission lease")
            self._begin(current)
            queue = self._queues.setdefault(key, deque())
            now = self.clock()
            aged = False
            while queue and now - queue[0].issued_at > self.max_age:
                queue.popleft()  # too close to the pending time limit; the sweep abandons it
                aged = True
            if aged:  # more than this server's admissions needed: keep fewer
                self._targets[key] = max(self.size, self.target(key) // 2)
            if queue:
                epoch = queue.popleft().epoch
                self._remember(request_uid, key, epoch)
                if len(queue) <= self.target(key) // 2:
                    self._refill(key)
                return epoch
            self.waits += 1
            if key in self._filled and not aged:
                # Found empty after a fill: a burst outran it, so this server keeps twice as
                # many from now on.
                self._targets[key] = min(self.size * MAX_GROWTH, self.target(key) * 2)
                self._filled.discard(key)  # once per fill, not once per waiting admission
            task = self._refill(key)
            arrived = self._arrival(key)
            await asyncio.wait((arrived, task), return_when=asyncio.FIRST_COMPLETED)
            if task.done() and not task.cancelled() and not queue:
                failure = task.exception()
                if failure is not None:
                    raise failure

    def target(self, key: Key) -> int:
        """How many epochs ``key``'s pool is refilled to."""
        return self._targets.get(key, self.size)

    def _remember(self, request_uid: str, key: Key, epoch: api.Epoch) -> None:
        self._given[request_uid] = (key, epoch)
        while len(self._given) > REMEMBERED:
            self._given.popitem(last=False)

    def _arrival(self, key: Key) -> asyncio.Future[None]:
        """Resolved when the next part of ``key``'s refill lands (or the refill ends)."""
        future = self._arrivals.get(key)
        if future is None or future.done():
            future = self._arrivals[key] = asyncio.get_running_loop().create_future()
        return future

    def _arrived(self, key: Key) -> None:
        future = self._arrivals.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    def _refill(self, key: Key) -> asyncio.Task[None]:
        """The refill of ``key`` under way, or a new one: one at a time per server."""
        task = self._refills.get(key)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._fill(key, self._tenure))
            task.add_done_callback(_retrieved)
            task.add_done_callback(lambda _: self._arrived(key))
            self._refills[key] = task
        return task

    async def _fill(self, key: Key, tenure: int | None) -> None:
        """Issue up to the server's target, one batch call per part (admissions waiting go on
        as each part lands)."""
        namespace, server = key
        issued_any = False
        while tenure == self._tenure:
            missing = self.target(key) - len(self._queues.get(key, ()))
            if missing <= 0:
                return
            uids = [f"pool-{secrets.token_hex(12)}" for _ in range(min(missing, PART))]
            try:
                answer = await self._issue(namespace, server, uids)
            except Exception:
                if issued_any:
                    return  # what was issued is pooled; the next take tries again
                raise
            issued_at = self.clock()
            epochs = sorted(answer, key=lambda e: e.generation)
            issued_any = True
            if tenure != self._tenure:
                return  # a new tenure: these are left to be abandoned
            # Above everything pooled before: every part starts after the last one ended.
            self._queues.setdefault(key, deque()).extend(Pooled(e, issued_at) for e in epochs)
            self._filled.add(key)
            self._arrived(key)


def _retrieved(task: asyncio.Task[None]) -> None:
    """A refill nobody waited for failed: say so once (an admission that needs one sees the
    failure itself)."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("an epoch pool refill failed: %s", task.exception())
