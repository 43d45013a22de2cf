"""Probes and metrics. These need no credentials (kubelet and Prometheus call them)."""

from __future__ import annotations

from fastapi import APIRouter, Response

from epochsvc.service.deps import MetricsDep, Notifier, RingNotifier, Store
from epochsvc.service.errors import ApiError
from epochsvc.service.store.base import StoreUnavailable
from mcp_epoch.api import Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (no I/O: this is also the benchmark's framework ceiling)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(store: Store, m: MetricsDep) -> Readiness:
    """Ready when the store answers."""
    try:
        await store.ping()
    except StoreUnavailable as exc:
        m.store_answered(False)
        raise ApiError(503, "store-unavailable", str(exc)) from None
    m.store_answered(True)
    return Readiness(status="ready", ledger_id=store.ledger_id)


#: Prometheus's text exposition, as the OpenAPI document must say (not FastAPI's default JSON).
METRICS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {METRICS_MEDIA_TYPE: {"schema": {"type": "string"}}}}},
)
async def metrics(
    store: Store, notifier: Notifier, ring_notifier: RingNotifier, m: MetricsDep
) -> Response:
    body = await m.render(store, notifier.waiters + ring_notifier.waiters)
    return Response(body, media_type=METRICS_MEDIA_TYPE)
