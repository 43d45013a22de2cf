"""Responses left unfinished on purpose are not errors in uvicorn's log.

uvicorn logs ``ASGI callable returned without completing response.`` at ERROR for every
response an app ends without its last chunk while the client is still connected, and closes
the connection. That is the right signal for a bug. But mcp-epoch ends some streams so on
purpose, because a cut stream is what makes its client resume from the last event it really
got:

* a stream relayed from an owner that went away mid-answer (a drop, passed on as one);
* the streams a draining process cuts once its calls are delivered (its forwarded open-ended
  streams, and the SDK's own streams, which end as the server exits);
* the streams of the sessions a drain that ran out of time ends (cut rather than ended, so
  their clients come back and are told the session is gone, instead of waiting).

One rolling deploy of three replicas logged 88 such ERRORs, which would page whoever alerts
on ERROR. :data:`UNFINISHED` drops the line for exactly those responses: one the forwarder
marks (:meth:`UnfinishedOnPurpose.expect`, in the task that uvicorn logs from), and every one
after the drain has ended (:meth:`UnfinishedOnPurpose.exiting`), which :func:`mcp_epoch.serve`
then reports in one INFO line. Any other unfinished response is still logged at ERROR.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

#: uvicorn's message, the same in each of its HTTP protocols.
MESSAGE = "ASGI callable returned without completing response."
UVICORN_LOGGER = "uvicorn.error"


class UnfinishedOnPurpose(logging.Filter):
    """A filter on uvicorn's error logger that drops the unfinished-response line for the
    responses this process ended without their last chunk on purpose."""

    def __init__(self) -> None:
        super().__init__()
        self._expected: weakref.WeakSet[asyncio.Task[object]] = weakref.WeakSet()
        self._exiting = False
        self.at_exit = 0

    def expect(self, task: asyncio.Task[object] | None = None) -> None:
        """The response of ``task`` (default: the running task) ends unfinished on purpose.
        uvicorn logs from the task that ran the app; a task that never logs (its client left
        first) is forgotten with it."""
        task = task or asyncio.current_task()
        if task is not None:
            self._expected.add(task)

    def exiting(self) -> None:
        """The drain has ended: every response still open is cut by the exit itself."""
        self._exiting = True

    def exited(self) -> int:
        """The server has stopped: how many lines :meth:`exiting` dropped (and no more)."""
        dropped, self.at_exit, self._exiting = self.at_exit, 0, False
        return dropped

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != MESSAGE:
            return True
        if self._exiting:
            self.at_exit += 1
            return False
        try:
            task = asyncio.current_task()
        except RuntimeError:  # logged outside an event loop
            return True
        if task is not None and task in self._expected:
            self._expected.discard(task)
            return False
        return True


#: The one filter of this process (installed by :func:`install`).
UNFINISHED = UnfinishedOnPurpose()


def install() -> None:
    """Put :data:`UNFINISHED` on uvicorn's error logger (once)."""
    logger = logging.getLogger(UVICORN_LOGGER)
    if UNFINISHED not in logger.filters:
        logger.addFilter(UNFINISHED)
