"""A small async Kubernetes API client on httpx (a dependency the project already has).

kopf watches and serves the webhook; the operator's own writes (server-side apply of the
Deployment and Service, status, Events, fresh pod lists for the resync) go through this. It
takes its credentials from kopf's own login functions, so it reads exactly the kubeconfig or
service account kopf uses, and logs in again on a 401 (service account tokens rotate).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from mcp_epoch_operator.names import FIELD_MANAGER


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


class KubeClient:
    """JSON over HTTPS to one API server."""

    def __init__(self, login: Callable[[], Any]) -> None:
        self._login = login
        self._tmp = tempfile.TemporaryDirectory(prefix="mcp-epoch-operator-")
        self._client: httpx.AsyncClient | None = None
        self._connect()

    def _connect(self) -> None:
        info = self._login()
        ctx = ssl.create_default_context()
        if info.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif info.ca_path:
            ctx.load_verify_locations(cafile=os.fspath(info.ca_path))
        elif info.ca_data:
            ctx.load_verify_locations(cadata=_decode_data(info.ca_data).decode())
        cert = self._file(info.certificate_path, info.certificate_data, "client.crt")
        key = self._file(info.private_key_path, info.private_key_data, "client.key")
        if cert and key:
            ctx.load_cert_chain(cert, key)
        headers = {"Accept": "application/json", "User-Agent": FIELD_MANAGER}
        if info.token:
            headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        self.default_namespace: str | None = info.default_namespace
        self._client = httpx.AsyncClient(
            base_url=str(info.server).rstrip("/"), verify=ctx, headers=headers, timeout=15.0
        )

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
        if self._client is not None:
            await self._client.aclose()
        self._tmp.cleanup()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """One call; returns the decoded JSON body or raises KubeError."""
        for attempt in (1, 2):
            assert self._client is not None
            response = await self._client.request(
                method,
                path,
                params=params,
                content=None if body is None else json.dumps(body).encode(),
                headers={"Content-Type": content_type} if body is not None else None,
            )
            if response.status_code == 401 and attempt == 1:
                old = self._client
                self._connect()  # a rotated service account token: log in again
                await old.aclose()
                continue
            try:
                payload = response.json()
            except ValueError:
                payload = response.text
            if response.status_code >= 400:
                raise KubeError(response.status_code, payload)
            return payload
        raise AssertionError("unreachable")

    async def get(self, path: str) -> dict[str, Any] | None:
        """An object, or None if it does not exist."""
        try:
            obj: dict[str, Any] = await self.request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """All items (a quorum read: no resourceVersion, so never older than earlier writes)."""
        params = {"labelSelector": label_selector} if label_selector else None
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            page_params: dict[str, Any] = dict(params or {})
            page_params["limit"] = 500
            if cont:
                page_params["continue"] = cont
            page = await self.request("GET", path, params=page_params)
            items.extend(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items

    async def apply(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply, forced: the operator owns the fields it sets."""
        result: dict[str, Any] = await self.request(
            "PATCH",
            path,
            body=obj,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )
        return result

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self.request(
            "PATCH", path, body=patch, content_type="application/merge-patch+json"
        )
        return result

    async def post_event(
        self,
        involved: dict[str, Any],
        type_: str,
        reason: str,
        message: str,
    ) -> None:
        """A core/v1 Event about ``involved`` (kubectl describe shows it)."""
        meta = involved["metadata"]
        namespace = meta["namespace"]
        from mcp_epoch_operator.status import now_iso

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
        await self.request("POST", f"/api/v1/namespaces/{namespace}/events", body=event)


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
