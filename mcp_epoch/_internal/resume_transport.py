"""The client's HTTP transport: a resumed stream completes or fails; answers get through.

The SDK (mcp 2.3) resumes a call explicitly with one GET and, when that stream ends without
the call's response, neither reconnects nor fails the call: it waits forever. A connect error
on that GET escapes its handler and tears down the whole session instead. This transport wraps
such a GET (the caller marks it with :data:`explicit_resume`) so that both become the SDK's
``SSEError`` (the call fails with ``CONNECTION_CLOSED`` and :class:`EpochClient` resumes again
from the newest cursor): a body that ends before a JSON-RPC response or error has passed, or
breaks. Connect errors of any ``Last-Event-ID`` GET are retried here: the request never reached
a server, so sending it again is safe.

The SDK client also writes its answers to server requests (an elicitation result) and its
notifications one at a time, and when one such POST fails on a broken connection, its writer
dies and takes the session's read side with it: the call's own stream then still receives its
response but can no longer hand it over. Those POSTs carry nothing a second delivery could
harm (a server drops a response for a request it no longer waits on), so this transport
retries them on a new connection. A POST of a request is never retried here: it could run a
tool twice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextvars import ContextVar

import anyio
import httpx2

log = logging.getLogger(__name__)

explicit_resume: ContextVar[bool] = ContextVar("epochsvc_explicit_resume", default=False)
RETRIES = 4


def _is_answer_or_notification(request: httpx2.Request) -> bool:
    """A JSON-RPC response (no ``method``) or notification (no ``id``): safe to send again."""
    try:
        message = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return False
    return isinstance(message, dict) and ("method" not in message or "id" not in message)


def _is_final(data: str) -> bool:
    try:
        message = json.loads(data)
    except ValueError:
        return False
    return isinstance(message, dict) and "method" not in message and "id" in message


class _CompleteOrFail(httpx2.AsyncByteStream):
    """A resumed SSE body that raises ``SSEError`` unless a final message passed through."""

    def __init__(self, inner: httpx2.AsyncByteStream) -> None:
        self._inner = inner
        self._pending = b""
        self._data: list[str] = []
        self.complete = False

    def _scan(self, chunk: bytes) -> None:
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8", "replace")
            if line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))
            elif line == "":
                if self._data and _is_final("\n".join(self._data)):
                    self.complete = True
                self._data = []

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                if not self.complete:
                    self._scan(chunk)
                yield chunk
        except httpx2.SSEError:
            raise
        except httpx2.TransportError as exc:
            if not self.complete:
                raise httpx2.SSEError(f"resumed stream broke: {exc!r}") from exc
            raise
        if not self.complete:
            raise httpx2.SSEError("resumed stream ended before the call's response")

    async def aclose(self) -> None:
        await self._inner.aclose()


class ResumeTransport(httpx2.AsyncBaseTransport):
    """Wraps the real transport; see the module docstring."""

    def __init__(self, inner: httpx2.AsyncBaseTransport | None = None) -> None:
        self._inner = inner or httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST" and _is_answer_or_notification(request):
            return await self._send(request, httpx2.TransportError)
        if request.method != "GET" or "last-event-id" not in request.headers:
            return await self._inner.handle_async_request(request)
        response = await self._send(request, httpx2.ConnectError)
        if explicit_resume.get() and response.status_code == 200:
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _CompleteOrFail(response.stream)
        return response

    async def _send(
        self, request: httpx2.Request, retry_on: type[httpx2.TransportError]
    ) -> httpx2.Response:
        backoff = 0.05
        for attempt in range(RETRIES + 1):
            try:
                response = await self._inner.handle_async_request(request)
                if request.method != "POST":
                    return response
                # The answer to an answer is a bodiless 202 (or a short error): read it here,
                # so a connection that breaks before it arrives is retried too.
                body = await response.aread()
                return httpx2.Response(
                    response.status_code,
                    headers=response.headers,
                    content=body,
                    extensions=response.extensions,
                    request=request,
                )
            except retry_on as exc:
                if attempt == RETRIES:
                    raise
                log.debug(
                    "%s %s failed (%r); retrying in %.2fs",
                    request.method,
                    request.url,
                    exc,
                    backoff,
                )
                await anyio.sleep(backoff)
                backoff *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        await self._inner.aclose()
