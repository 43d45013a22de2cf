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

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from epochsvc.service.errors import Handler, answer_by_handlers

#: The scope key under which :class:`HeldPolls` takes the request's :class:`HeldResponse`.
HOLD = "epochsvc.hold"

#: What a held poll's scope keeps once the framework's frames are gone: the ASGI spec's keys
#: (the server reads some again, for its access log), the app (the error handlers find its
#: routes through it) and the route (the label of its latency). The rest the framework hung
#: on the request (its exit stacks, the endpoint, the path parameters) is let go at hold: freed
#: at the wake instead, it was a third of what thousands of answers cost at once.
_KEPT = frozenset(
    {
        *("type", "asgi", "http_version", "method", "scheme", "path", "raw_path"),
        *("query_string", "root_path", "headers", "client", "server", "state", "extensions"),
        *("app", "route", HOLD),
    }
)


class Waiting(Protocol):
    """A held poll registered to wait (:meth:`epochsvc.service.longpoll.ChangeNotifier.begin`):
    its ``future`` resolves with its answer (bytes), or with what :meth:`finish` turns into
    one."""

    future: asyncio.Future[Any]

    async def wait(self) -> bytes:
        """The answer: the future awaited, then finished, or abandoned if that fails."""

    def finish(self, result: Any) -> Awaitable[bytes]:
        """The answer, for a future that resolved with ``result``, not bytes."""

    def abandon(self) -> None:
        """It stops waiting: the wait failed, or was cancelled."""


#: What a held poll is begun with: its answer at once, or what to wait for.
Begin = Callable[[], Awaitable["bytes | Waiting"]]


class HeldResponse(Response):
    """A response whose body is produced only once it is to be sent: how a long poll waits."""

    def __init__(self, begin: Begin, media_type: str) -> None:
        super().__init__(media_type=media_type)
        self.begin = begin
        # The head but its length, made now, while the request runs, not at the wake.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hold = scope.get(HOLD)
        if hold is not None:
            hold.append(self)  # HeldPolls answers once the framework's frames are gone
            return
        got = await self.begin()
        await self.send_body(got if isinstance(got, bytes) else await got.wait(), send)

    async def send_body(self, body: bytes, send: Send) -> int:
        """Two messages, as a bare ASGI app sends them. Returns the status sent."""
        headers = [*self.raw_headers, (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": self.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return self.status_code


def _keep_only_kept(scope: Scope) -> None:
    """Drop what :data:`_KEPT` does not name. Rebuilt, not emptied key by key: the framework's
    additions grew the table, and a dict never shrinks as its keys are deleted (832 bytes
    kept, where the same keys take 464). The server holds this very dict, so it stays."""
    kept = {k: v for k, v in scope.items() if k in _KEPT}
    scope.clear()
    scope.update(kept)


class HeldPolls:
    """Outermost layer: the request runs through the app as always; a :class:`HeldResponse`
    it returned is waited for and answered here. Every middleware inside must be pure ASGI,
    as the service's are (Starlette's ``BaseHTTPMiddleware`` insists the route sends).

    A held poll's latency is observed here, by ``observe`` (the request's scope, its status,
    when it began), once it is answered: the layers inside returned when it was held."""

    def __init__(
        self,
        app: ASGIApp,
        handlers: Mapping[Any, Handler],
        observe: Callable[[Scope, int, float], None] | None = None,
    ) -> None:
        self.app = app
        self.handlers = handlers  # the app's exception handlers (filled in before serving)
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        hold: list[HeldResponse] = []
        scope[HOLD] = hold
        await self.app(scope, receive, send)
        if not hold:
            return
        _keep_only_kept(scope)
        held = hold[0]
        status = 500
        try:
            got = await held.begin()
            if not isinstance(got, bytes):
                # Waited for here, not in a call of its own (as Waiting.wait does): while it
                # waits, a held poll keeps no frame but this one and the server's. A frame
                # kept is one more to resume, from cold memory, for each of thousands of
                # polls one change wakes.
                try:
                    result = await got.future
                except BaseException:
                    got.abandon()
                    raise
                got = result if type(result) is bytes else await got.finish(result)
            status = await held.send_body(got, send)
        except Exception as exc:
            status = await answer_by_handlers(self.handlers, exc, scope, receive, send)
        finally:
            if self.observe is not None:
                self.observe(scope, status, started)
