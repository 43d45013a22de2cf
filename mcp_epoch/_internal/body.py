"""A request body read whole, within a bound: MCP POST bodies are single JSON-RPC messages.

The guard reads a POST's body, or a forwarded request's, once and before deciding anything: its
calls count for the drain, a forward sends it in one write with its length, and a new session
a peer does not take is served here with the same bytes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

#: Larger POST bodies get 413; an MCP message is far smaller (the SDK sets no limit itself).
MAX_BODY_BYTES: Final = 4 * 1024 * 1024


class BodyTooLarge(Exception):
    """The body is over :data:`MAX_BODY_BYTES`; nothing of it is kept."""


async def read_body(receive: Receive, limit: int = MAX_BODY_BYTES) -> tuple[bytes, Message | None]:
    """The body, and the message that ended it early (a disconnect), or None when it
    arrived whole. Raises :class:`BodyTooLarge` past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), None
