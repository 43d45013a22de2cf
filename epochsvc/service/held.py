"""A response whose body is awaited only as it is sent: how a long poll waits.

A handler that awaited the change itself would keep, for as long as it waits, everything
FastAPI holds while a handler runs: its solved dependencies, their exit stacks, the handler's
own frame. A long poll returns a :class:`HeldResponse` instead, so all of that is released
and each of thousands of held polls keeps only the connection and its middleware frames.
An exception from the body (a store that is down) still reaches the app's exception
handlers, since nothing has been sent by then.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send


class HeldResponse(Response):
    def __init__(self, body: Callable[[], Awaitable[bytes]], media_type: str) -> None:
        super().__init__(media_type=media_type)
        self._produce = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.body = await self._produce()
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.raw_headers.append((b"content-length", str(len(self.body)).encode()))
        await super().__call__(scope, receive, send)
