"""ASGI middleware that refuses oversized request bodies before anything parses them.

Starlette's own body-limit middleware answers in plain text; this one keeps the API's JSON
error shape for both a declared ``Content-Length`` and a streamed (chunked) body.
"""

from __future__ import annotations

import json

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a streamed body passes the limit; FastAPI lets an
    HTTPException through its body parsing, and the API's handler renders it as JSON."""

    def __init__(self) -> None:
        super().__init__(status_code=413)


def _refusal(limit: int) -> bytes:
    message = f"request bodies are limited to {limit} bytes"
    return json.dumps({"code": "body-too-large", "message": message}).encode()


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self._declared_too_large(scope):
            body = _refusal(self.max_bytes)
            await send(
                {
                    "type": "http.response.start",
                    "status": 413,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        await self.app(scope, counting_receive, send)

    def _declared_too_large(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    return int(value) > self.max_bytes
                except ValueError:
                    return True
        return False
