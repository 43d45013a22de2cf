"""One request to the wrapped app, in process, as a client would send it over HTTP.

The handoff rebuilds a session through the app's public HTTP surface (``initialize``,
``notifications/initialized``, ``logging/setLevel``), and a drain that ran out of time ends the
sessions it keeps (``DELETE``), so that what they had pending fails at once rather than
stalling the exit. Neither needs a socket, and neither touches an SDK internal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

import anyio

from mcp_epoch._internal.guard import PROTOCOL_HEADER, SESSION_HEADER

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
    Awaitable[None],
]

#: One request (the app answers these at once: no tool runs).
TIMEOUT: Final = 10.0


async def request(
    app: ASGIApp,
    base: Scope,
    method: str,
    path: str,
    host: str | None,
    body: bytes = b"",
    session: str | None = None,
    protocol_version: str | None = None,
) -> tuple[int, dict[bytes, bytes], bytes]:
    """(status, headers, body) of one request to ``app``, read to its end. ``base`` is a
    scope the server gave a real request (its server, ASGI and lifespan-state keys are kept).
    Raises ``TimeoutError`` after :data:`TIMEOUT` seconds."""
    headers = [
        (b"host", (host or "localhost").encode("latin-1")),
        (b"accept", b"application/json, text/event-stream"),
    ]
    if body:
        headers += [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
    if session is not None:
        headers.append((SESSION_HEADER, session.encode("latin-1")))
    if protocol_version is not None:
        headers.append((PROTOCOL_HEADER, protocol_version.encode("latin-1")))
    scope = dict(
        base,
        method=method,
        path=path,
        raw_path=path.encode("latin-1"),
        query_string=b"",
        headers=headers,
    )
    done = anyio.Event()
    given = False
    status = 0
    answer_headers: dict[bytes, bytes] = {}
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
            answer_headers.update((bytes(k).lower(), bytes(v)) for k, v in message["headers"])
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                done.set()

    try:
        with anyio.fail_after(TIMEOUT):
            await app(scope, receive, send)
    finally:
        done.set()
    return status, answer_headers, b"".join(chunks)
