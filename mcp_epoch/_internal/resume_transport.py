"""The client's HTTP transport for resumptions: a resumed stream either completes or fails.

The SDK (mcp 2.3) resumes a call explicitly with one GET and, when that stream ends without
the call's response, neither reconnects nor fails the call: it waits forever. A connect error
on that GET escapes its handler and tears down the whole session instead. This transport wraps
such a GET (the caller marks it with :data:`explicit_resume`) so that both become the SDK's
``SSEError`` (the call fails with ``CONNECTION_CLOSED`` and :class:`EpochClient` resumes again
from the newest cursor): a body that ends before a JSON-RPC response or error has passed, or
breaks. Connect errors of any ``Last-Event-ID`` GET are retried here: the request never reached
a server, so sending it again is safe.
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
CONNECT_RETRIES = 4


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
        if request.method != "GET" or "last-event-id" not in request.headers:
            return await self._inner.handle_async_request(request)
        backoff = 0.05
        for attempt in range(CONNECT_RETRIES + 1):
            try:
                response = await self._inner.handle_async_request(request)
                break
            except httpx2.ConnectError:
                if attempt == CONNECT_RETRIES:
                    raise
                log.debug("resumption connect failed; retrying in %.2fs", backoff)
                await anyio.sleep(backoff)
                backoff *= 2
        if explicit_resume.get() and response.status_code == 200:
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _CompleteOrFail(response.stream)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()
