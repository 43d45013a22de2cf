"""The guard benchmark's server: one SDK ``MCPServer`` served three ways, all in this process.

    python -m bench.guard_server

Three ``MCPServer`` instances with the same tool, each on a port of its own, each under its own
``uvicorn.Server`` on the same settings (those ``mcp_epoch.serve`` picks) and the same event
loop:

* ``epoch``: ``mcp_epoch.epoch_safe_app`` (store, guard, live view), with the ``MCP_*``
  environment of a real pod epoch;
* ``noop``: the SDK's own app with an event store that keeps nothing: the SDK's resumability
  path (an event ID per message, a priming event per stream) and nothing of ours;
* ``none``: the SDK's own app with no event store.

One process for the three, not one each: processes of identical code differ by up to 10% in
CPU per call for as long as they live (four no-op processes in one run: 2.08 to 2.21 ms a
call; two in another: 2.16 and 2.31 ms in its first half, 2.12 and 2.28 ms in its second), as
much as the gap being judged, so a ratio between processes was partly a draw of the processes
a run started. Here the three share the process's memory, collector and event loop, and the
benchmark loads one at a time. Once all three listen, everything alive is frozen for the
collector (as ``mcp_epoch.serve`` does for its own process) and the process prints one JSON
line: ``{"ports": {"epoch": P, ...}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventStore
from mcp_types import JSONRPCMessage

import mcp_epoch
from mcp_epoch._internal.serve import freeze_startup_objects

VARIANTS = ("none", "noop", "epoch")
#: What ``mcp_epoch.serve`` sets at this log level, for every variant: uvicorn's own defaults
#: (an access-log line built per request, a proxy-headers layer) would cost the SDK's
#: variants work that the mcp-epoch variant does not do.
OPTIONS: dict[str, Any] = {
    "log_level": "warning",
    "access_log": False,
    "proxy_headers": False,
    "lifespan": "on",
    "timeout_graceful_shutdown": 1,
}


def make_server() -> MCPServer:
    """An SDK server with the benchmark's one tool (each variant has its own: an
    ``MCPServer`` keeps the session manager of the last app it built)."""
    server = MCPServer("guard-bench")

    @server.tool()
    async def work(steps: int, ctx: Context = None) -> str:  # type: ignore[assignment]
        """``steps`` progress notifications, then the answer: no sleeping, the server is the
        cost."""
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps)
        return f"done {steps}"

    return server


class NoopEventStore(EventStore):
    """Mints an event ID per message and keeps nothing (nothing can be replayed)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        return str(next(self._ids))

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> None:
        return None


def build_app(variant: str) -> Any:
    """The ASGI app of one variant, on a server of its own."""
    if variant == "epoch":
        return mcp_epoch.epoch_safe_app(make_server())
    store = NoopEventStore() if variant == "noop" else None
    return make_server().streamable_http_app(event_store=store)


class _Server(uvicorn.Server):
    """A uvicorn server that says when it listens, and leaves the signals to
    :func:`serve_all` (each ``uvicorn.Server`` installs its own handler, and only the last
    one installed would see SIGTERM)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _all_listening(servers: dict[str, _Server]) -> None:
    for server in servers.values():
        await server.listening.wait()


async def serve_all(servers: dict[str, _Server]) -> None:
    """Serve every variant until SIGTERM; print the ports once all of them listen."""
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for server in servers.values():
            server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    tasks = [asyncio.ensure_future(s.serve()) for s in servers.values()]
    listening = asyncio.ensure_future(_all_listening(servers))
    await asyncio.wait([listening, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if not listening.done():  # one of them did not start: no line (the caller reports it)
        listening.cancel()
        stop()
        await asyncio.gather(*tasks)
        return
    freeze_startup_objects()
    ports = {v: s.servers[0].sockets[0].getsockname()[1] for v, s in servers.items()}
    print(json.dumps({"ports": ports}), flush=True)
    await asyncio.gather(*tasks)


def main(argv: list[str] | None = None) -> int:
    del argv
    # Port 0: the system picks a free one, read back once the server listens.
    configs = {
        v: uvicorn.Config(build_app(v), host="127.0.0.1", port=0, **OPTIONS) for v in VARIANTS
    }
    # The event loop uvicorn itself would run (uvloop where installed), as in production.
    with asyncio.Runner(loop_factory=configs["epoch"].get_loop_factory()) as runner:
        runner.run(serve_all({v: _Server(c) for v, c in configs.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
