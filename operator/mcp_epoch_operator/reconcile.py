"""What the operator does for one server: pod events move epochs at once, and a reconcile
brings the owned objects, the ledger and the status in line.

Plain functions of the :class:`~mcp_epoch_operator.runtime.Runtime` (its clients and what it
remembers), so tests call them directly with fake clients.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mcp_epoch import api, api_client
from mcp_epoch.api import RingStatus
from mcp_epoch.api_client import EpochServiceError, EpochServiceUnavailable
from mcp_epoch.contract import ACTIVE_STATES
from mcp_epoch_operator import lifecycle, resync, rotation, status
from mcp_epoch_operator.epochs import BACKGROUND_POLICY, PROBE_POLICY
from mcp_epoch_operator.kube import KubeError
from mcp_epoch_operator.names import SERVER_LABEL
from mcp_epoch_operator.resources import build_deployment, build_service

if TYPE_CHECKING:
    from mcp_epoch_operator.runtime import Runtime

log = logging.getLogger("mcp_epoch_operator")
Key = tuple[str, str]


async def pod_event(rt: Runtime, event_type: str, pod: dict[str, Any]) -> None:
    """A watch event on a labelled pod: move its epoch, then refresh the server's status."""
    meta = pod.get("metadata") or {}
    server = (meta.get("labels") or {}).get(SERVER_LABEL)
    if not server or not meta.get("namespace"):
        return
    key = (meta["namespace"], server)
    uid = meta.get("uid", "")
    ref, stage, calls = lifecycle.pod_event_calls(
        event_type, pod, rt.done.get(uid), rt.addressed.get(uid)
    )
    if ref is not None and stage is not None and calls and await run_calls(rt, key, calls):
        rt.done[uid] = max(stage, rt.done.get(uid, stage))
        if ref.address:
            rt.addressed[uid] = ref.address
    if event_type == "DELETED":
        rt.done.pop(uid, None)
        rt.addressed.pop(uid, None)
    rt.mark(*key)


async def run_calls(rt: Runtime, key: Key, calls: list[lifecycle.Call]) -> bool:
    """Make the calls in order; stop at the first failure (a failed bind means the epoch is
    not this pod's, so nothing after it may run). True if all succeeded."""
    for call in calls:
        try:
            await rt.svc_call(
                api.lifecycle(call.verb, call.epoch, call.pod_name, call.pod_uid, call.address)
            )
        except EpochServiceUnavailable as exc:
            log.warning(
                "%s %s postponed, epoch service unavailable: %s", call.verb, call.epoch, exc
            )
            return False
        except EpochServiceError as exc:
            if call.verb == "drain" and exc.code == "illegal-transition":
                continue  # already retired: the pod went away faster than we drained
            log.warning(
                "%s of epoch %s for pod %s failed: %s", call.verb, call.epoch, call.pod_name, exc
            )
            rt.events.post(
                key,
                "Warning",
                "EpochLifecycleFailed",
                f"could not {call.verb} epoch {call.epoch} of pod {call.pod_name}: "
                f"{exc.message} ({exc.code})",
            )
            return False
        if call.verb == "retire":
            rt.events.retired(key, call.epoch, call.pod_name)
    return True


async def ledger_of(
    rt: Runtime, ns: str, name: str, policy: api_client.RetryPolicy | None = None
) -> list[dict[str, Any]]:
    """The server's epochs as the plain dicts the resync and status functions take."""
    listing = await rt.svc_call(api.list_server(ns, name), policy)
    return [e.model_dump(mode="json") for e in listing.epochs]


async def sync_server(rt: Runtime, key: Key, reapply: bool) -> None:
    """Owned objects (if an McpServer), ledger vs pods, then status."""
    ns, name = key
    mcps = await rt.kube.get_mcpserver(ns, name)
    problem: str | None = None
    if mcps is not None and not mcps["metadata"].get("deletionTimestamp"):
        stamp = (mcps["metadata"]["uid"], int(mcps["metadata"].get("generation") or 0))
        if reapply or rt.applied.get(key) != stamp:
            problem = await apply_owned(rt, key, mcps)
            if problem is None:
                rt.applied[key] = stamp

    # The ledger first, the pods second: see resync.py for why the order matters.
    ledger: list[dict[str, Any]] | None
    try:
        policy = BACKGROUND_POLICY if rt.reach.reachable else PROBE_POLICY
        ledger = await ledger_of(rt, ns, name, policy)
    except (EpochServiceUnavailable, EpochServiceError) as exc:
        log.info("ledger of %s/%s not readable: %s", ns, name, exc)
        ledger = None
    pods = await rt.kube.list_pods(ns, f"{SERVER_LABEL}={name}")
    if ledger is not None:
        plan = resync.plan_resync(ledger, pods)
        if plan.calls:
            log.info(
                "resync %s/%s: %s", ns, name, ", ".join(f"{c.verb} {c.epoch}" for c in plan.calls)
            )
            await run_calls(rt, key, plan.calls)
            ledger = await ledger_of(rt, ns, name)
        if plan.pending_without_pod:
            log.debug(
                "%s/%s: pending epochs without a pod (the service abandons them after its "
                "pending timeout): %s",
                ns,
                name,
                ", ".join(plan.pending_without_pod),
            )
    if mcps is None:
        plain = await rt.kube.get_deployment(ns, name) if pods else None
        if plain is not None:
            await sync_plain_ring(rt, key, plain)
        if ledger is not None and not pods and not any(e["state"] in ACTIVE_STATES for e in ledger):
            # Nothing left to watch for: forget the server until it shows up again.
            rt.forget(key)
            await rt.servers.record(key, present=False)
        return
    deployment = await rt.kube.get_deployment(ns, name)
    new_status = status.build_status(mcps, deployment, ledger, pods, rt.reach, problem=problem)
    await sync_ring(rt, key, mcps, new_status)
    if new_status != (mcps.get("status") or {}):
        try:
            await rt.kube.patch_mcpserver_status(ns, name, new_status)
        except KubeError as exc:
            if exc.status != 404:
                raise


