"""Linearizable reads from the in-memory copy, when several processes share PostgreSQL.

A process's copy learns another process's commits from its follower, a moment after they
commit. Answering from the copy alone would let a client that drained an epoch through one
process read it as live through another a moment later (the robustness suite's histories
caught exactly that). So before a read is answered from the copy, the database's current
revision is read (one small query, ``SELECT revision``): the copy may answer only if it holds
that revision, and otherwise the read goes to the database. This is etcd's "read index"
applied to a follower copy.

The revision query is shared: every read that arrives before a query *begins* waits for that
query, and a read arriving once it has begun waits for the next one, so a read never relies on
a revision read before the read itself began.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class RevisionBarrier:
    def __init__(self, read_revision: Callable[[], Awaitable[int]]) -> None:
        self._read_revision = read_revision
        self._next: asyncio.Future[int] | None = None  # the query not yet begun

    async def revision(self) -> int:
        """The database's revision, read by a query that began after this call."""
        fut = self._next
        if fut is None:
            fut = self._next = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(self._begin, fut)
        return await asyncio.shield(fut)

    def _begin(self, fut: asyncio.Future[int]) -> None:
        self._next = None  # whoever comes now needs a query that begins after them
        task = asyncio.ensure_future(self._read_revision())

        def done(t: asyncio.Task[int]) -> None:
            if fut.cancelled():
                return
            if t.cancelled():
                fut.cancel()
            elif (exc := t.exception()) is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(t.result())

        task.add_done_callback(done)
