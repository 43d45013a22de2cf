"""The guard benchmark's server: one SDK ``MCPServer`` served three ways (one process each).

    python -m bench.guard_server --store epoch|noop|none --port P

* ``epoch``: ``mcp_epoch.epoch_safe_app`` (store, guard, live view), with the ``MCP_*``
  environment of a real pod epoch;
* ``noop``: the SDK's own app with an event store that keeps nothing: the SDK's resumability
  path (an event ID per message, a priming event per stream) and nothing of ours;
* ``none``: the SDK's own app with no event store.

Every variant runs on the same uvicorn settings (those ``mcp_epoch.serve`` picks) and the same
garbage collection (``mcp_epoch.serve`` freezes the startup objects; the SDK's variants do it
too). It prints one JSON line once it listens.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventStore
from mcp_types import JSONRPCMessage

import mcp_epoch
from bench.servers import run_announcing

mcp = MCPServer("guard-bench")


@mcp.tool()
async def work(steps: int, ctx: Context = None) -> str:  # type: ignore[assignment]
    """``steps`` progress notifications, then the answer: no sleeping, the server is the cost."""
    for i in range(1, steps + 1):
        await ctx.report_progress(i, steps)
    return f"done {steps}"


class NoopEventStore(EventStore):
    """Mints an event ID per message and keeps nothing (nothing can be replayed)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        return str(next(self._ids))

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.guard_server")
    ap.add_argument("--store", choices=("epoch", "noop", "none"), required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    # What ``mcp_epoch.serve`` sets at this log level, given to every variant: uvicorn's own
    # defaults (an access-log line built per request, a proxy-headers layer) would cost the
    # SDK's variants work that the mcp-epoch variant does not do.
    options = {
        "host": "127.0.0.1",
        "port": args.port,
        "log_level": "warning",
        "access_log": False,
        "proxy_headers": False,
    }

    def announce(_app: object = None) -> None:
        print(json.dumps({"store": args.store, "port": args.port}), flush=True)

    if args.store == "epoch":
        mcp_epoch.serve(mcp_epoch.epoch_safe_app(mcp), on_started=announce, **options)
        return 0
    store = NoopEventStore() if args.store == "noop" else None
    server = uvicorn.Server(uvicorn.Config(mcp.streamable_http_app(event_store=store), **options))
    run_announcing(server, announce, as_mcp_epoch_serves=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
