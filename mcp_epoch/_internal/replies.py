"""The answers the data plane gives itself, in place of the app behind it: JSON errors, and
the rejection that tells a client to start a new session."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any, Final

from mcp_epoch._internal.errors import Reason
from mcp_epoch.contract import REJECTED_HEADER

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
INVALID_REQUEST: Final = -32600

RequestId = str | int | None


def error_body(
    message: str,
    data: dict[str, Any] | None = None,
    code: int = INVALID_REQUEST,
    request_id: RequestId = None,
) -> bytes:
    """A JSON-RPC error: what the data plane answers instead of the app. It echoes the request's id
    whenever the guard knows it: a client that cannot match an error to its request (the Go
    SDK client cannot decode a null id) fails the whole session instead of that one call."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()


async def respond(
    send: Send, status: int, body: bytes, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """A complete JSON answer, sent by the data plane itself."""
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"cache-control", b"no-store"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_rejection(
    send: Send, reason: Reason, detail: str = "", request_id: RequestId = None
) -> None:
    """404 + ``Mcp-Resumption-Rejected``: the client must start a fresh session."""
    data = {"reason": reason, **({"detail": detail} if detail else {})}
    body = error_body(
        f"Resumption rejected ({reason}): start a new session", data, request_id=request_id
    )
    await respond(send, 404, body, [(REJECTED_HEADER.encode(), reason.encode())])
