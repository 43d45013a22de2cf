"""One replica process of either fleet, on the official MCP SDK.

``python -m epochsvc.demo.replica --kind epoch|naive --name r1`` binds a free loopback port and
prints one JSON line (``name``, ``port``, ``epoch``, ``pid``) so its driver learns where it
listens. Both kinds serve the same ``work`` tool; they differ only in what the demo compares:

* ``epoch``: the replica library exactly as the README tells a server to adopt it
  (``mcp_epoch.epoch_safe_app(mcp)``), with the operator-style environment.
* ``sidecar``: the TypeScript SDK server of :mod:`epochsvc.demo.upstream` (no event store)
  behind ``mcp_epoch.sidecar_app`` (what ``mcp-epoch proxy`` serves), the two as one pod: the
  server is this process's child, on a loopback port of its own, and is stopped only once the
  sidecar's drain is over (as a preStop that waits for the drain keeps a pod's main container
  serving).
* ``naive``: :mod:`epochsvc.demo.naive_server`, a model of ordinary servers.

Every kind also serves ``approve``, a tool that asks for input the MCP 2026-07-28 way (a
multi-round-trip request: an input-required result whose ``requestState`` the client echoes in
its retry). ``--request-state ring`` (the default for ``epoch``) seals that state under the
server's ring (``mcp_epoch.request_state_security()``); ``ephemeral`` is the SDK's default, a key
of this process only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, Elicit, MCPServer, Resolve
from pydantic import BaseModel

from epochsvc.demo.checker import REPLICA_HEADER, Token
from mcp_epoch import EpochSafeApp, epoch_safe_app, request_state_security, serve, sidecar_app
from mcp_epoch.contract import READY_PATH

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_MS = 100  # the SSE retry the replicas suggest: clients reconnect 0.1 s after a drop
MCP_PATH = "/mcp"  # the SDK's default streamable_http_path

SERVER_NAME = "mcp-epoch-demo"
REPLICA = {"name": "?"}
#: The sidecar kind's upstream server, stopped once the sidecar has drained.
UPSTREAM: list[subprocess.Popen[str]] = []
PR_SET_PDEATHSIG = 1  # prctl(2)


class Answer(BaseModel):
    token: str


def approval_question(subject: str) -> str:
    """The same on every replica and every round: the SDK asks a question once, and matches
    the answer the state carries to the question asked again."""
    return f"approve {subject}?"


async def ask_approval(subject: str) -> Elicit[Answer]:
    return Elicit(approval_question(subject), Answer)


async def approve(subject: str, answer: Annotated[Answer, Resolve(ask_approval)]) -> str:
    """Ask the client to approve ``subject`` (the 2026-07-28 way: the question goes out in an
    input-required result, the answer comes back in a new request) and name who finished."""
    if answer.token != approval_question(subject):
        raise ValueError(f"the answer to {approval_question(subject)!r} was {answer.token!r}")
    return json.dumps({"subject": subject, "finished_by": REPLICA["name"]})


async def work(
    uid: str,
    call: str,
    steps: int,
    interval: float,
    ask_every: int = 0,
    close_every: int = 0,
    ctx: Context = None,  # type: ignore[assignment]
) -> str:
    """Stream ``steps`` progress notifications; every ``ask_every`` steps ask the client (an
    elicitation the tool awaits); every ``close_every`` steps close the SSE stream (the SDK's
    polling: the client reconnects with ``Last-Event-ID`` to this same process). Every message
    carries a ground-truth token so the client can check what it accepts."""
    name = REPLICA["name"]
    asks = 0
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, Token(uid, call, "step", step, name).encode())
        if ask_every and step % ask_every == 0:
            asks += 1
            asked = Token(uid, call, "ask", asks, name).encode()
            result = await ctx.elicit(asked, Answer)
            data = getattr(result, "data", None)
            if not isinstance(data, Answer) or data.token != asked:
                raise ValueError(f"answer to {asked} was {data!r}")
        if close_every and step % close_every == 0 and step < steps:
            await ctx.close_sse_stream()
        await anyio.sleep(interval)
    return Token(uid, call, "done", steps, name).encode()


class NoStandaloneStream:
    """405 for a GET without ``Last-Event-ID``: the spec's way for a server to say it offers no
    standalone stream. The demo's servers send nothing unsolicited, and without that stream
    every ``Last-Event-ID`` reconnect a client makes belongs to a tool call (which is what the
    client-side checker attributes reconnects to)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "GET" and scope["path"] == MCP_PATH:
            names = {bytes(k).lower() for k, _ in scope["headers"]}
            if b"last-event-id" not in names:
                headers = [(b"allow", b"POST, DELETE"), (b"content-length", b"0")]
                await send({"type": "http.response.start", "status": 405, "headers": headers})
                await send({"type": "http.response.body", "body": b""})
                return
        await self.app(scope, receive, send)


