"""Held long polls, answered outside the framework's frames.

A long poll is checked like every other request, by the route and the dependencies that define
it: its credentials, its parameters, who may read what. Then it waits, for up to minutes, and
thousands wait at once. Were it held inside the route, each would keep, for all that time,
everything the framework holds while a handler runs: the solved dependencies, the handler's
frame, and a send wrapper per middleware, which every one of thousands of answers then passes
through when one change wakes them (the benchmark's profile found most of the wake's cost
there). So the route returns a :class:`HeldResponse` instead, which leaves itself with
:class:`HeldPolls`, the outermost layer, and the request's framework frames unwind. The front
then waits and answers with the server's own ``send``.

What can go wrong once the poll is held (a store that is down when the list is read) is
answered by the app's own exception handlers, the same ones as for every other request.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

#: The scope key under which :class:`HeldPolls` takes the request's :class:`HeldResponse`.
HOLD = "epochsvc.hold"

Handler = Callable[[Request, Any], Response | Awaitable[Response]]


class HeldResponse(Response):
    """A response whose body is produced only once it is to be sent: how a long poll waits."""

    def __init__(self, body: Callable[[], Awaitable[bytes]], media_type: str) -> None:
        super().__init__(media_type=media_type)
        self._produce = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hold = scope.get(HOLD)
        if hold is not None:
            hold.append(self)  # HeldPolls answers once the framework's frames are gone
            return
        await self.answer(scope, receive, send)

    async def answer(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the body once it is produced: two messages, as a bare ASGI app sends them."""
        body = await self._produce()
        headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        headers.append((b"content-length", b"%d" % len(body)))
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class HeldPolls:
    """Outermost layer: the request runs through the app as always; a :class:`HeldResponse`
    it returned is waited for and answered here. Every middleware inside must be pure ASGI,
    as the service's are (Starlette's ``BaseHTTPMiddleware`` insists the route sends)."""

    def __init__(self, app: ASGIApp, handlers: Mapping[Any, Handler]) -> None:
        self.app = app
        self.handlers = handlers  # the app's exception handlers (filled in before serving)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hold: list[HeldResponse] = []
        scope[HOLD] = hold
        await self.app(scope, receive, send)
        if not hold:
            return
        try:
            await hold[0].answer(scope, receive, send)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = handler(Request(scope, receive), exc)
            if inspect.isawaitable(response):
                response = await response
            await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Handler | None:
        """The handler the app would pick: the nearest class in the exception's ancestry."""
        for cls in type(exc).__mro__:
            if cls in self.handlers:
                return self.handlers[cls]
        return None
