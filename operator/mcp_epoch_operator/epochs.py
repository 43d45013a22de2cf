"""The operator's client for the epoch service: timeouts, retries with backoff, the operator
credential, and errors split into "the service said no" (a stable ``code``) and "the service cannot
answer" (retry later, refuse pods meanwhile). In a cluster the token is the operator's own
projected ServiceAccount token, re-read from its file before every request."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

log = logging.getLogger("mcp_epoch_operator.epochs")

#: 503 store-unavailable is the only error the service itself asks callers to retry.
_RETRY_STATUS = frozenset({502, 503, 504})


class EpochServiceUnavailable(Exception):
    """The service could not be reached or did not answer in time (transient)."""


class EpochServiceError(Exception):
    """The service answered with an error (``code`` from its error body)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts within one deadline; the webhook uses a tight one (its own timeout is 5 s)."""

    deadline: float = 10.0
    attempt_timeout: float = 3.0
    first_backoff: float = 0.1
    max_backoff: float = 2.0


WEBHOOK_POLICY = RetryPolicy(deadline=3.0, attempt_timeout=1.5, first_backoff=0.05, max_backoff=0.5)
BACKGROUND_POLICY = RetryPolicy()
#: While the service is known to be down, one short try: the worker must not stall on it.
PROBE_POLICY = RetryPolicy(deadline=1.0, attempt_timeout=1.0)


class BearerAuth(httpx.Auth):
    """A bearer token asked for on every request: a projected ServiceAccount token is
    rotated in its file by the kubelet, so a copy read at start would expire."""

    def __init__(self, token: str | Callable[[], str]) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        token = self._token() if callable(self._token) else self._token
        request.headers["Authorization"] = f"Bearer {token}"
        yield request


def token_from_file(path: Path) -> Callable[[], str]:
    """Read ``path`` on each call; an unreadable file keeps the last token it had."""
    last = path.read_text().strip()

    def read() -> str:
        nonlocal last
        try:
            last = path.read_text().strip() or last
        except OSError as exc:
            log.error("cannot read the operator token file %s: %s", path, exc)
        return last

    return read


class EpochServiceClient:
    """Async client; one per operator process (connection pooling)."""

    def __init__(
        self, base_url: str, token: str | Callable[[], str], *, verify: Any = True
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            auth=BearerAuth(token),
            headers={"User-Agent": "mcp-epoch-operator"},
            verify=verify,
            timeout=BACKGROUND_POLICY.attempt_timeout,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None,
        policy: RetryPolicy = BACKGROUND_POLICY,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + policy.deadline
        backoff = policy.first_backoff
        last = "no attempt made"
        attempts = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EpochServiceUnavailable(
                    f"{last} ({attempts} attempts in {policy.deadline:g}s)"
                )
            timeout = min(policy.attempt_timeout, remaining)
            attempts += 1
            try:
                response = await self._client.request(
                    method, path, json=json, params=params, timeout=timeout
                )
            except httpx.TimeoutException:
                # An attempt cut short by the deadline says nothing new about the
                # service: keep the cause an earlier, full attempt found.
                if timeout == policy.attempt_timeout or attempts == 1:
                    last = f"no answer within {timeout:g}s"
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if response.status_code < 400:
                    body: dict[str, Any] = response.json()
                    return body
                code, message = _error_of(response)
                if response.status_code not in _RETRY_STATUS:
                    raise EpochServiceError(response.status_code, code, message)
                last = f"{response.status_code} {code}: {message}"
            # Full jitter: several operator replicas do not retry in lockstep.
            sleep = min(backoff, max(0.0, deadline - time.monotonic()))
            await asyncio.sleep(random.uniform(sleep / 2, sleep))
            backoff = min(backoff * 2, policy.max_backoff)

    async def issue(
        self, namespace: str, server: str, request_uid: str, policy: RetryPolicy = WEBHOOK_POLICY
    ) -> dict[str, Any]:
        """Issue (or, for a repeated request UID, return) a pod epoch."""
        body = {"namespace": namespace, "server": server, "request_uid": request_uid}
        return await self._call("POST", "/v1/epochs", json=body, policy=policy)

    async def bind(
        self, epoch: str, pod_name: str, pod_uid: str, address: str | None = None
    ) -> dict[str, Any]:
        body = {"pod_name": pod_name, "pod_uid": pod_uid}
        if address:
            body["address"] = address
        return await self._call("POST", f"/v1/epochs/{epoch}/bind", json=body)

    async def drain(self, epoch: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/epochs/{epoch}/drain")

    async def retire(self, epoch: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/epochs/{epoch}/retire")

    async def call(
        self, verb: str, epoch: str, pod_name: str, pod_uid: str, address: str | None = None
    ) -> dict[str, Any]:
        """One lifecycle verb by name (bind, drain, retire)."""
        if verb == "bind":
            return await self.bind(epoch, pod_name, pod_uid, address)
        if verb == "drain":
            return await self.drain(epoch)
        if verb == "retire":
            return await self.retire(epoch)
        raise ValueError(f"unknown lifecycle verb {verb!r}")

    async def list_server(
        self, namespace: str, server: str, policy: RetryPolicy = BACKGROUND_POLICY
    ) -> dict[str, Any]:
        """``{ledger_id, revision, epochs}`` for one server (tombstones included)."""
        return await self._call("GET", f"/v1/servers/{namespace}/{server}/epochs", policy=policy)

    async def ready(self) -> dict[str, Any]:
        """The service's readiness probe (answers only when its store does)."""
        return await self._call("GET", "/readyz", policy=RetryPolicy(deadline=3.0))


def _error_of(response: httpx.Response) -> tuple[str, str]:
    try:
        body = response.json()
        return str(body.get("code", "error")), str(body.get("message", response.text[:200]))
    except ValueError:
        return "error", response.text[:200] or response.reason_phrase
