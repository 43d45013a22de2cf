"""The tests' synchronous Kubernetes access, on the official ``kubernetes`` client.

:class:`Kube` holds the typed API groups for one kubeconfig (the admin's, or a ServiceAccount's
written by a test) and answers with the API server's JSON, as the operator's own client does:
the tests assert on plain dicts, and no generated model sits in between to drop a field it
does not know. A non-2xx answer raises the client's :class:`ApiException`, whose ``status``
and ``body`` a test can assert on (a 403 the RBAC tests expect, a 400 the admission tests do).

The pod runner is asynchronous: :class:`AsyncKube` is the same on ``kubernetes_asyncio``, the
official client's asyncio twin that the operator uses, with its watches.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import kubernetes_asyncio
import kubernetes_asyncio.config
import kubernetes_asyncio.watch
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes_asyncio.client.exceptions import ApiException as AsyncApiException

__all__ = [
    "MERGE",
    "STRATEGIC",
    "ApiException",
    "AsyncApiException",
    "AsyncKube",
    "Kube",
    "status_of",
]

#: Seconds one call may take before the test sees a timeout instead of a hang.
TIMEOUT = 30.0
#: The patch formats; the generated client would otherwise send a dict as a JSON Patch.
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class Kube:
    """One API server as one identity; every call returns the decoded JSON body."""

    def __init__(self, kubeconfig: Path) -> None:
        self.client: client.ApiClient = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.client)
        self.apps = client.AppsV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)
        self.discovery = client.DiscoveryV1Api(self.client)
        self.authentication = client.AuthenticationV1Api(self.client)

    def json(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call one typed API method and decode its answer; ApiException on non-2xx."""
        kwargs.setdefault("_request_timeout", TIMEOUT)
        response = method(*args, _preload_content=False, **kwargs)
        raw = response.data
        return json.loads(raw) if raw else None

    def find(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Like :meth:`json`, but ``None`` for an object that does not exist (404)."""
        try:
            return self.json(method, *args, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch(
        self, method: Callable[..., Any], *args: Any, body: Any, content_type: str = MERGE
    ) -> Any:
        """One ``patch_*`` call with an explicit patch format."""
        return self.json(method, *args, body, _content_type=content_type)

    def mint_token(
        self,
        namespace: str,
        account: str,
        audiences: Sequence[str] | None = None,
        *,
        pod: Mapping[str, Any] | None = None,
        seconds: int = 3600,
    ) -> str:
        """A ServiceAccount token from the API server (TokenRequest), as the kubelet gets one:
        for ``audiences`` (the API server's own when ``None``), bound to ``pod`` if given."""
        spec: dict[str, Any] = {"expirationSeconds": seconds}
        if audiences is not None:
            spec["audiences"] = list(audiences)
        if pod is not None:
            meta = pod["metadata"]
            spec["boundObjectRef"] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            }
        answer = self.json(
            self.core.create_namespaced_service_account_token,
            account,
            namespace,
            {"spec": spec},
        )
        return str(answer["status"]["token"])

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Kube:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def status_of(call: Callable[[], Any]) -> int:
    """The HTTP status one call gets: 200 for an answer, the error's status for a refusal."""
    try:
        call()
    except ApiException as exc:
        return int(exc.status or 0)
    return 200


class AsyncKube:
    """:class:`Kube` on ``kubernetes_asyncio``; build it with :meth:`connect`, close it."""

    def __init__(self, api: Any) -> None:
        self.client = api
        self.core = kubernetes_asyncio.client.CoreV1Api(api)
        self.discovery = kubernetes_asyncio.client.DiscoveryV1Api(api)

    @classmethod
    async def connect(cls, kubeconfig: Path) -> AsyncKube:
        api = await kubernetes_asyncio.config.new_client_from_config(config_file=str(kubeconfig))
        return cls(api)

    async def json(self, method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """One call, its decoded JSON body; the asyncio client's ApiException on non-2xx.

        With ``_preload_content=False`` the asyncio client hands back the raw response without
        looking at its status, so the status is checked here."""
        kwargs.setdefault("_request_timeout", TIMEOUT)
        response = await method(*args, _preload_content=False, **kwargs)
        async with response:
            raw = await response.read()
            if not 200 <= response.status < 300:
                error = AsyncApiException(status=response.status, reason=response.reason)
                error.body = raw.decode(errors="replace")
                raise error
        return json.loads(raw) if raw else None

    async def find(self, method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """Like :meth:`json`, but ``None`` for an object that does not exist (404)."""
        try:
            return await self.json(method, *args, **kwargs)
        except AsyncApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def watch(
        self, method: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(event type, the object as JSON) from one watch of a ``list_*`` method, until the
        server ends it (``timeout_seconds``). An expired version raises AsyncApiException (410).
        """
        kwargs.setdefault("_request_timeout", float(kwargs.get("timeout_seconds", 60)) + 30)
        watch = kubernetes_asyncio.watch.Watch()
        async with watch.stream(method, *args, **kwargs) as events:
            async for event in events:
                yield str(event["type"]), dict(event["raw_object"])

    async def close(self) -> None:
        await self.client.close()
