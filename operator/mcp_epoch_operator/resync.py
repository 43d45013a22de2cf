"""Pure diff of the ledger against the pods that exist, for one server.

The watch can miss things: the operator may be stopped while pods come and go. The resync
lists the ledger *first* and the pods *second* (a fresh API read, not a cache): an epoch the
ledger shows bound to pod UID X was bound after X was seen, so if X is missing from a later
list, X is really gone and the epoch is retired. Listing in the other order could retire the
epoch of a pod created between the two reads.

Pending epochs whose pod never appeared cannot be moved by the operator (the service has no
abandon call for it); the service abandons them itself after EPOCHSVC_PENDING_TIMEOUT_SECONDS.
They are reported, so status can show them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mcp_epoch.contract import ACTIVE_STATES
from mcp_epoch_operator.lifecycle import Call, Stage, calls_for, epoch_of, wanted_stage


@dataclass
class ResyncPlan:
    """Calls to make, and what could not be reconciled (for status and logs)."""

    calls: list[Call] = field(default_factory=list)
    #: pending epochs with no pod carrying them (left to the service's pending timeout)
    pending_without_pod: list[str] = field(default_factory=list)
    #: pods whose annotation names an epoch this ledger does not list for this server
    unknown_pod_epochs: list[str] = field(default_factory=list)
    #: epochs retired because their pod is gone
    retired: list[str] = field(default_factory=list)


def plan_resync(ledger_epochs: list[dict[str, Any]], pods: list[dict[str, Any]]) -> ResyncPlan:
    """Decide every call that makes the ledger agree with ``pods`` (all of one server)."""
    plan = ResyncPlan()
    by_epoch = {e["epoch"]: e for e in ledger_epochs}
    pod_by_uid: dict[str, dict[str, Any]] = {}
    pod_by_epoch: dict[str, dict[str, Any]] = {}
    for pod in pods:
        uid = (pod.get("metadata") or {}).get("uid")
        if uid:
            pod_by_uid[uid] = pod
        ref = epoch_of(pod)
        if ref is not None:
            pod_by_epoch[ref.epoch] = pod
            if ref.epoch not in by_epoch:
                plan.unknown_pod_epochs.append(ref.epoch)

    for epoch in sorted(ledger_epochs, key=lambda e: int(e["generation"])):
        state = epoch["state"]
        if state not in ACTIVE_STATES:
            continue
        name = epoch["epoch"]
        if state == "pending":
            carrier = pod_by_epoch.get(name)
            if carrier is None:
                plan.pending_without_pod.append(name)
                continue
            ref = epoch_of(carrier)
            assert ref is not None
            plan.calls.extend(calls_for(ref, wanted_stage(carrier, deleted=False)))
            continue
        bound_pod = pod_by_uid.get(epoch.get("pod_uid") or "")
        if bound_pod is None:
            # Gone while nobody watched: retire (live and draining both allow it).
            plan.calls.append(Call("retire", name, epoch.get("pod_name") or "", epoch["pod_uid"]))
            plan.retired.append(name)
            continue
        ref = epoch_of(bound_pod)
        if ref is None or ref.epoch != name:
            continue  # the pod carries another epoch; the ledger's binding is authoritative
        stage = wanted_stage(bound_pod, deleted=False)
        done = Stage.DRAINING if state == "draining" else Stage.BOUND
        for call in calls_for(ref, stage, done):
            if call.verb != "bind":  # already bound; only the further step is needed
                plan.calls.append(call)
        if stage is Stage.RETIRED:
            plan.retired.append(name)
    return plan