class AlwaysReady:
    """``GET /readyz`` answers 200: the probe of a server without mcp-epoch (uvicorn accepts
    connections only once the app has started, so an answer means it serves)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == READY_PATH:
            body = b'{"ready": true}'
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


class NameEveryAnswer:
    """``X-Demo-Replica: <name>`` on every response this process itself produces (a forward
    carries its owner's): which process really answered, whichever replica the balancer chose."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), REPLICA["name"].encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def named(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if all(bytes(k).lower() != self.header[0] for k, _ in headers):
                    message = {**message, "headers": [*headers, self.header]}
            await send(message)

        await self.app(scope, receive, named)


def make_server(request_state: str) -> MCPServer:
    if request_state == "ring":  # the one line a server adds for multi-round-trip state
        server = MCPServer(SERVER_NAME, request_state_security=request_state_security())
    else:
        server = MCPServer(SERVER_NAME)
    server.tool()(work)
    server.tool()(approve)
    return server


def build(
    kind: str, buffer_events: int, request_state: str | None = None
) -> tuple[ASGIApp, EpochSafeApp | None]:
    """The replica's ASGI app, and the epoch-safe app inside it (None for naive)."""
    if kind == "sidecar":
        # The sidecar as it ships: the TypeScript server names its answers and offers no
        # standalone stream itself, as the Python replicas' wrappers make them do.
        app = sidecar_app(f"127.0.0.1:{start_upstream()}", retry_ms=RETRY_MS)
        return app, app
    mcp = make_server(request_state or ("ring" if kind == "epoch" else "ephemeral"))
    if kind == "epoch":
        app = epoch_safe_app(mcp, retry_interval=RETRY_MS)  # the one line a server adds
        return NoStandaloneStream(NameEveryAnswer(app)), app
    if kind == "sdk":
        from epochsvc.demo.sdk_store import ExampleEventStore

        sdk = mcp.streamable_http_app(event_store=ExampleEventStore(), retry_interval=RETRY_MS)
        return AlwaysReady(NoStandaloneStream(NameEveryAnswer(sdk))), None
    from epochsvc.demo.naive_server import NaiveEventStore, make_naive

    inner = mcp.streamable_http_app(
        event_store=NaiveEventStore(buffer_events), retry_interval=RETRY_MS
    )
    make_naive(mcp.session_manager)
    return AlwaysReady(NoStandaloneStream(NameEveryAnswer(inner))), None


def start_upstream() -> int:
    """Start the TypeScript server (this replica's name in its tokens); its port."""
    from epochsvc.demo import upstream

    proc = subprocess.Popen(
        upstream.command(REPLICA["name"], standalone=False),
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        preexec_fn=_end_with(os.getpid()),
    )
    UPSTREAM.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the TypeScript server exited with {proc.wait()}")
    return int(json.loads(line)["port"])


def _end_with(parent: int) -> Callable[[], None] | None:
    """What the TypeScript server runs before it starts: the kernel sends it SIGTERM when
    this replica dies, however it dies. A replica SIGKILLed at the end of its grace period
    runs no ``finally``, and its server would outlive it. (Linux only: elsewhere, None.)"""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    except (OSError, AttributeError):
        return None

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the replica died before the line above: end now
            os._exit(1)

    return in_child


def stop_upstream() -> None:
    for proc in UPSTREAM:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()


class AnnounceWhenStarted:
    """Print the replica's JSON line once the app's lifespan has started it (its epoch is
    registered then), so the driver never routes to a replica that is not serving yet."""

    def __init__(self, app: ASGIApp, info: Callable[[], dict[str, Any]]) -> None:
        self.app = app
        self.info = info

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def announcing(message: MutableMapping[str, Any]) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete":
                print(json.dumps(self.info()), flush=True)

        await self.app(scope, receive, announcing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("epoch", "sidecar", "naive", "sdk"), required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--buffer-events", type=int, default=3000)
    parser.add_argument(
        "--request-state",
        choices=("ring", "ephemeral"),
        help="what seals multi-round-trip state (default: ring for epoch, else ephemeral)",
    )
    args = parser.parse_args(argv)
    REPLICA["name"] = args.name
    app, epoch_app = build(args.kind, args.buffer_events, args.request_state)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(256)
    port = sock.getsockname()[1]

    def info() -> dict[str, Any]:
        epoch = "" if epoch_app is None else str(epoch_app.epoch)
        return {"name": args.name, "port": port, "epoch": epoch, "pid": os.getpid()}

    announced = AnnounceWhenStarted(app, info)
    options: dict[str, Any] = {"log_level": "warning", "access_log": False}
    if epoch_app is None:  # naive and SDK servers: plain uvicorn, which stops soon after SIGTERM
        uvicorn.Server(
            uvicorn.Config(announced, lifespan="on", timeout_graceful_shutdown=1, **options)
        ).run(sockets=[sock])
        return 0
    try:
        serve(epoch_app, asgi=announced, sockets=[sock], **options)  # drains on SIGTERM
    finally:
        stop_upstream()  # the main container: signalled once the sidecar has drained
    if epoch_app.last_drain is not None:
        print(json.dumps(epoch_app.drain_report()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
