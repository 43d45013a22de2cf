"""The operator's own Kubernetes API calls, on ``kubernetes_asyncio`` (the official client's
asyncio twin: every call runs on kopf's event loop, beside the watches).

kopf watches (the webhook has a server of its own, ``admission``); through this go the writes
kopf has no helper for (server-side apply of the Deployment, Service and webhook
configuration, the status of an McpServer, the servers ConfigMap, Events from outside kopf's
handlers) and the labelled lists of the resync. Credentials come from
kopf's own login (:func:`login`), so the client reads exactly the kubeconfig or service
account kopf uses, and logs in again on a 401 (service account tokens rotate).

Objects come back as the API server's JSON (``_preload_content=False``): the operator's logic
is plain functions of dicts, and no typed model sits in between to drop a field it does not
know.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import secrets
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from mcp_epoch_operator.names import FIELD_MANAGER, GROUP, PLURAL, VERSION
from mcp_epoch_operator.status import now_iso

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


class KubeError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: Any) -> None:
        message = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{status}: {message}")
        self.status = status
        self.body = body


def _decode_data(data: str | bytes) -> bytes:
    """kubeconfig ``*-data`` fields are base64; tolerate already-decoded PEM too."""
    raw = data.encode() if isinstance(data, str) else data
    if raw.lstrip().startswith(b"-----BEGIN"):
        return raw
    return base64.b64decode(raw)


def _error(status: int, raw: Any) -> KubeError:
    try:
        body: Any = json.loads(raw) if raw else ""
    except (TypeError, ValueError):
        body = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return KubeError(status, body)


class KubeClient:
    """Typed API groups of one API server, answering with plain JSON objects."""

    def __init__(self, login: Callable[[], Any]) -> None:
        self._login = login
        self._tmp = tempfile.TemporaryDirectory(prefix="mcp-epoch-operator-")
        self._api: client.ApiClient | None = None
        self._connect()

    def _connect(self) -> None:
        info = self._login()
        conf = client.Configuration(host=str(info.server).rstrip("/"))
        conf.verify_ssl = not info.insecure
        if info.ca_path:
            conf.ssl_ca_cert = os.fspath(info.ca_path)
        elif info.ca_data:
            conf.ssl_ca_cert = self._file(None, info.ca_data, "ca.crt")
        conf.cert_file = self._file(info.certificate_path, info.certificate_data, "client.crt")
        conf.key_file = self._file(info.private_key_path, info.private_key_data, "client.key")
        if info.token:
            conf.api_key = {"BearerToken": info.token}
            conf.api_key_prefix = {"BearerToken": info.scheme or "Bearer"}
        self.default_namespace: str | None = info.default_namespace
        self._api = client.ApiClient(conf)
        self._api.user_agent = FIELD_MANAGER
        self.core = client.CoreV1Api(self._api)
        self.apps = client.AppsV1Api(self._api)
        self.custom = client.CustomObjectsApi(self._api)
        self.admission = client.AdmissionregistrationV1Api(self._api)
        self.coordination = client.CoordinationV1Api(self._api)

    def _file(self, path: Any, data: str | bytes | None, name: str) -> str | None:
        if path:
            return str(os.fspath(path))
        if data:
            target = Path(self._tmp.name) / name
            target.write_bytes(_decode_data(data))
            target.chmod(0o600)
            return str(target)
        return None

    async def aclose(self) -> None:
        if self._api is not None:
            await self._api.close()
        self._tmp.cleanup()

    async def _call(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """One call (``call`` builds it from the current API objects); the decoded JSON body,
        or KubeError. A 401 logs in again once (a rotated token).

        With ``_preload_content=False`` the client hands back the raw response without
        looking at its status, so the status is checked here."""
        for attempt in (1, 2):
            try:
                response = await call()
            except ApiException as exc:  # raised before a response (e.g. preloaded calls)
                status, body = int(exc.status or 0), exc.body
            else:
                try:
                    raw = await response.read()
                finally:
                    response.release()
                status, body = response.status, raw
            if 200 <= status <= 299:
                return json.loads(body) if body else {}
            if status == 401 and attempt == 1:
                old = self._api
                self._connect()
                if old is not None:
                    await old.close()
                continue
            raise _error(status, body)
        raise AssertionError("unreachable")

    async def _get(self, call: Callable[[], Awaitable[Any]]) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self._call(call)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    async def _list(self, call: Callable[..., Awaitable[Any]], **kwargs: Any) -> list[Any]:
        """All items, page by page (a quorum read: never older than earlier writes)."""
        items: list[Any] = []
        cont: str | None = None
        while True:
            page_kwargs = dict(kwargs, limit=500, _preload_content=False)
            if cont:
                page_kwargs["_continue"] = cont
            page = await self._call(functools.partial(call, **page_kwargs))
            items.extend(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items

    # ------------------------------------------------------------------ reads

    async def list_pods(self, namespace: str | None, label_selector: str) -> list[Any]:
        if namespace:
            return await self._list(
                self.core.list_namespaced_pod, namespace=namespace, label_selector=label_selector
            )
        return await self._list(
            self.core.list_pod_for_all_namespaces, label_selector=label_selector
        )

    async def list_mcpservers(self, namespace: str | None) -> list[Any]:
        if namespace:
            return await self._list(
                self.custom.list_namespaced_custom_object,
                group=GROUP,
                version=VERSION,
                namespace=namespace,
                plural=PLURAL,
            )
        return await self._list(
            self.custom.list_cluster_custom_object, group=GROUP, version=VERSION, plural=PLURAL
        )

    async def get_mcpserver(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(
            lambda: self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _preload_content=False
            )
        )

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = await self._get(
            lambda: self.apps.read_namespaced_deployment(name, namespace, _preload_content=False)
        )
        if found is not None:
            found.setdefault("apiVersion", "apps/v1")
            found.setdefault("kind", "Deployment")
        return found

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(
            lambda: self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
        )

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(
            lambda: self.coordination.read_namespaced_lease(name, namespace, _preload_content=False)
        )

    # ------------------------------------------------------------------ writes

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Lease; KubeError 409 when another process created it first."""
        made: dict[str, Any] = await self._call(
            lambda: self.coordination.create_namespaced_lease(
                namespace, body, _preload_content=False
            )
        )
        return made

    async def replace_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Replace a Lease at the ``resourceVersion`` in ``body``: KubeError 409 when it
        changed since it was read (another process wrote first)."""
        name = body["metadata"]["name"]
        made: dict[str, Any] = await self._call(
            lambda: self.coordination.replace_namespaced_lease(
                name, namespace, body, _preload_content=False
            )
        )
        return made

    async def apply_deployment(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Server-side apply, forced: the operator owns the fields it sets."""
        await self._call(
            lambda: self.apps.patch_namespaced_deployment(
                name, namespace, body, _content_type=APPLY, **_OWN
            )
        )

    async def apply_service(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        await self._call(
            lambda: self.core.patch_namespaced_service(
                name, namespace, body, _content_type=APPLY, **_OWN
            )
        )

    async def apply_webhook_configuration(self, name: str, body: dict[str, Any]) -> None:
        await self._call(
            lambda: self.admission.patch_mutating_webhook_configuration(
                name, body, _content_type=APPLY, **_OWN
            )
        )

    async def patch_mcpserver_status(
        self, namespace: str, name: str, status: dict[str, Any]
    ) -> None:
        await self._call(
            lambda: self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                {"status": status},
                _content_type=MERGE,
                _preload_content=False,
            )
        )

    async def annotate_deployment(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> None:
        """Merge ``annotations`` into a Deployment's (not one the operator owns: a merge patch
        of those keys only, never an apply)."""
        await self._call(
            lambda: self.apps.patch_namespaced_deployment(
                name,
                namespace,
                {"metadata": {"annotations": annotations}},
                _content_type=MERGE,
                _preload_content=False,
            )
        )

    async def patch_configmap(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self._call(
            lambda: self.core.patch_namespaced_config_map(
                name, namespace, patch, _content_type=MERGE, _preload_content=False
            )
        )

    async def create_configmap(self, namespace: str, body: dict[str, Any]) -> None:
        await self._call(
            lambda: self.core.create_namespaced_config_map(namespace, body, _preload_content=False)
        )

    async def post_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event about ``involved`` (kubectl describe shows it).

        Not ``kopf.event``: kopf can post only from its per-object handlers (its event queue
        is bound there), and these Events come from the webhook and the reconcile worker."""
        meta = involved["metadata"]
        namespace = meta["namespace"]
        now = now_iso()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": os.environ.get("HOSTNAME", "local"),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._call(
            lambda: self.core.create_namespaced_event(namespace, event, _preload_content=False)
        )


_OWN = {"field_manager": FIELD_MANAGER, "force": True, "_preload_content": False}


def login(settings: Any = None) -> Any:
    """kopf's own credential discovery: in-cluster service account, else the kubeconfig."""
    import kopf

    settings = settings if settings is not None else kopf.OperatorSettings()
    info = None
    if not os.environ.get("KUBECONFIG"):
        info = kopf.login_with_service_account(settings=settings)
    if info is None:
        info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise RuntimeError("no Kubernetes credentials: set KUBECONFIG or run in a pod")
    return info
