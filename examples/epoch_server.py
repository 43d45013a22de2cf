"""Example MCP server on the official SDK with epoch-safe resumption.

Adopting the library is three lines on top of an ordinary SDK server::

    store = EpochEventStore.from_env()                       # process epoch, buffer, live view
    app = mcp.streamable_http_app(event_store=store)
    app = ResumptionGuard(app, store)                        # decide before the SDK does

Run: ``python examples/epoch_server.py --port 8000`` (environment: MCP_EPOCH,
MCP_EPOCH_SERVICE_URL, MCP_EPOCH_SERVICE_TOKEN, MCP_SERVER_NAMESPACE, MCP_SERVER_NAME,
MCP_POD_NAME, MCP_POD_UID, MCP_RESUME_BUFFER_EVENTS; all optional).
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

from epochsvc.replica import EpochEventStore, ResumptionGuard

mcp = MCPServer("epoch-example")


@mcp.tool()
async def countdown(n: int, delay: float = 0.05, close_after: int = 0, ctx: Context = None) -> str:  # type: ignore[assignment]
    """Send ``n`` progress notifications ``delay`` seconds apart, then answer.

    ``close_after`` > 0 closes this request's SSE stream after that many notifications, the
    SDK's way of making a client reconnect with ``Last-Event-ID`` (polling).
    """
    for i in range(1, n + 1):
        await ctx.report_progress(i, n, f"step {i}")
        if i == close_after:
            await ctx.close_sse_stream()
        await anyio.sleep(delay)
    return f"done {n}"


@mcp.tool()
async def epoch(ctx: Context = None) -> str:  # type: ignore[assignment]
    """This process's epoch (handy for demos and tests)."""
    return str(STORE.epoch) if STORE is not None else "none"


STORE: EpochEventStore | None = None


def build_app(store: EpochEventStore) -> ResumptionGuard:
    global STORE
    STORE = store
    return ResumptionGuard(mcp.streamable_http_app(event_store=store, retry_interval=100), store)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    store = EpochEventStore.from_env()
    app = build_app(store)
    # One line on stdout so a supervisor (or a test) learns the epoch it got.
    print(
        json.dumps(
            {"epoch": str(store.epoch), "registered": bool(store.start and store.start.registered)}
        ),
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    sys.exit(main())
