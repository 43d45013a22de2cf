"""When to rotate an McpServer's request-state key ring, and how its rotation shows, as plain
functions. The epoch service holds the ring and refuses any step a live pod has not caught up
with (``epochsvc.service.keyring``), and takes each step that waits for pods at the report
of the last one. The operator decides when to begin, asks for the one step that waits for
time (the old key's drop, one TTL after every pod sealed anew) when it is due, and tells
people what the rotation waits for.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from mcp_epoch.api import RingStatus
from mcp_epoch.contract import ROTATE_ANNOTATION
from mcp_epoch_operator.status import ISO_FORMAT, condition, iso_of

CONDITION = "RequestStateRing"
#: On a plain labelled Deployment: the value of ROTATE_ANNOTATION last acted on.
HANDLED_ANNOTATION = f"{ROTATE_ANNOTATION}-handled"
#: While a rotation waits for pods, the server's status is looked at again this often. The
#: steps themselves wait for nobody's look: the epoch service takes a step at the report of
#: the last pod it waited for, and a pod that leaves wakes the operator through its watch.
STATUS_SECONDS = 5.0
#: After a rotation begins, the first look comes sooner: pods usually load the new ring in
#: about a second, and the status should say so.
FIRST_LOOK_SECONDS = 1.0
#: A step that waits for the same pods this long is reported as stalled.
STALL_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Begin:
    """A rotation to begin, and why (the on-demand value, if that is the reason)."""

    why: str
    request: str | None


def _seconds(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return dt.datetime.strptime(iso, ISO_FORMAT).replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None


def _steady(ring: RingStatus) -> bool:
    """A ring that exists and has no rotation under way: the only one a rotation may begin on."""
    return ring.revision is not None and ring.phase == "steady"


def _requested(value: Any, handled: Any) -> Begin | None:
    """The on-demand annotation has a value not yet acted on."""
    if value and value != handled:
        return Begin(f"asked for ({ROTATE_ANNOTATION}={value})", str(value))
    return None


def asked(annotations: dict[str, Any], ring: RingStatus) -> Begin | None:
    """A plain Deployment's on-demand rotation (the value acted on is in an annotation)."""
    if not _steady(ring):
        return None
    return _requested(annotations.get(ROTATE_ANNOTATION), annotations.get(HANDLED_ANNOTATION))


def due(mcps: dict[str, Any], ring: RingStatus, now: float) -> Begin | None:
    """A rotation to begin now, if the ring is steady and one is asked for or scheduled."""
    if not _steady(ring):
        return None
    meta = mcps.get("metadata") or {}
    state = (mcps.get("status") or {}).get("requestState") or {}
    value = (meta.get("annotations") or {}).get(ROTATE_ANNOTATION)
    requested = _requested(value, state.get("rotationRequest"))
    if requested is not None:
        return requested
    interval = int(
        ((mcps.get("spec") or {}).get("requestState") or {}).get("rotationIntervalSeconds") or 0
    )
    if interval <= 0:
        return None
    last = _seconds(state.get("lastRotationStartedAt")) or _seconds(meta.get("creationTimestamp"))
    if last is None or now - last >= interval:
        return Begin(f"scheduled every {interval}s", None)
    return None


def rotating(ring: RingStatus) -> bool:
    return ring.revision is not None and ring.phase != "steady"


def next_look(ring: RingStatus, begun: Begin | None, now: float) -> float | None:
    """When to look at the ring again: ``None`` with no rotation under way; the moment the
    old key may leave (the one step that waits for time, not for a pod, so the operator
    takes it, on time); else a refresh of what the status shows."""
    if begun is not None:
        return FIRST_LOOK_SECONDS
    if not rotating(ring):
        return None
    if ring.drop_due is not None and ring.drop_due > now:
        return ring.drop_due - now + 0.05  # just past it (the service steps at >= drop_due)
    if ring.drop_due is not None:
        return FIRST_LOOK_SECONDS  # due, and the service's clock did not agree yet
    return STATUS_SECONDS


def build_request_state(
    previous: dict[str, Any], ring: RingStatus, begun: Begin | None, now: float
) -> dict[str, Any]:
    """``status.requestState``: the rotation's progress, never a key."""
    pods = len(ring.holders)
    out: dict[str, Any] = {
        "revision": ring.revision,
        "phase": ring.phase,
        "pods": pods,
        "podsAtRevision": pods - len(ring.behind),
        "behind": ring.behind[:20],
    }
    for key in ("lastRotationStartedAt", "rotationRequest"):
        if previous.get(key):
            out[key] = previous[key]
    if begun is not None:
        out["lastRotationStartedAt"] = iso_of(now)
        if begun.request is not None:
            out["rotationRequest"] = begun.request
    if ring.waiting:
        out["waiting"] = ring.waiting
    for key, ts in (("rotationStartedAt", ring.started_at), ("dropDue", ring.drop_due)):
        if ts is not None:
            out[key] = iso_of(ts)
    return {k: v for k, v in out.items() if v is not None}


def stalled(ring: RingStatus, now: float, after: float = STALL_SECONDS) -> bool:
    """Pods behind the current step for longer than ``after`` seconds."""
    return bool(ring.behind) and rotating(ring) and now - (ring.updated_at or now) > after


def stall_message(ring: RingStatus) -> str:
    return (
        f"the rotation waits at revision {ring.revision} ({ring.phase}) for pods that do not "
        f"hold it: {', '.join(ring.behind[:5])}. No key they may use is removed; a pod that "
        "never reports (an old library, a fallback epoch) catches up when it restarts"
    )


def ring_condition(
    previous: list[dict[str, Any]],
    ring: RingStatus,
    now: float,
    generation: int | None,
    stall_after: float = STALL_SECONDS,
) -> dict[str, Any]:
    at = iso_of(now)
    if stalled(ring, now, stall_after):
        return condition(
            previous, CONDITION, False, "RotationStalled", stall_message(ring), generation, at
        )
    if rotating(ring):
        return condition(
            previous,
            CONDITION,
            True,
            "Rotating",
            f"rotating: revision {ring.revision} ({ring.phase}); {ring.waiting or 'stepping on'}",
            generation,
            at,
        )
    return condition(
        previous,
        CONDITION,
        True,
        "Steady",
        f"every replica seals and opens with ring revision {ring.revision}",
        generation,
        at,
    )
