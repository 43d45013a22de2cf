"""Request-state key rings (MCP 2026-07-28): pods load their server's ring and report which
revision they hold; the operator reads a ring's rotation and moves it on (keyring.py)."""

from __future__ import annotations

import base64
import time

from fastapi import APIRouter, Depends, Response

from epochsvc.service import keyring
from epochsvc.service.auth import AnyCaller, Operator
from epochsvc.service.deps import (
    Config,
    RingNotifier,
    Rules,
    Store,
    TargetProcessEpoch,
    json_body,
)
from epochsvc.service.errors import ApiError
from epochsvc.service.keyring import Holder, Phase, Ring, RotationInProgress
from epochsvc.service.routers.servers import (
    NameParam,
    SinceParam,
    WaitParam,
    held_poll,
    held_seconds,
)
from mcp_epoch.api import (
    ErrorBody,
    RequestStateRing,
    RingHeld,
    RingHolder,
    RingReport,
    RingStatus,
)

router = APIRouter(
    prefix="/v1",
    tags=["request-state"],
    responses={code: {"model": ErrorBody} for code in (401, 403, 404, 409, 415, 422, 503)},
    dependencies=[Depends(json_body)],
)


def status_of(
    namespace: str,
    server: str,
    ring: Ring | None,
    holders: list[Holder],
    ttl: float,
    step: keyring.Step | None = None,
) -> RingStatus:
    """A ring's rotation without its keys. Without ``step`` (no step was asked for), what the
    next step would wait for now."""
    shown = [RingHolder(pod=h.pod, revision=h.revision) for h in holders]
    if ring is None:  # no pod has loaded it yet
        return RingStatus(
            namespace=namespace,
            server=server,
            revision=None,
            phase=Phase.STEADY.value,
            ttl_seconds=ttl,
            started_at=None,
            switched_at=None,
            drop_due=None,
            holders=shown,
            behind=[],
            waiting=None,
        )
    outlook = step or keyring.advance(ring, holders, time.time())
    return RingStatus(
        namespace=namespace,
        server=server,
        revision=ring.revision,
        phase=ring.phase.value,
        ttl_seconds=ring.ttl,
        updated_at=ring.updated_at,
        started_at=ring.started_at,
        switched_at=ring.switched_at,
        drop_due=keyring.drop_due(ring),
        holders=shown,
        behind=list(step.behind if step else keyring.behind(ring, holders)),
        waiting=outlook.waiting,
        advanced=bool(step and step.advanced),
    )


@router.get("/servers/{namespace}/{server}/request-state/ring", response_model=RequestStateRing)
async def load_ring(
    namespace: NameParam,
    server: NameParam,
    store: Store,
    rules: Rules,
    settings: Config,
    caller: AnyCaller,
    notifier: RingNotifier,
    since: SinceParam = None,
    wait: WaitParam = 0.0,
) -> Response:
    """The server's key ring, made on first use. Only the server's own pods may load it. With
    ``since`` and ``wait``, held until the ring's revision passes ``since`` or the wait ends:
    a replica learns of a rotation's step when it is taken, instead of on a timer."""
    await rules.check_ring_read(caller, namespace, server)

    async def loaded() -> bytes:
        ring = await store.ring(namespace, server, settings.request_state_ttl_seconds)
        body = RequestStateRing(
            namespace=namespace,
            server=server,
            revision=ring.revision,
            phase=ring.phase.value,
            ttl_seconds=ring.ttl,
            keys=[base64.b64encode(k).decode() for k in ring.keys],
        )
        return body.model_dump_json().encode()

    held = held_seconds(since, wait, settings)
    if held is not None:
        assert since is not None  # held_seconds holds only a poll with a since

        # The ring is one per server: its waiters share one read of it per change.
        share = (namespace, server)
        return held_poll(notifier, store, namespace, server, since, held, lambda _: loaded(), share)
    return Response(await loaded(), media_type="application/json")


@router.put("/epochs/{process_epoch}/request-state", response_model=RingHeld)
async def report_ring(
    parsed: TargetProcessEpoch,
    body: RingReport,
    store: Store,
    rules: Rules,
    caller: AnyCaller,
    notifier: RingNotifier,
) -> RingHeld:
    """The process (a process epoch) holds ring ``revision``: it opens with all its keys and
    seals with the first. Sent after the process switched, never before."""
    await rules.check_own_epoch(caller, parsed.pod.generation)
    step = await store.report_ring(parsed.pod.generation, parsed.incarnation, body.revision)
    if step.advanced:
        notifier.notify_server(step.ring.namespace, step.ring.server, step.ring.revision)
    return RingHeld(revision=body.revision, current_revision=step.ring.revision)


@router.get("/servers/{namespace}/{server}/request-state", response_model=RingStatus)
async def ring_status(
    namespace: NameParam, server: NameParam, store: Store, settings: Config, _: Operator
) -> RingStatus:
    """The ring's rotation: phase, revision, and the revision every live pod holds."""
    ring, holders = await store.ring_status(namespace, server)
    return status_of(namespace, server, ring, holders, settings.request_state_ttl_seconds)


@router.post("/servers/{namespace}/{server}/request-state/rotate", response_model=RingStatus)
async def rotate_ring(
    namespace: NameParam,
    server: NameParam,
    store: Store,
    settings: Config,
    notifier: RingNotifier,
    _: Operator,
) -> RingStatus:
    """Begin a rotation: a fresh key joins the ring (409 while a rotation is under way)."""
    ttl = settings.request_state_ttl_seconds
    try:
        ring, holders = await store.rotate_ring(namespace, server, ttl)
    except RotationInProgress as exc:
        raise ApiError(409, "rotation-in-progress", str(exc)) from None
    notifier.notify_server(namespace, server, ring.revision)
    return status_of(namespace, server, ring, holders, ttl)


@router.post("/servers/{namespace}/{server}/request-state/advance", response_model=RingStatus)
async def advance_ring(
    namespace: NameParam,
    server: NameParam,
    store: Store,
    settings: Config,
    notifier: RingNotifier,
    _: Operator,
) -> RingStatus:
    """At most one step of the rotation under way: taken only once every live pod holds the
    current revision (and, to drop the old key, one TTL after they all sealed with the new)."""
    ttl = settings.request_state_ttl_seconds
    step, holders = await store.advance_ring(namespace, server, ttl)
    if step.advanced:
        notifier.notify_server(namespace, server, step.ring.revision)
    return status_of(namespace, server, step.ring, holders, ttl, step)
