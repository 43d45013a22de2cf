"""Pure status of an McpServer: counts, the live epochs, and conditions a person can act on."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from mcp_epoch.contract import ACTIVE_STATES, EPOCH_ANNOTATION
from mcp_epoch_operator.resources import selector_string

#: status.epochs is for people and dashboards; the ledger is the full record.
MAX_LISTED_EPOCHS = 50


@dataclass(frozen=True, slots=True)
class Reachability:
    """The operator's latest knowledge of the epoch service."""

    reachable: bool
    url: str
    message: str = ""


#: The timestamps the operator writes (Kubernetes' RFC 3339, seconds, UTC).
ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def iso_of(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime(ISO_FORMAT)


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime(ISO_FORMAT)


def condition(
    previous: list[dict[str, Any]],
    type_: str,
    ok: bool,
    reason: str,
    message: str,
    generation: int | None,
    now: str,
) -> dict[str, Any]:
    """A condition whose lastTransitionTime only moves when its status flips."""
    status = "True" if ok else "False"
    last = next((c for c in previous if c.get("type") == type_), None)
    since = last["lastTransitionTime"] if last and last.get("status") == status else now
    out: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def epoch_entries(
    ledger_epochs: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Active epochs (live, draining, and pending ones a pod carries), newest first, with
    their pods. A pending epoch no pod carries is left out: the admission pool issues epochs
    ahead of their pods (``docs/admission.md``)."""
    by_uid = {(p.get("metadata") or {}).get("uid"): p for p in pods}
    carried = {
        ((p.get("metadata") or {}).get("annotations") or {}).get(EPOCH_ANNOTATION) for p in pods
    }
    entries = []
    for e in sorted(ledger_epochs, key=lambda e: -int(e["generation"])):
        if e["state"] not in ACTIVE_STATES:
            continue
        if e["state"] == "pending" and e["epoch"] not in carried:
            continue
        entry: dict[str, Any] = {
            "epoch": e["epoch"],
            "generation": int(e["generation"]),
            "state": e["state"],
        }
        if e.get("pod_name"):
            entry["pod"] = e["pod_name"]
        if e.get("pod_uid"):
            entry["podUID"] = e["pod_uid"]
            pod = by_uid.get(e["pod_uid"])
            if pod is not None:
                entry["podPhase"] = (pod.get("status") or {}).get("phase", "Unknown")
        if e.get("process_epoch"):
            entry["processEpoch"] = e["process_epoch"]
        entries.append(entry)
    return entries[:MAX_LISTED_EPOCHS]


def _ready(pod: dict[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def build_status(
    mcps: dict[str, Any],
    deployment: dict[str, Any] | None,
    ledger_epochs: list[dict[str, Any]] | None,
    pods: list[dict[str, Any]],
    reach: Reachability,
    *,
    now: str | None = None,
    problem: str | None = None,
) -> dict[str, Any]:
    """The whole ``status`` of an McpServer.

    ``ledger_epochs`` None means the ledger could not be read: the epoch list and the newest
    generation keep their previous values rather than flapping to empty.
    """
    now = now or now_iso()
    meta = mcps["metadata"]
    generation = meta.get("generation")
    spec = mcps.get("spec") or {}
    previous = (mcps.get("status") or {}).get("conditions") or []
    old = mcps.get("status") or {}
    desired = int(spec.get("replicas", 1))
    dstatus = (deployment or {}).get("status") or {}
    replicas = int(dstatus.get("replicas") or 0)
    ready = int(dstatus.get("readyReplicas") or 0)
    updated = int(dstatus.get("updatedReplicas") or 0)

    if ledger_epochs is None:
        epochs = old.get("epochs") or []
        newest = old.get("newestGeneration")
    else:
        epochs = epoch_entries(ledger_epochs, pods)
        live_gens = [e["generation"] for e in epochs if e["state"] == "live"]
        newest = max(live_gens) if live_gens else old.get("newestGeneration")

    live_uids = {e.get("podUID") for e in epochs if e["state"] == "live"}
    serving = [
        p for p in pods if _ready(p) and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]
    unepoched = [
        p["metadata"]["name"] for p in serving if p["metadata"].get("uid") not in live_uids
    ]

    conditions = [
        _ready_condition(previous, desired, ready, unepoched, deployment, problem, generation, now),
        _progressing_condition(
            previous, deployment, desired, replicas, updated, ready, generation, now
        ),
        condition(
            previous,
            "EpochServiceReachable",
            reach.reachable,
            "Reachable" if reach.reachable else "Unreachable",
            (
                f"epoch service at {reach.url} answers"
                if reach.reachable
                else f"epoch service at {reach.url} does not answer: {reach.message}. New pods "
                "of this server are refused until it does; check the epoch service Deployment "
                "and the operator's --epoch-service-url."
            ),
            generation,
            now,
        ),
    ]
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "replicas": replicas,
        "readyReplicas": ready,
        "updatedReplicas": updated,
        "selector": selector_string(meta["name"]),
        "epochs": epochs,
        "conditions": conditions,
    }
    if newest is not None:
        status["newestGeneration"] = int(newest)
    return status


def _ready_condition(
    previous: list[dict[str, Any]],
    desired: int,
    ready: int,
    unepoched: list[str],
    deployment: dict[str, Any] | None,
    problem: str | None,
    generation: int | None,
    now: str,
) -> dict[str, Any]:
    if problem:
        return condition(previous, "Ready", False, "ReconcileFailed", problem, generation, now)
    if deployment is None:
        return condition(
            previous,
            "Ready",
            False,
            "DeploymentMissing",
            "the Deployment of this McpServer does not exist yet; the operator creates it",
            generation,
            now,
        )
    if ready < desired:
        return condition(
            previous,
            "Ready",
            False,
            "ReplicasNotReady",
            f"{ready} of {desired} replicas are ready; see `kubectl get pods -l "
            f"mcp.epochs.dev/server={deployment['metadata']['name']}` for the others",
            generation,
            now,
        )
    if unepoched:
        return condition(
            previous,
            "Ready",
            False,
            "EpochsNotLive",
            f"ready pods without a live epoch: {', '.join(sorted(unepoched)[:5])}; the operator "
            "binds them when it sees them (is the epoch service reachable?)",
            generation,
            now,
        )
    return condition(
        previous,
        "Ready",
        True,
        "AllReplicasReady",
        f"{ready} of {desired} replicas are ready, each with a live epoch",
        generation,
        now,
    )


def _progressing_condition(
    previous: list[dict[str, Any]],
    deployment: dict[str, Any] | None,
    desired: int,
    replicas: int,
    updated: int,
    ready: int,
    generation: int | None,
    now: str,
) -> dict[str, Any]:
    if deployment is None:
        return condition(
            previous, "Progressing", True, "Creating", "creating the Deployment", generation, now
        )
    dmeta = deployment.get("metadata") or {}
    dstatus = deployment.get("status") or {}
    for c in dstatus.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            return condition(
                previous,
                "Progressing",
                False,
                "ProgressDeadlineExceeded",
                f"the rollout is stuck: {c.get('message', '')}",
                generation,
                now,
            )
    stale = (dstatus.get("observedGeneration") or 0) < (dmeta.get("generation") or 0)
    if stale or updated < desired or replicas != desired or ready < desired:
        return condition(
            previous,
            "Progressing",
            True,
            "RollingOut",
            f"rolling out: {updated} of {desired} replicas updated, {ready} ready, "
            f"{replicas} in total",
            generation,
            now,
        )
    return condition(
        previous,
        "Progressing",
        False,
        "Complete",
        f"rollout complete: {desired} replicas on the current template",
        generation,
        now,
    )
