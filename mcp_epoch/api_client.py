"""The one client of the epoch service: it sends the :class:`~mcp_epoch.api.Call` values of
:mod:`mcp_epoch.api` and parses the answers with the models the service wrote them with.

Errors come in two kinds, because callers act differently on them: :class:`EpochServiceError`
is the service saying no (a stable ``code`` from its error body, such as ``not-bound`` or
``conflict``), :class:`EpochServiceUnavailable` is the service not answering (retry later).
:class:`EpochServiceClient` (async; the operator, the replica's live view and start, the demo)
retries unavailability within a :class:`RetryPolicy`; :class:`SyncEpochServiceClient` (tests,
scripts) makes one attempt. Both ask for the bearer token before every request: a projected
ServiceAccount token is rotated in its file by the kubelet, so a copy read at start expires.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from mcp_epoch.api import Call, ErrorBody

T = TypeVar("T", bound=BaseModel)
#: A static token, a function returning the current one (None: send none), or None.
Token = str | Callable[[], str | None] | None

#: The statuses that mean "not now" rather than "no" (503: the store is unavailable).
RETRY_STATUS = frozenset({502, 503, 504})


class EpochServiceUnavailable(Exception):
    """The service could not be reached or did not answer in time (transient)."""


class EpochServiceError(Exception):
    """The service answered with an error: ``code`` from its error body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts within one deadline, with jittered exponential backoff between them."""

    deadline: float = 10.0
    attempt_timeout: float = 3.0
    first_backoff: float = 0.1
    max_backoff: float = 2.0


#: One attempt of at most ``attempt_timeout`` seconds.
ONE_TRY = RetryPolicy(deadline=0.0)


class BearerAuth(httpx.Auth):
    """``Authorization: Bearer`` with the token of the moment."""

    def __init__(self, token: Token) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self._token() if callable(self._token) else self._token
        if token:
            request.headers["Authorization"] = f"Bearer {token}"
        yield request


def error_of(response: httpx.Response) -> EpochServiceError:
    """The service's refusal as an exception (a body that is not its error shape says so)."""
    try:
        body = ErrorBody.model_validate_json(response.content)
    except ValidationError:
        return EpochServiceError(
            response.status_code, "error", response.text[:200] or response.reason_phrase
        )
    return EpochServiceError(response.status_code, body.code, body.message)


def answer_of(call: Call[T], response: httpx.Response) -> T:
    """The typed answer, or the error the response stands for."""
    if response.status_code >= 400:
        error = error_of(response)
        if response.status_code in RETRY_STATUS:
            raise EpochServiceUnavailable(str(error)) from error
        raise error
    try:
        return call.answer.model_validate_json(response.content)
    except ValidationError as exc:
        raise EpochServiceError(
            response.status_code, "bad-answer", f"{call.method} {call.path}: {exc}"
        ) from None


def _client_options(
    base_url: str, token: Token, user_agent: str, timeout: float | httpx.Timeout
) -> dict[str, Any]:
    return {
        "base_url": base_url.rstrip("/"),
        "auth": BearerAuth(token),
        "headers": {"User-Agent": user_agent},
        "timeout": timeout,
    }


def _request(call: Call[Any]) -> dict[str, Any]:
    return {"json": call.json(), "params": list(call.params) or None}


class EpochServiceClient:
    """Async client: one per process and event loop (it pools connections)."""

    def __init__(
        self,
        base_url: str,
        token: Token = None,
        *,
        policy: RetryPolicy = ONE_TRY,
        user_agent: str = "mcp-epoch",
        timeout: float | httpx.Timeout = 3.0,
        verify: Any = True,
        transport: httpx.AsyncBaseTransport | None = None,
        max_idle_connections: int | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.policy = policy
        #: Attempts repeated after an outage answer, since start (a metric for the operator).
        self.retries = 0
        self._http = httpx.AsyncClient(
            **_client_options(base_url, token, user_agent, timeout),
            verify=verify,
            transport=transport,
            limits=(
                httpx.Limits()  # httpx's defaults
                if max_idle_connections is None
                else httpx.Limits(max_keepalive_connections=max_idle_connections)
            ),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> EpochServiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def once(self, call: Call[T], attempt_timeout: float | httpx.Timeout | None = None) -> T:
        """One attempt. Raises :class:`EpochServiceUnavailable` for no answer or a 502-504."""
        options: dict[str, Any] = {} if attempt_timeout is None else {"timeout": attempt_timeout}
        with _outage(attempt_timeout):
            response = await self._http.request(call.method, call.path, **_request(call), **options)
        return answer_of(call, response)

    async def send(self, call: Call[T], policy: RetryPolicy | None = None) -> T:
        """The answer, retrying unavailability until the policy's deadline."""
        policy = policy or self.policy
        deadline = time.monotonic() + policy.deadline
        backoff = policy.first_backoff
        attempts = 0
        last = ""
        while True:
            left = deadline - time.monotonic()
            timeout = policy.attempt_timeout if not attempts else min(policy.attempt_timeout, left)
            attempts += 1
            try:
                return await self.once(call, timeout)
            except EpochServiceUnavailable as exc:
                # An attempt cut short by the deadline says nothing new about the service:
                # keep the cause an earlier, full attempt found.
                if attempts == 1 or timeout == policy.attempt_timeout:
                    last = str(exc)
            if deadline - time.monotonic() <= 0:
                if attempts == 1:
                    raise EpochServiceUnavailable(last)
                raise EpochServiceUnavailable(
                    f"{last} ({attempts} attempts in {policy.deadline:g}s)"
                )
            self.retries += 1
            # Full jitter: several callers do not retry in lockstep.
            sleep = min(backoff, max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(random.uniform(sleep / 2, sleep))
            backoff = min(backoff * 2, policy.max_backoff)


class SyncEpochServiceClient:
    """Blocking client with one attempt per call (tests, scripts, a thread of its own)."""

    def __init__(
        self,
        base_url: str,
        token: Token = None,
        *,
        user_agent: str = "mcp-epoch",
        timeout: float | httpx.Timeout = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            **_client_options(base_url, token, user_agent, timeout), transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SyncEpochServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, call: Call[T]) -> T:
        with _outage(None):
            response = self._http.request(call.method, call.path, **_request(call))
        return answer_of(call, response)


@contextmanager
def _outage(timeout: float | httpx.Timeout | None) -> Iterator[None]:
    """A request that got no answer, as the outage it is (sync and async sends alike)."""
    try:
        yield
    except httpx.TimeoutException:
        raise EpochServiceUnavailable(f"no answer within {_seconds(timeout)}") from None
    except httpx.TransportError as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise EpochServiceUnavailable(detail) from None


def _seconds(timeout: float | httpx.Timeout | None) -> str:
    return f"{timeout:g}s" if isinstance(timeout, int | float) else "the timeout"
