"""Example MCP server on the official SDK with epoch-safe resumption.

Adopting the library is one line on top of an ordinary SDK server::

    app = mcp_epoch.epoch_safe_app(mcp)   # instead of mcp.streamable_http_app()

Run: ``python examples/epoch_server.py --port 8000`` (environment: MCP_EPOCH,
MCP_EPOCH_SERVICE_URL, MCP_EPOCH_SERVICE_TOKEN, MCP_SERVER_NAMESPACE, MCP_SERVER_NAME,
MCP_POD_NAME, MCP_POD_UID, MCP_RESUME_BUFFER_EVENTS, MCP_EPOCH_DRAIN_SECONDS; all optional).
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel

import mcp_epoch

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


class Confirmation(BaseModel):
    ok: bool


@mcp.tool()
async def confirm(question: str, ctx: Context = None) -> str:  # type: ignore[assignment]
    """Ask the client ``question`` (an elicitation the tool waits for) and say what it answered."""
    result = await ctx.elicit(question, Confirmation)
    return f"{result.action}: {getattr(result, 'data', None)}"


app = mcp_epoch.epoch_safe_app(mcp, retry_interval=100)


@mcp.tool()
async def epoch(ctx: Context = None) -> str:  # type: ignore[assignment]
    """This process's epoch (handy for demos and tests)."""
    return str(app.epoch)


def announce(app: mcp_epoch.EpochSafeApp) -> None:
    """One JSON line once serving: the epoch this process got (a supervisor or a test reads it)."""
    start = app.process_start
    info = {"epoch": str(app.epoch), "registered": bool(start and start.registered)}
    print(json.dumps(info), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    # uvicorn underneath; SIGTERM drains (the calls in flight finish) before the process exits.
    mcp_epoch.serve(app, host=args.host, port=args.port, on_started=announce, log_level="warning")


if __name__ == "__main__":
    sys.exit(main())
