"""Dependencies shared by the routers: the store, settings and parsed path parameters.

All are ``async def``: FastAPI runs a plain ``def`` dependency in a worker thread, which costs
more than everything these functions do.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Path, Request

from epochsvc.service.access import Access
from epochsvc.service.errors import ApiError
from epochsvc.service.listings import RenderedLists
from epochsvc.service.longpoll import ChangeNotifier
from epochsvc.service.metrics import Metrics
from epochsvc.service.settings import Settings
from epochsvc.service.store.base import EpochStore, UnknownEpoch
from mcp_epoch.contract import (
    ANY_EPOCH_PATTERN,
    MAX_PROCESS_EPOCH_LEN,
    POD_EPOCH_PATTERN,
    PROCESS_EPOCH_PATTERN,
    PodEpoch,
    ProcessEpoch,
    parse_epoch,
)


async def get_store(request: Request) -> EpochStore:
    store: EpochStore = request.app.state.store
    return store


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_notifier(request: Request) -> ChangeNotifier:
    notifier: ChangeNotifier = request.app.state.notifier
    return notifier


async def get_ring_notifier(request: Request) -> ChangeNotifier:
    notifier: ChangeNotifier = request.app.state.ring_notifier
    return notifier


async def get_lists(request: Request) -> RenderedLists:
    lists: RenderedLists = request.app.state.lists
    return lists


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def get_access(request: Request) -> Access:
    access: Access = request.app.state.access
    return access


Store = Annotated[EpochStore, Depends(get_store)]
Rules = Annotated[Access, Depends(get_access)]
Config = Annotated[Settings, Depends(get_settings)]
Notifier = Annotated[ChangeNotifier, Depends(get_notifier)]
RingNotifier = Annotated[ChangeNotifier, Depends(get_ring_notifier)]
Lists = Annotated[RenderedLists, Depends(get_lists)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


# The patterns are documentation (OpenAPI), each exactly what its calls take: a malformed
# epoch still gets this service's own 422 ``malformed-epoch`` from ``parse_any_epoch``, not
# the framework's validation error.
def _epoch_path(description: str, pattern: str) -> Any:
    return Path(
        max_length=MAX_PROCESS_EPOCH_LEN,
        description=description,
        json_schema_extra={"pattern": f"^{pattern}$"},
    )


EpochPath = Annotated[
    str,
    _epoch_path("a pod epoch (9f2c1a7e-42) or a process epoch (9f2c1a7e-42.0)", ANY_EPOCH_PATTERN),
]
PodEpochPath = Annotated[str, _epoch_path("a pod epoch (9f2c1a7e-42)", POD_EPOCH_PATTERN)]
ProcessEpochPath = Annotated[
    str, _epoch_path("a process epoch (9f2c1a7e-42.0)", PROCESS_EPOCH_PATTERN)
]


def is_json(content_type: str) -> bool:
    """Whether a ``Content-Type`` value names JSON (its parameters aside)."""
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


async def json_body(request: Request) -> None:
    """Bodies are JSON: say so clearly rather than failing validation of raw bytes."""
    has_body = request.headers.get("content-length", "0") != "0" or (
        "transfer-encoding" in request.headers
    )
    if has_body and not is_json(request.headers.get("content-type", "")):
        raise ApiError(
            415,
            "unsupported-media-type",
            "send the body as JSON with Content-Type: application/json",
        )


def parse_any_epoch(store: EpochStore, raw: str) -> PodEpoch | ProcessEpoch:
    """Parse a path epoch: malformed → 422; another ledger's (or never issued) → 404."""
    try:
        parsed = parse_epoch(raw)
    except ValueError as exc:
        raise ApiError(422, "malformed-epoch", str(exc)) from None
    pod = parsed.pod if isinstance(parsed, ProcessEpoch) else parsed
    if pod.ledger8 != store.ledger8 or pod.generation == 0:
        raise UnknownEpoch(raw)
    return parsed


async def pod_epoch(epoch: PodEpochPath, store: Store) -> PodEpoch:
    parsed = parse_any_epoch(store, epoch)
    if isinstance(parsed, ProcessEpoch):
        raise ApiError(
            422, "malformed-epoch", f"{epoch} is a process epoch; this call takes a pod epoch"
        )
    return parsed


async def process_epoch(process_epoch: ProcessEpochPath, store: Store) -> ProcessEpoch:
    parsed = parse_any_epoch(store, process_epoch)
    if not isinstance(parsed, ProcessEpoch):
        raise ApiError(
            422,
            "malformed-epoch",
            f"{process_epoch} is a pod epoch; this call takes a process epoch (9f2c1a7e-42.0)",
        )
    return parsed


TargetPodEpoch = Annotated[PodEpoch, Depends(pod_epoch)]
TargetProcessEpoch = Annotated[ProcessEpoch, Depends(process_epoch)]
