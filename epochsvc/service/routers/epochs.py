"""``/v1/epochs``: issue pod epochs, move them through their lifecycle, register process starts."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Response, status

from epochsvc.service.access import shown
from epochsvc.service.auth import AnyCaller, Operator
from epochsvc.service.deps import (
    EpochPath,
    MetricsDep,
    Notifier,
    Rules,
    Store,
    TargetPodEpoch,
    TargetProcessEpoch,
    json_body,
    parse_any_epoch,
)
from epochsvc.service.errors import ApiError
from epochsvc.service.issued import issue_one
from epochsvc.service.lifecycle import Action, State
from epochsvc.service.models import epoch_of, fields_of
from epochsvc.service.store.base import UnknownEpoch
from mcp_epoch.api import (
    BindRequest,
    DrainOutcome,
    DrainRecorded,
    DrainReport,
    Epoch,
    EpochLookup,
    ErrorBody,
    HandoffRequest,
    Incarnation,
    IncarnationRequest,
    IssueRequest,
)
from mcp_epoch.contract import ProcessEpoch

log = logging.getLogger("epochsvc.api")

_ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorBody} for code in (401, 403, 404, 409, 413, 415, 422, 503)
}
router = APIRouter(
    prefix="/v1/epochs", tags=["epochs"], responses=_ERRORS, dependencies=[Depends(json_body)]
)


@router.post(
    "",
    response_model=Epoch,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": Epoch, "description": "a repeat: this request_uid's epoch"}},
)
async def issue_epoch(
    body: IssueRequest,
    response: Response,
    store: Store,
    notifier: Notifier,
    metrics: MetricsDep,
    _: Operator,
) -> Epoch:
    """Issue a pod epoch for an admission request; the same ``request_uid`` gets the same epoch
    (200 instead of 201)."""
    epoch, created = await issue_one(store, notifier, metrics, body)
    if not created:
        response.status_code = status.HTTP_200_OK
    return epoch


async def _transition(
    store: Store,
    notifier: Notifier,
    epoch: TargetPodEpoch,
    action: Action,
    body: BindRequest | None = None,
) -> Epoch:
    record = await store.transition(
        epoch.generation,
        action,
        pod_name=body.pod_name if body else None,
        pod_uid=body.pod_uid if body else None,
        address=body.address if body else None,
    )
    # After a no-op write its waiters find nothing newer and simply wait on.
    notifier.notify_server(record.namespace, record.server, record.revision)
    return epoch_of(record)


@router.post("/{epoch}/bind", response_model=Epoch)
async def bind_epoch(
    epoch: TargetPodEpoch, body: BindRequest, store: Store, notifier: Notifier, _: Operator
) -> Epoch:
    """The pod was seen: bind its name and UID (pending → live), and its address once known."""
    return await _transition(store, notifier, epoch, Action.BIND, body)


@router.post("/{epoch}/drain", response_model=Epoch)
async def drain_epoch(
    epoch: TargetPodEpoch, store: Store, notifier: Notifier, _: Operator
) -> Epoch:
    """The pod has a deletion timestamp (live → draining)."""
    return await _transition(store, notifier, epoch, Action.DRAIN)


@router.post("/{epoch}/retire", response_model=Epoch)
async def retire_epoch(
    epoch: TargetPodEpoch, store: Store, notifier: Notifier, _: Operator
) -> Epoch:
    """The pod is gone (live or draining → retired); from now on its token is refused."""
    return await _transition(store, notifier, epoch, Action.RETIRE)


@router.post(
    "/{epoch}/incarnations", response_model=Incarnation, status_code=status.HTTP_201_CREATED
)
async def register_incarnation(
    epoch: TargetPodEpoch,
    store: Store,
    notifier: Notifier,
    rules: Rules,
    caller: AnyCaller,
    body: IncarnationRequest | None = None,
) -> Incarnation:
    """A process started in the pod: its process epoch is the next incarnation; older
    incarnations of the pod epoch stop counting as live. A pod registers only for the epoch
    bound to itself (``not-bound``, 409, until the operator has bound it)."""
    uid = await rules.incarnation_uid(caller, body.pod_uid if body else None)
    record = await store.register_incarnation(
        epoch.generation,
        pod_uid=uid,
        pod_name=body.pod_name if body else None,
        owner_only=not caller.is_operator,
    )
    notifier.notify_server(record.namespace, record.server, record.revision)
    assert record.incarnation is not None and record.process_epoch is not None
    return Incarnation(
        process_epoch=record.process_epoch,
        incarnation=record.incarnation,
        epoch=epoch_of(shown(record, caller)),
    )


@router.put("/{process_epoch}/successor", response_model=Epoch)
async def record_handoff(
    parsed: TargetProcessEpoch,
    body: HandoffRequest,
    store: Store,
    notifier: Notifier,
    rules: Rules,
    caller: AnyCaller,
) -> Epoch:
    """A draining process (its process epoch) hands its sessions to a live peer of the same
    server, in another pod: one rule per process, recorded once (the same rule again is a
    no-op, another one 409 ``handoff-recorded``). A pod records it only for itself."""
    uid = await rules.incarnation_uid(caller, body.pod_uid)
    record = await store.record_handoff(
        parsed.pod.generation,
        parsed.incarnation,
        ProcessEpoch.parse(body.successor),
        pod_uid=uid,
    )
    notifier.notify_server(record.namespace, record.server, record.revision)
    return epoch_of(shown(record, caller))


@router.post("/{process_epoch}/drain-report", response_model=DrainRecorded)
async def report_drain(
    parsed: TargetProcessEpoch,
    body: DrainReport,
    store: Store,
    rules: Rules,
    caller: AnyCaller,
    metrics: MetricsDep,
) -> DrainRecorded:
    """A draining process (its process epoch) says how its drain ended, just before it exits:
    counted in ``epochsvc_drains_total`` by server and outcome, since the process's own
    ``/metrics`` leave with it. Nothing is stored. A pod reports only for itself."""
    uid = await rules.incarnation_uid(caller, body.pod_uid)
    record = await store.get(parsed.pod.generation)
    if uid is not None and record.pod_uid != uid:
        raise ApiError(403, "not-your-epoch", "a pod may report only for its own epoch")
    outcome: DrainOutcome = "deadline" if body.deadline else "clean"
    metrics.drains.labels(record.namespace, record.server, outcome).inc()
    if body.deadline:
        log.warning(
            "%s/%s: process %s hit its drain deadline after %.1fs: %d of %d calls cut, "
            "%d sessions not handed on",
            record.namespace,
            record.server,
            parsed,
            body.seconds,
            body.abandoned,
            body.in_flight,
            body.kept,
        )
    return DrainRecorded(namespace=record.namespace, server=record.server, outcome=outcome)


@router.get("/{epoch}", response_model=EpochLookup)
async def get_epoch(epoch: EpochPath, store: Store, rules: Rules, caller: AnyCaller) -> EpochLookup:
    """One pod or process epoch. A process epoch newer than the newest incarnation was never
    issued (404); an older one belongs to a process that a restart replaced. A pod reads only
    its own server's epochs."""
    parsed = parse_any_epoch(store, epoch)
    pod = parsed.pod if isinstance(parsed, ProcessEpoch) else parsed
    record = await store.get(pod.generation)
    await rules.check_read(caller, record.namespace, record.server)
    if isinstance(parsed, ProcessEpoch):
        newest = record.incarnation
        if newest is None or parsed.incarnation > newest:
            raise UnknownEpoch(epoch)
        process_state = record.state if parsed.incarnation == newest else State.RETIRED
        return EpochLookup(
            **fields_of(shown(record, caller)), requested=epoch, process_state=process_state
        )
    return EpochLookup(**fields_of(shown(record, caller)), requested=epoch)
