"""Pod epochs issued durably ahead of need, per server, and bound at admission.

An admission used to wait for the epoch service's durable issue; with the machine busy that
wait was ~97% of the operator's admission time. The admission lease's holder (:mod:`.lease`)
keeps a few epochs per server already issued, and an admission takes the lowest. Why each
invariant still holds:

* **never reused:** every pooled epoch was issued by the service, durably, before it is
  handed out, and it is handed out once (popped) by the one process holding the lease;
* **later pods, later generations:** a refill starts only when the previous one has ended,
  so every refill's generations are above everything pooled before it, and an admission
  takes the lowest left; the lease makes this process the only one handing out, and a new
  tenure starts with an empty pool (refilled above everything issued until then);
* **a dry run takes nothing:** the admission never asks for one;
* **unused becomes abandoned:** a pooled epoch is an ordinary ``pending`` epoch. One never
  handed out (dropped at a lease change, or older than ``max_age``) is abandoned by the
  service's sweep like any pending epoch whose pod never appeared;
* **fail closed:** an admission that finds the pool empty waits for the refill, and a
  refill the service refuses or cannot answer fails the admission exactly as before.

``max_age`` keeps a pooled epoch far from the service's pending time limit (10 minutes by
default), so a pod admitted with it is bound long before the sweep could abandon it.
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
#: ``issue(namespace, server, request_uid)``: one durable issue (the service's answer).
Issue = Callable[[str, str, str], Awaitable[api.Epoch]]

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
        self._given: OrderedDict[str, tuple[Key, api.Epoch]] = OrderedDict()
        #: Epochs issued into the pool and handed out, for the metrics.
        self.issued = 0
        self.handed_out = 0

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
            while queue and now - queue[0].issued_at > self.max_age:
                queue.popleft()  # too close to the pending time limit; the sweep abandons it
            if queue:
                epoch = queue.popleft().epoch
                self.handed_out += 1
                self._remember(request_uid, key, epoch)
                if len(queue) <= self.size // 2:
                    self._refill(key)
                return epoch
            await asyncio.shield(self._refill(key))

    def _remember(self, request_uid: str, key: Key, epoch: api.Epoch) -> None:
        self._given[request_uid] = (key, epoch)
        while len(self._given) > REMEMBERED:
            self._given.popitem(last=False)

    def _refill(self, key: Key) -> asyncio.Task[None]:
        """The refill of ``key`` under way, or a new one: one at a time per server."""
        task = self._refills.get(key)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._fill(key, self._tenure))
            task.add_done_callback(_retrieved)
            self._refills[key] = task
        return task

    async def _fill(self, key: Key, tenure: int | None) -> None:
        namespace, server = key
        uids = [f"pool-{secrets.token_hex(12)}" for _ in range(self.size)]
        answers = await asyncio.gather(
            *(self._issue(namespace, server, uid) for uid in uids), return_exceptions=True
        )
        issued_at = self.clock()
        epochs = sorted(
            (a for a in answers if isinstance(a, api.Epoch)), key=lambda e: e.generation
        )
        self.issued += len(epochs)
        if tenure == self._tenure and epochs:
            # Above everything pooled before: this refill started after the last one ended.
            self._queues.setdefault(key, deque()).extend(Pooled(e, issued_at) for e in epochs)
        if not epochs:
            failure = next(a for a in answers if isinstance(a, BaseException))
            raise failure


def _retrieved(task: asyncio.Task[None]) -> None:
    """A refill nobody waited for failed: say so once (an admission that needs one sees the
    failure itself)."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("an epoch pool refill failed: %s", task.exception())
