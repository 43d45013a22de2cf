"""An MCP server on the official Python SDK, unwrapped: ``mcp.streamable_http_app()`` with no
event store and no mcp-epoch, served by plain uvicorn. The demo's tools (``work``,
``approve``) and ``echo``. ``python -m tests.sidecar.py_server --port 0 --name p1`` prints
``{"port", "pid", "name"}`` once it listens."""

from __future__ import annotations

import argparse
import json
import os
import socket

import uvicorn

from epochsvc.demo.replica import REPLICA, make_server


def echo(text: str) -> str:
    """Echo a text."""
    return text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--name", default="py")
    args = parser.parse_args()
    REPLICA["name"] = args.name
    server = make_server("ephemeral")
    server.tool()(echo)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)
    port = sock.getsockname()[1]
    print(json.dumps({"port": port, "pid": os.getpid(), "name": args.name}), flush=True)
    config = uvicorn.Config(
        server.streamable_http_app(), log_level="warning", timeout_graceful_shutdown=1
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