async def apply_owned(rt: Runtime, key: Key, mcps: dict[str, Any]) -> str | None:
    """Server-side apply the Deployment and the Service; a problem message on failure."""
    ns, name = key
    try:
        await rt.kube.apply_deployment(ns, name, build_deployment(mcps, rt.config.replica))
        await rt.kube.apply_service(ns, name, build_service(mcps))
    except KubeError as exc:
        message = f"could not apply the Deployment/Service: {exc}"
        log.warning("%s/%s: %s", ns, name, message)
        rt.events.post(key, "Warning", "ReconcileFailed", message)
        return message
    return None


async def step_ring(
    rt: Runtime, key: Key, begin: Callable[[RingStatus, float], rotation.Begin | None]
) -> tuple[RingStatus, rotation.Begin | None, float] | None:
    """The request-state key ring: begin a rotation when ``begin`` says one is due, or ask the
    service to step the rotation under way on (it refuses while a live pod lags); look again
    soon while rotating. None when the ring cannot be read."""
    ns, name = key
    begun = None
    try:
        ring = await rt.svc_call(api.ring_status(ns, name), PROBE_POLICY)
        now = time.time()
        begun = begin(ring, now)
        if begun is not None:
            ring = await rt.svc_call(api.rotate_ring(ns, name))
            rt.events.post(
                key,
                "Normal",
                "RequestStateRotationStarted",
                f"rotating the request-state key ring ({begun.why}): revision {ring.revision}, "
                "a new key joins; each step waits for every live pod",
            )
        elif rotation.rotating(ring):
            ring = await rt.svc_call(api.advance_ring(ns, name))
    except (EpochServiceUnavailable, EpochServiceError) as exc:
        log.info("request-state ring of %s/%s not readable: %s", ns, name, exc)
        return None
    announce_step(rt, key, ring, begun)
    is_stalled = rotation.stalled(ring, now, rt.config.rotation_stall_seconds)
    rt.metrics.ring_stalled(key, is_stalled)
    if is_stalled and rt.stalls.get(key) != ring.revision:
        rt.stalls[key] = ring.revision  # loud once per stalled step
        message = rotation.stall_message(ring)
        rt.events.post(key, "Warning", "RequestStateRotationStalled", message)
        log.warning("%s/%s: %s", ns, name, message)
    later = rotation.next_look(ring, begun, now)
    if later is not None:
        rt.mark_later(key, later)
    return ring, begun, now


def announce_step(rt: Runtime, key: Key, ring: RingStatus, begun: rotation.Begin | None) -> None:
    """An Event for each phase the ring has moved to since the operator last looked. The
    service takes the steps that wait for pods itself, at the last one's report, so a step
    shows here as a phase the operator had not seen, not as an answer to its own call."""
    seen = rt.ring_phases.get(key)
    rt.ring_phases[key] = ring.phase
    if begun is not None or seen is None or seen == ring.phase:
        return
    done = ring.phase == "steady"
    rt.events.post(
        key,
        "Normal",
        "RequestStateRotated" if done else "RequestStateRotationAdvanced",
        f"request-state ring revision {ring.revision}: "
        + ("the old key has left the ring" if done else f"{seen} -> {ring.phase}"),
    )


async def sync_ring(
    rt: Runtime, key: Key, mcps: dict[str, Any], new_status: dict[str, Any]
) -> None:
    """An McpServer's ring, shown in ``status.requestState`` and a condition."""
    old = (mcps.get("status") or {}).get("requestState") or {}
    stepped = await step_ring(rt, key, lambda ring, now: rotation.due(mcps, ring, now))
    if stepped is None:
        if old:
            new_status["requestState"] = old  # unknown now: keep the last picture
        return
    ring, begun, now = stepped
    if ring.revision is None:
        return  # no pod has loaded a ring yet: nothing to show
    new_status["requestState"] = rotation.build_request_state(old, ring, begun, now)
    previous = (mcps.get("status") or {}).get("conditions") or []
    generation = mcps["metadata"].get("generation")
    cond = rotation.ring_condition(
        previous, ring, now, generation, rt.config.rotation_stall_seconds
    )
    new_status["conditions"] = [*new_status["conditions"], cond]


async def sync_plain_ring(rt: Runtime, key: Key, deployment: dict[str, Any]) -> None:
    """A labelled Deployment's ring: rotated on demand by its annotation, the value acted on
    recorded in another annotation (a Deployment has no status of ours)."""
    ns, name = key
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    stepped = await step_ring(rt, key, lambda ring, _: rotation.asked(annotations, ring))
    if stepped is None or stepped[1] is None:
        return
    try:
        await rt.kube.annotate_deployment(
            ns, name, {rotation.HANDLED_ANNOTATION: stepped[1].request}
        )
    except KubeError as exc:
        log.warning("%s/%s: could not record the rotation request: %s", ns, name, exc)
