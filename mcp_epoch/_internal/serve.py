"""``mcp_epoch.serve(app)``: uvicorn, with SIGTERM meaning "drain, then exit".

Plain uvicorn stops listening the moment SIGTERM arrives, and then its other replicas can no
longer forward this process's sessions to it. Here SIGTERM (or Ctrl-C) starts
:meth:`EpochSafeApp.drain` and the server keeps listening until the calls in flight (and the
requests it forwards) are delivered or the drain deadline passes; then it stops accepting,
waits for what it accepted meanwhile, and only then does uvicorn shut down. A second signal
exits at once. This module imports ``uvicorn`` (a dependency of the MCP SDK).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import struct
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from mcp_epoch._internal.app import DrainResult, EpochSafeApp
from mcp_epoch._internal.guard import ASGIApp
from mcp_epoch._internal.unfinished import UNFINISHED

log = logging.getLogger("mcp_epoch")


class DrainingServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose first exit signal drains ``epoch_app`` before stopping."""

    def __init__(
        self,
        config: uvicorn.Config,
        epoch_app: EpochSafeApp,
        on_started: Callable[[EpochSafeApp], None] | None = None,
        *,
        freeze: bool = False,
    ) -> None:
        super().__init__(config)
        self.epoch_app = epoch_app
        self.on_started = on_started
        self.freeze = freeze  # the process is this server's: see freeze_startup_objects
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        self._drained: asyncio.Future[DrainResult] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await super().serve(sockets)
        finally:
            cut = UNFINISHED.exited()
        if cut:
            log.info("exit cut %d open streams; their clients resume elsewhere", cut)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.freeze:
            freeze_startup_objects()
        if isinstance(self.epoch_app, EpochSafeApp):
            self.epoch_app.drain_trigger = self.drain_now  # a drain request drains as we do
        if self.started and self.on_started is not None:
            self.on_started(self.epoch_app)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._drain is not None or not self.started:
            super().handle_exit(sig, frame)  # not serving yet, or a second signal: stop now
            if self._drain is not None:
                self.force_exit = True
            return
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        if self._drain is None:
            self._start_drain()  # in this callback: the drain is the next thing to run
            self._drain = asyncio.ensure_future(self._drain_then_exit())

    def _start_drain(self) -> asyncio.Future[DrainResult]:
        if self._drained is None:
            drain = self.epoch_app.drain(stop_accepting=self._stop_accepting)
            self._drained = asyncio.ensure_future(drain)
        return self._drained

    async def drain_now(self) -> DrainResult:
        """Drain once (a drain request, or the exit signal): the calls in flight delivered,
        the sessions handed on, the listener closed. Later callers wait for the same drain."""
        return await asyncio.shield(self._start_drain())

    async def _drain_then_exit(self) -> None:
        try:
            await self.drain_now()
        finally:
            UNFINISHED.exiting()  # what is still open now is cut by the exit, on purpose
            self.should_exit = True

    def _stop_accepting(self) -> None:
        """Close the listener and every idle connection, as uvicorn's own shutdown does first,
        but before the drain's last wait: whatever was accepted until now is then waited for,
        and nothing can arrive after it (busy connections close after their answer).

        A connection that has not sent a request yet is reset, not closed: its request may be
        on its way, and a reset tells the sender (a peer forwarding to this process) that it
        was never read, where a clean close would leave "did it run?" unanswerable. The
        kernel resets the connections still in the listen queue the same way. Nothing was
        ever written on such a connection, so the reset discards no answer."""
        for server in self.servers:
            server.close()
        for connection in list(self.server_state.connections):
            if getattr(connection, "cycle", False) is None:  # no request began on it
                _reset_on_close(getattr(connection, "transport", None))
            connection.shutdown()


#: Log levels at which uvicorn prints its access log.
_ACCESS_LEVELS = frozenset({"trace", "debug", "info"})


def freeze_startup_objects() -> None:
    """Move everything alive once the server has started (modules, classes, the SDK's and
    pydantic's schemas: ~100,000 objects in an SDK server) out of the cyclic collector's sight.
    Each full collection walked all of them, 60-80 ms with every request waiting, a few times a
    minute under load; frozen, it walks what requests create (~15 ms). They are still freed by
    reference counting; only a cycle among them that becomes garbage later is never
    reclaimed, a bounded one-time cost (the standard library's ``gc.freeze`` trade-off)."""
    gc.collect()
    gc.freeze()


def _reset_on_close(transport: asyncio.BaseTransport | None) -> None:
    """Make the closing of ``transport`` a TCP reset (SO_LINGER 0), if it is a socket's."""
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is not None and sock.fileno() >= 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def serve(
    app: EpochSafeApp,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    asgi: ASGIApp | None = None,
    sockets: list[socket.socket] | None = None,
    on_started: Callable[[EpochSafeApp], None] | None = None,
    **options: Any,
) -> None:
    """Serve ``app`` (or ``asgi``, an app wrapping it) until a signal, draining on the first.

    ``on_started(app)`` runs once the app has its epoch and the server listens (to announce
    it to a supervisor, say). ``options`` go to ``uvicorn.Config``; a short
    ``timeout_graceful_shutdown`` is the default, since by then the calls are done and only
    idle streams remain.
    """
    options.setdefault("timeout_graceful_shutdown", 1)
    options.setdefault("lifespan", "on")
    # The client address a hand-on is checked against is the connection's own: never one a
    # header names (uvicorn trusts X-Forwarded-For from loopback by default, and in a pod
    # loopback is the MCP server beside a sidecar). It also takes a layer off every request.
    options.setdefault("proxy_headers", False)
    # uvicorn builds each access-log line (the client's address, the quoted path) before its
    # logger drops it; below INFO nothing is printed, so nothing is built.
    level = options.get("log_level")
    options.setdefault("access_log", level is None or str(level).lower() in _ACCESS_LEVELS)
    config = uvicorn.Config(asgi if asgi is not None else app, host=host, port=port, **options)
    DrainingServer(config, app, on_started, freeze=True).run(sockets=sockets)
