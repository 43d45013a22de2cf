"""The floor of a loopback hop: the least any proxy on this stack adds to a request.

    python -m bench.passthrough --upstream 127.0.0.1:PORT --port PORT

A bare ASGI app that sends each request on to the upstream and its answer back, byte for byte,
served the way the sidecar is served (uvicorn, uvloop, httptools) and reaching the upstream the
way the sidecar does (the library's kept-alive hop, :mod:`mcp_epoch._internal.upstream`). It
keeps no session, files no event and reads no message: what it adds over reaching the upstream
directly is the extra process on the path (two more loopback writes and reads, two more
wake-ups) and the HTTP work of both ends. ``python -m bench proxy`` measures it in the same run
as the sidecar, so the sidecar's own share of its added latency is read against it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import uvicorn

from mcp_epoch._internal import upstream
from mcp_epoch._internal.forward import HOP_BY_HOP, request_target

_DROPPED = HOP_BY_HOP | {b"content-length", b"host"}


def passthrough_app(address: str) -> Any:
    pool = upstream.Pool(address)
    host = address.encode()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            pool.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        headers = [(b"host", host)]
        headers += [(k, v) for k, v in scope["headers"] if k not in _DROPPED]
        answer = await upstream.exchange(
            address,
            scope["method"],
            request_target(scope),
            headers,
            b"".join(parts),
            connect_timeout=2,
            write_timeout=30,
            pool=pool,
        )
        try:
            head = [(k, v) for k, v in answer.headers if k not in HOP_BY_HOP and k != b"date"]
            await send({"type": "http.response.start", "status": answer.status, "headers": head})
            while (chunk := await answer.chunk()) is not None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            answer.close()

    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.passthrough")
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args(argv)
    print(json.dumps({"port": args.port}), flush=True)
    uvicorn.run(
        passthrough_app(args.upstream),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
    )


if __name__ == "__main__":
    sys.exit(main())
