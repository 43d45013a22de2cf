"""Pure decisions: what a pod's state means for its epoch (docs/design.md, "Epochs").

``pending`` (issued at admission) → ``live`` (the pod was seen: bind its name and UID) →
``draining`` (the pod has a deletion timestamp) → ``retired`` (the pod is gone). Every step is
preceded by a bind, because the service only drains or retires bound epochs and a bind also
proves the epoch belongs to *this* pod (a pod-mismatch stops the chain, so a pod carrying a
copied annotation can never retire another pod's epoch).

A pod in a terminal phase (Succeeded/Failed) is retired at once: no process of it will ever
serve again, even though the object may linger until garbage collection.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from mcp_epoch.contract import PORT_ANNOTATION, PodEpoch
from mcp_epoch_operator.names import EPOCH_ANNOTATION, SERVER_LABEL
from mcp_epoch_operator.resources import PORT_NAME


class Stage(IntEnum):
    """How far a pod's epoch must be moved; ordered, so "already done" is a comparison."""

    BOUND = 1
    DRAINING = 2
    RETIRED = 3


VERBS: dict[Stage, tuple[str, ...]] = {
    Stage.BOUND: ("bind",),
    Stage.DRAINING: ("bind", "drain"),
    Stage.RETIRED: ("bind", "retire"),
}


@dataclass(frozen=True, slots=True)
class PodEpochRef:
    """A pod that carries an epoch annotation, reduced to what the ledger calls need."""

    namespace: str
    server: str
    pod_name: str
    pod_uid: str
    epoch: str
    address: str | None = None  # podIP:port once the pod has an IP


@dataclass(frozen=True, slots=True)
class Call:
    """One ledger call: ``verb`` is bind, drain or retire (a bind also records the address)."""

    verb: str
    epoch: str
    pod_name: str
    pod_uid: str
    address: str | None = None


def address_of(pod: dict[str, Any]) -> str | None:
    """Where the pod serves MCP, from the API server: ``podIP:port`` (``[v6]:port``).

    The port is the pod's ``mcp.epochs.dev/port`` annotation, else its container port named
    ``mcp``, else the first container port; no IP or no port means no address (yet)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    annotated = ((pod.get("metadata") or {}).get("annotations") or {}).get(PORT_ANNOTATION)
    port: int | None = None
    if annotated and annotated.isdigit() and 0 < int(annotated) < 65536:
        port = int(annotated)
    else:
        ports = [
            p
            for c in (pod.get("spec") or {}).get("containers") or []
            for p in c.get("ports") or []
            if isinstance(p.get("containerPort"), int)
        ]
        named = [p for p in ports if p.get("name") == PORT_NAME]
        if named or ports:
            port = int((named or ports)[0]["containerPort"])
    if port is None:
        return None
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def epoch_of(pod: dict[str, Any]) -> PodEpochRef | None:
    """The epoch a pod carries, or None (no annotation, malformed, or not yet persisted)."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(EPOCH_ANNOTATION)
    server = (meta.get("labels") or {}).get(SERVER_LABEL)
    if not raw or not server or not meta.get("uid") or not meta.get("name"):
        return None
    try:
        PodEpoch.parse(raw)
    except ValueError:
        return None
    return PodEpochRef(
        namespace=meta.get("namespace", ""),
        server=server,
        pod_name=meta["name"],
        pod_uid=meta["uid"],
        epoch=raw,
        address=address_of(pod),
    )


def wanted_stage(pod: dict[str, Any], deleted: bool) -> Stage:
    """Where the pod's epoch belongs given the pod as seen (``deleted``: the pod is gone)."""
    if deleted:
        return Stage.RETIRED
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return Stage.RETIRED
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return Stage.DRAINING
    return Stage.BOUND


def calls_for(
    ref: PodEpochRef, stage: Stage, done: Stage | None = None, bound_address: str | None = None
) -> list[Call]:
    """The ledger calls that move ``ref``'s epoch to ``stage``; none if ``done`` reached it,
    except a bind again when a live pod's address is new (its IP comes after it is seen)."""
    if done is not None and done >= stage:
        if stage is Stage.BOUND and ref.address and ref.address != bound_address:
            return [Call("bind", ref.epoch, ref.pod_name, ref.pod_uid, ref.address)]
        return []
    return [Call(verb, ref.epoch, ref.pod_name, ref.pod_uid, ref.address) for verb in VERBS[stage]]


def pod_event_calls(
    event_type: str,
    pod: dict[str, Any],
    done: Stage | None = None,
    bound_address: str | None = None,
) -> tuple[PodEpochRef | None, Stage | None, list[Call]]:
    """A watch event on a labelled pod → (its epoch, the stage it must reach, the calls)."""
    ref = epoch_of(pod)
    if ref is None:
        return None, None, []
    stage = wanted_stage(pod, deleted=event_type == "DELETED")
    return ref, stage, calls_for(ref, stage, done, bound_address)
