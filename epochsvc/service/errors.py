"""One JSON error shape, ``{"code", "message"}``, for everything the API refuses.

Callers get a stable ``code`` they can branch on; nothing a caller sends may produce a 500.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from epochsvc.service.lifecycle import LifecycleError
from epochsvc.service.store.base import RequestConflict, StoreUnavailable, UnknownEpoch

log = logging.getLogger("epochsvc.api")


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def error_response(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status, headers=headers)


Handler = Callable[[Request, Any], Response | Awaitable[Response]]


async def answer_by_handlers(
    handlers: Mapping[Any, Handler], exc: Exception, scope: Scope, receive: Receive, send: Send
) -> int:
    """Answer ``exc`` as the app would: with the handler of the nearest class in its ancestry.
    For what is answered outside the framework's frames (held polls, the lean issue path), so
    that every error still has the one answer its handler gives. Re-raises ``exc`` when no
    handler takes it. Returns the status sent."""
    for cls in type(exc).__mro__:
        handler = handlers.get(cls)
        if handler is not None:
            break
    else:
        raise exc
    response = handler(Request(scope, receive), exc)
    if inspect.isawaitable(response):
        response = await response
    await response(scope, receive, send)
    return response.status_code


_HTTP_CODES = {
    404: "not-found",
    405: "method-not-allowed",
    413: "body-too-large",
    415: "unsupported-media-type",
}


def _allowed(app: FastAPI, request: Request) -> str:
    """Every method the request's path takes, over all the routes of that path: Starlette's
    own 405 names only the first route's (a server's epochs are a GET and a POST route)."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


class _OutageLog:
    """The 503s of a store outage, logged as one line when it starts and then at most one
    summary per :attr:`every` seconds (a PostgreSQL crash under load answered ~350 requests
    503, one WARNING line each)."""

    every = 10.0

    def __init__(self) -> None:
        self._last = -math.inf
        self._since = 0

    def refused(self, exc: StoreUnavailable) -> None:
        now = time.monotonic()
        self._since += 1
        if now - self._last >= self.every:
            more = f" ({self._since - 1} more 503s since the last line)" if self._since > 1 else ""
            log.warning("store unavailable: %s; answering 503%s", exc, more)
            self._last, self._since = now, 0


def install_error_handlers(app: FastAPI, on_store_down: Callable[[], None] | None = None) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid-request", _describe(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 413:
            limit = app.state.settings.max_body_bytes
            return error_response(
                413, "body-too-large", f"request bodies are limited to {limit} bytes"
            )
        if exc.status_code == 400:
            # FastAPI's only 400: a body it could not decode (not UTF-8). That is the same
            # fault as truncated JSON, so it gets the same answer.
            return error_response(
                422, "invalid-request", "the body is not JSON: send UTF-8 encoded JSON"
            )
        code = _HTTP_CODES.get(exc.status_code, f"http-{exc.status_code}")
        headers = exc.headers
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": _allowed(app, request)}
        return error_response(exc.status_code, code, str(exc.detail), headers)

    @app.exception_handler(UnknownEpoch)
    async def _unknown(_: Request, exc: UnknownEpoch) -> JSONResponse:
        return error_response(404, "unknown-epoch", f"epoch {exc} was never issued by this ledger")

    @app.exception_handler(LifecycleError)
    async def _lifecycle(_: Request, exc: LifecycleError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.code == "not-bound" else None
        return error_response(exc.status, exc.code, exc.message, headers)

    @app.exception_handler(RequestConflict)
    async def _conflict(_: Request, exc: RequestConflict) -> JSONResponse:
        return error_response(409, "request-conflict", str(exc))

    outage = _OutageLog()

    @app.exception_handler(StoreUnavailable)
    async def _store_down(_: Request, exc: StoreUnavailable) -> JSONResponse:
        outage.refused(exc)
        if on_store_down is not None:
            on_store_down()
        return error_response(
            503,
            "store-unavailable",
            "the ledger database is unavailable; retry shortly",
            {"Retry-After": "1"},
        )

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return error_response(500, "internal", "internal error; see the service log")
