"""What was read about one server → its status, and every problem with what to do (pure).

The inputs are what the API server and the epoch service answered, as JSON (tests build them
by hand in the same shapes). The judgement reuses the operator's own pure functions, so this
command and the operator's ``.status`` can never disagree on what "ready" or "stalled" means:
:func:`mcp_epoch_operator.status.build_status` gives the Ready / Progressing conditions from the
pods and ledger read *now*, :mod:`mcp_epoch_operator.rotation` the ring's condition and stall,
:func:`mcp_epoch_operator.resync.plan_resync` the epochs and pods that disagree.

The result is one JSON-ready dict whose keys are stable (docs/status.md lists them); the text
view renders exactly that dict, so ``-o json`` carries the same information.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mcp_epoch.api import RingStatus
from mcp_epoch_operator import rotation, status
from mcp_epoch_operator.lifecycle import address_of
from mcp_epoch_operator.names import EPOCH_ANNOTATION, SERVER_LABEL
from mcp_epoch_operator.resync import plan_resync

Kind = Literal["McpServer", "Deployment"]
Severity = Literal["error", "warning"]

#: The replica library's metrics that status reads from each pod (mcp_epoch/_internal/health).
HANDED_OFF = "mcp_epoch_sessions_handed_off_total"
ADOPTED = "mcp_epoch_sessions_adopted_total"
REGISTERED = "mcp_epoch_registered"
CREDENTIALS_REFUSED = "mcp_epoch_credentials_refused"
#: Ledger epochs listed in ``handoffs.recorded`` (the newest).
MAX_RECORDED_HANDOFFS = 5


@dataclass(frozen=True, slots=True)
class ServiceRead:
    """What the epoch service answered this command (``url`` None: none was found)."""

    url: str | None
    #: Where the URL came from: a flag, the environment, the operator's Deployment.
    url_source: str = ""
    #: Where the credential came from ("" when none was found).
    token_source: str = ""
    #: Why the service could not be asked at all (no URL, no answer, a 502-504).
    unreachable: str | None = None
    #: Why the service refused this command's credential or its listing.
    refused: str | None = None
    #: ``GET /v1/servers/{ns}/{server}/epochs`` (an ``EpochList``), tombstones included.
    ledger: dict[str, Any] | None = None
    #: ``GET .../request-state`` (a ``RingStatus``), or the reason it could not be read.
    ring: dict[str, Any] | None = None
    ring_error: str | None = None
    #: Something to say about the URL even when it answered (e.g. how to reach it).
    hint: str | None = None


@dataclass(frozen=True, slots=True)
class PodMetrics:
    """The samples of a pod's ``/metrics`` (by name, unlabelled), or why they are missing."""

    values: dict[str, float] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Gathered:
    """Everything one ``mcp-epoch status`` read, in the order it read it (ledger, then pods)."""

    namespace: str
    server: str
    kind: Kind
    mcpserver: dict[str, Any] | None
    deployment: dict[str, Any] | None
    pods: list[dict[str, Any]]
    service: ServiceRead
    now: float
    #: Pod name → its metrics; a pod not in here was not asked (``--no-metrics``, no address).
    metrics: dict[str, PodMetrics] = field(default_factory=dict)
    #: Where the operator runs, if found (its namespace and Deployment name).
    operator: str | None = None


@dataclass(frozen=True, slots=True)
class Problem:
    severity: Severity
    reason: str
    message: str
    action: str

    def as_dict(self) -> dict[str, str]:
        return {
            "severity": self.severity,
            "reason": self.reason,
            "message": self.message,
            "action": self.action,
        }


def _ready(pod: dict[str, Any]) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def _meta(obj: dict[str, Any] | None) -> dict[str, Any]:
    return (obj or {}).get("metadata") or {}


def _pod_order(pod: dict[str, Any]) -> tuple[str, int, str]:
    """Oldest first; pods of the same second in the order the ledger issued their epochs."""
    meta = _meta(pod)
    epoch = (meta.get("annotations") or {}).get(EPOCH_ANNOTATION) or ""
    generation = epoch.rpartition("-")[2]
    return (
        str(meta.get("creationTimestamp") or ""),
        int(generation) if generation.isdigit() else 1 << 62,
        str(meta.get("name") or ""),
    )


def _pod_row(
    pod: dict[str, Any],
    entry: dict[str, Any] | None,
    ring_of: dict[str, int | None],
    metrics: PodMetrics | None,
) -> dict[str, Any]:
    meta = _meta(pod)
    pstatus = pod.get("status") or {}
    epoch = (meta.get("annotations") or {}).get(EPOCH_ANNOTATION)
    row: dict[str, Any] = {
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "phase": pstatus.get("phase", "Unknown"),
        "ready": _ready(pod),
        "terminating": bool(meta.get("deletionTimestamp")),
        "podIP": pstatus.get("podIP"),
        "address": (entry or {}).get("address") or address_of(pod),
        "epoch": epoch,
        "epochState": (entry or {}).get("state"),
        "generation": (entry or {}).get("generation"),
        "incarnation": (entry or {}).get("incarnation"),
        "processEpoch": (entry or {}).get("process_epoch"),
        "ringRevision": ring_of.get(str(meta.get("name"))),
        "sessionsHandedOff": None,
        "sessionsAdopted": None,
        "registered": None,
        "credentialsRefused": None,
        "metricsError": None,
    }
    if metrics is not None:
        if metrics.values is not None:
            row["sessionsHandedOff"] = _int(metrics.values.get(HANDED_OFF))
            row["sessionsAdopted"] = _int(metrics.values.get(ADOPTED))
            registered = metrics.values.get(REGISTERED)
            row["registered"] = None if registered is None else bool(registered)
            row["credentialsRefused"] = bool(metrics.values.get(CREDENTIALS_REFUSED))
        else:
            row["metricsError"] = metrics.error
    return row


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _desired(g: Gathered) -> int:
    if g.mcpserver is not None:
        return int((g.mcpserver.get("spec") or {}).get("replicas", 1))
    return int(((g.deployment or {}).get("spec") or {}).get("replicas", 1))


def _subject(g: Gathered) -> dict[str, Any]:
    """The McpServer as ``status.build_status`` takes it; a plain Deployment stands in as an
    McpServer of the same name and replica count, with no stored status."""
    if g.mcpserver is not None:
        return g.mcpserver
    return {"metadata": {"name": g.server}, "spec": {"replicas": _desired(g)}}


def _reach(g: Gathered) -> status.Reachability:
    svc = g.service
    url = svc.url or "(none found)"
    if svc.unreachable is not None:
        return status.Reachability(False, url, svc.unreachable)
    return status.Reachability(True, url)


def build(g: Gathered) -> dict[str, Any]:
    """The status of one server, JSON-ready, problems included (see docs/status.md)."""
    svc = g.service
    ledger_epochs: list[dict[str, Any]] | None = (
        list((svc.ledger or {}).get("epochs") or []) if svc.ledger is not None else None
    )
    ring = RingStatus.model_validate(svc.ring) if svc.ring is not None else None
    ring_of: dict[str, int | None] = {h.pod: h.revision for h in ring.holders} if ring else {}

    by_epoch = {e["epoch"]: e for e in ledger_epochs or []}
    pods = sorted(g.pods, key=_pod_order)
    rows = []
    for pod in pods:
        epoch = (_meta(pod).get("annotations") or {}).get(EPOCH_ANNOTATION)
        rows.append(_pod_row(pod, by_epoch.get(epoch or ""), ring_of, g.metrics.get(_name(pod))))
    pod_uids = {_meta(p).get("uid") for p in pods}
    without_pod = [
        {
            "epoch": e["epoch"],
            "state": e["state"],
            "pod": e.get("pod_name"),
            "podUID": e.get("pod_uid"),
            "processEpoch": e.get("process_epoch"),
            "address": e.get("address"),
        }
        for e in sorted(ledger_epochs or [], key=lambda e: int(e["generation"]))
        if e["state"] in ("live", "draining") and e.get("pod_uid") not in pod_uids
    ]

    subject = _subject(g)
    previous = (subject.get("status") or {}).get("conditions") or []
    fresh = status.build_status(subject, g.deployment, ledger_epochs, pods, _reach(g), now=_iso(g))
    # Ready and Progressing as the operator would write them now; whether the *operator*
    # reaches the epoch service only it knows (this command's own reach is epochService).
    conditions = [c for c in fresh["conditions"] if c["type"] in ("Ready", "Progressing")]
    conditions += [c for c in previous if c.get("type") == "EpochServiceReachable"]
    generation = _meta(subject).get("generation")
    request_state: dict[str, Any] | None = None
    if ring is not None and ring.revision is not None:
        conditions.append(rotation.ring_condition(previous, ring, g.now, generation))
        old = (subject.get("status") or {}).get("requestState") or {}
        request_state = rotation.build_request_state(old, ring, None, g.now)
        request_state["stalled"] = rotation.stalled(ring, g.now)

    dstatus = (g.deployment or {}).get("status") or {}
    out: dict[str, Any] = {
        "namespace": g.namespace,
        "server": g.server,
        "kind": g.kind,
        "operator": g.operator,
        "replicas": {
            "desired": _desired(g),
            "current": int(dstatus.get("replicas") or 0),
            "ready": int(dstatus.get("readyReplicas") or 0),
            "updated": int(dstatus.get("updatedReplicas") or 0),
        },
        "epochService": {
            "url": svc.url,
            "urlFrom": svc.url_source or None,
            "tokenFrom": svc.token_source or None,
            "reachable": svc.url is not None and svc.unreachable is None,
            "error": svc.unreachable or svc.refused,
            "hint": svc.hint,
        },
        "ledger": _ledger_summary(svc.ledger),
        "pods": rows,
        "epochsWithoutPod": without_pod,
        "requestState": request_state,
        "handoffs": _handoffs(rows, ledger_epochs),
        "conditions": conditions,
        "operatorConditions": list(
            ((g.mcpserver or {}).get("status") or {}).get("conditions") or []
        ),
    }
    problems = _problems(g, out, ledger_epochs, ring)
    out["problems"] = [p.as_dict() for p in problems]
    out["healthy"] = not any(p.severity == "error" for p in problems)
    return out


def _name(pod: dict[str, Any]) -> str:
    return str(_meta(pod).get("name") or "")


def _iso(g: Gathered) -> str:
    return status.iso_of(g.now)


def _ledger_summary(ledger: dict[str, Any] | None) -> dict[str, Any] | None:
    if ledger is None:
        return None
    counts = {state: 0 for state in ("pending", "live", "draining", "retired", "abandoned")}
    for e in ledger.get("epochs") or []:
        counts[e["state"]] = counts.get(e["state"], 0) + 1
    return {"id": ledger.get("ledger_id"), "revision": ledger.get("revision"), "epochs": counts}


def _handoffs(rows: list[dict[str, Any]], ledger: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Sessions moved by drains: the counters of the processes running now (a process that
    handed its sessions on has exited since, so ``adopted`` is what the survivors took), and
    the handoff rules the ledger keeps (one per draining process, kept with its tombstone)."""
    read = [r for r in rows if r["sessionsAdopted"] is not None]
    rules = sorted(
        (e for e in ledger or [] if e.get("successor")),
        key=lambda e: -float(e.get("updated_at") or 0),
    )
    return {
        "sessionsHandedOff": sum(r["sessionsHandedOff"] or 0 for r in read) if read else None,
        "sessionsAdopted": sum(r["sessionsAdopted"] or 0 for r in read) if read else None,
        "podsRead": len(read),
        "podsUnread": [r["name"] for r in rows if r["sessionsAdopted"] is None],
        "rulesInLedger": len(rules),
        "recorded": [
            {"from": f"{e['epoch']}.{e['successor_of']}", "to": e["successor"]}
            for e in rules[:MAX_RECORDED_HANDOFFS]
        ],
    }


# ----------------------------------------------------------------------------- problems


def _problems(
    g: Gathered,
    out: dict[str, Any],
    ledger: list[dict[str, Any]] | None,
    ring: RingStatus | None,
) -> list[Problem]:
    found: list[Problem] = []
    found += _service_problems(g)
    found += _operator_problems(g)
    found += _condition_problems(g, out)
    if ledger is not None:
        found += _epoch_problems(g, out, ledger)
    found += _pod_metric_problems(out["pods"])
    if ring is not None and rotation.stalled(ring, g.now):
        found.append(
            Problem(
                "error",
                "RotationStalled",
                rotation.stall_message(ring),
                f"look at those pods' logs (kubectl -n {g.namespace} logs POD) for the ring; a "
                "pod that cannot report is replaced by deleting it (kubectl -n "
                f"{g.namespace} delete pod POD), and the new one loads the ring",
            )
        )
    elif g.service.ring_error and ledger is not None:
        found.append(
            Problem(
                "warning",
                "RingUnreadable",
                f"the request-state ring could not be read: {g.service.ring_error}",
                "only the operator's credential may read it: pass the operator's token "
                "(--token-file) or let status find it in the cluster",
            )
        )
    return sorted(found, key=lambda p: p.severity != "error")


def _service_problems(g: Gathered) -> list[Problem]:
    svc = g.service
    if svc.url is None:
        return [
            Problem(
                "error",
                "EpochServiceNotFound",
                f"no epoch service URL: {svc.unreachable or 'none given, none found'}",
                "pass --epoch-service-url and --token-file (or --token); without them status "
                "reads both from the mcp-epoch operator's Deployment (the chart's labels "
                "app.kubernetes.io/part-of=mcp-epoch, component=operator)",
            )
        ]
    if svc.unreachable is not None:
        action = svc.hint or (
            "check the epoch service's pods and logs (kubectl get pods -A -l "
            "app.kubernetes.io/component=epoch-service) and that the URL is the one the "
            "operator uses (its --epoch-service-url)"
        )
        if " 503 " in f" {svc.unreachable} ":
            action = (
                "the service answers but its ledger store does not: check its database "
                "(EPOCHSVC_DATABASE_URL) and the service's log"
            )
        return [
            Problem(
                "error",
                "EpochServiceUnreachable",
                f"epoch service unreachable at {svc.url}: {svc.unreachable}",
                action + "; until it answers, new pods of this server are refused admission",
            )
        ]
    if svc.refused is not None:
        return [
            Problem(
                "error",
                "EpochServiceRefused",
                f"the epoch service at {svc.url} refused this command: {svc.refused}",
                "status reads the ledger and the ring with the operator's credential: pass it "
                "with --token-file (or --token), or let status find it through the operator's "
                "Deployment (reading its token Secret, or a TokenRequest for its "
                "ServiceAccount, needs those rights in your kubeconfig)",
            )
        ]
    return []


def _operator_problems(g: Gathered) -> list[Problem]:
    """What the operator itself recorded on the McpServer and this command cannot see."""
    if g.mcpserver is None:
        return []
    found = []
    meta = _meta(g.mcpserver)
    stored = g.mcpserver.get("status") or {}
    for c in stored.get("conditions") or []:
        if c.get("type") == "EpochServiceReachable" and c.get("status") == "False":
            found.append(
                Problem(
                    "error",
                    "OperatorCannotReachEpochService",
                    f"the operator reports since {c.get('lastTransitionTime')}: "
                    f"{c.get('message', '')}",
                    "check the operator's --epoch-service-url and its log (kubectl logs of the "
                    "operator's Deployment); pods of this server are refused admission meanwhile",
                )
            )
        if c.get("reason") == "ReconcileFailed" and c.get("status") == "False":
            found.append(
                Problem(
                    "error",
                    "ReconcileFailed",
                    str(c.get("message", "")),
                    f"kubectl -n {g.namespace} describe mcpserver {g.server} shows the "
                    "operator's Events; fix what they name (RBAC, an invalid spec)",
                )
            )
    seen = stored.get("observedGeneration")
    if meta.get("generation") and (seen is None or int(seen) < int(meta["generation"])):
        found.append(
            Problem(
                "warning",
                "OperatorBehind",
                f"the operator has not reconciled generation {meta['generation']} yet "
                f"(its status is of generation {seen})",
                "wait a few seconds; if it stays, the operator is not running or cannot write "
                "the McpServer's status: kubectl get pods -A -l "
                "app.kubernetes.io/component=operator",
            )
        )
    return found


def _condition_problems(g: Gathered, out: dict[str, Any]) -> list[Problem]:
    """Ready and Progressing as the operator would write them now (its own functions)."""
    by_type = {c["type"]: c for c in out["conditions"]}
    found = []
    rolling = _rolling_out(g.deployment, _desired(g))
    ready = by_type.get("Ready", {})
    if ready.get("status") == "False" and ready.get("reason") == "ReplicasNotReady":
        waiting = [r["name"] for r in out["pods"] if not r["ready"] and not r["terminating"]]
        first = waiting[0] if waiting else "POD"
        found.append(
            Problem(
                "warning" if rolling else "error",
                "ReplicasNotReady",
                ready["message"].split(";")[0]
                + (f"; not ready: {', '.join(waiting[:5])}" if waiting else ""),
                f"kubectl -n {g.namespace} describe pod {first}; a replica's /readyz says why "
                "it is not ready (credentials refused, ring not loaded, draining)"
                + (
                    " (a rollout is under way: new pods become ready as they serve)"
                    if rolling
                    else ""
                ),
            )
        )
    if ready.get("reason") == "DeploymentMissing" and g.kind == "McpServer":
        found.append(
            Problem(
                "error",
                "DeploymentMissing",
                ready["message"],
                "the operator creates it: check that the operator runs (kubectl get pods -A -l "
                "app.kubernetes.io/component=operator) and its log",
            )
        )
    progressing = by_type.get("Progressing", {})
    if progressing.get("reason") == "ProgressDeadlineExceeded":
        found.append(
            Problem(
                "error",
                "ProgressDeadlineExceeded",
                progressing["message"],
                f"kubectl -n {g.namespace} rollout status deployment/{g.server}, then describe "
                "its newest pods (an image that does not pull, a probe that fails)",
            )
        )
    return found


def _rolling_out(deployment: dict[str, Any] | None, desired: int) -> bool:
    """A new template is being rolled out (a pod not ready is then expected for a while).
    Unlike the Progressing condition, a pod merely not ready on the current template is not
    a rollout: that one needs looking at."""
    if deployment is None:
        return False
    dstatus = deployment.get("status") or {}
    stale = int(dstatus.get("observedGeneration") or 0) < int(
        _meta(deployment).get("generation") or 0
    )
    updated = int(dstatus.get("updatedReplicas") or 0)
    return stale or updated < desired or int(dstatus.get("replicas") or 0) != desired


def _epoch_problems(
    g: Gathered, out: dict[str, Any], ledger: list[dict[str, Any]]
) -> list[Problem]:
    """Pods and ledger epochs that do not match (what the operator's resync would act on)."""
    ns = g.namespace
    plan = plan_resync(ledger, g.pods)
    by_epoch = {e["epoch"]: e for e in ledger}
    found = []
    for gone in out["epochsWithoutPod"]:
        found.append(
            Problem(
                "error",
                "EpochWithoutPod",
                f"the ledger holds epoch {gone['epoch']} as {gone['state']} for pod "
                f"{gone['pod']}, which no longer exists",
                "the operator retires it at its next resync (--resync-interval, 30 s by "
                "default); if it stays, the operator is not running or cannot reach the "
                "epoch service",
            )
        )
    for row in out["pods"]:
        if row["terminating"] or row["phase"] in ("Succeeded", "Failed"):
            continue
        name, epoch = row["name"], row["epoch"]
        entry = by_epoch.get(epoch or "")
        if not epoch:
            found.append(
                Problem(
                    "error",
                    "PodWithoutEpoch",
                    f"pod {name} carries no epoch ({EPOCH_ANNOTATION}): it was admitted "
                    "without the operator's webhook",
                    "check the webhook (kubectl get mutatingwebhookconfiguration) and that "
                    f"namespace {ns} is not excluded from it; then kubectl -n {ns} delete pod "
                    f"{name}, so its replacement is admitted with an epoch",
                )
            )
        elif epoch in plan.unknown_pod_epochs:
            found.append(
                Problem(
                    "error",
                    "UnknownEpoch",
                    f"pod {name} carries epoch {epoch}, which this ledger does not list for "
                    f"{ns}/{g.server}",
                    "it was issued by another ledger (a reset store, another epoch service): "
                    f"kubectl -n {ns} delete pod {name} for a pod with an epoch of this one",
                )
            )
        elif entry is not None and entry.get("pod_uid") and entry["pod_uid"] != row["uid"]:
            found.append(
                Problem(
                    "error",
                    "EpochOfAnotherPod",
                    f"pod {name} carries epoch {epoch}, which the ledger binds to another pod "
                    f"({entry.get('pod_name')})",
                    f"a copied annotation: kubectl -n {ns} delete pod {name}",
                )
            )
        elif entry is not None and entry["state"] in ("retired", "abandoned"):
            found.append(
                Problem(
                    "error",
                    "EpochNotLive",
                    f"pod {name} runs on epoch {epoch}, which the ledger has {entry['state']}",
                    f"its cursors are refused everywhere: kubectl -n {ns} delete pod {name}",
                )
            )
        elif entry is not None and entry["state"] == "pending" and row["phase"] == "Running":
            found.append(
                Problem(
                    "warning",
                    "EpochNotBound",
                    f"pod {name} runs, but its epoch {epoch} is still pending in the ledger",
                    "the operator binds it when it sees the pod; if it stays, check that the "
                    "operator runs and reaches the epoch service",
                )
            )
    # A pending epoch no pod carries is not a problem: the admission pool issues epochs ahead
    # of their pods, and the service abandons one that is never used.
    return found


def _pod_metric_problems(rows: list[dict[str, Any]]) -> list[Problem]:
    found = []
    for row in rows:
        if row["terminating"]:
            continue
        if row.get("credentialsRefused"):
            found.append(
                Problem(
                    "error",
                    "CredentialsRefused",
                    f"the epoch service refuses the credentials of pod {row['name']}",
                    "check the pod's projected token (audience mcp-epoch, the service's "
                    "auth.audience) or, with static tokens, the replica token Secret it reads",
                )
            )
        if row["registered"] is False:
            found.append(
                Problem(
                    "error",
                    "FallbackEpoch",
                    f"pod {row['name']} runs on a fallback epoch: its process could not "
                    "register with the epoch service",
                    "its sessions cannot be resumed elsewhere: fix what its log names (the "
                    f"service's URL or credentials), then replace it (kubectl delete pod "
                    f"{row['name']})",
                )
            )
    return found


def server_of(deployment: dict[str, Any]) -> str | None:
    """The server a plain Deployment's pods belong to: its pod template's server label."""
    template = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
    value = (template.get("labels") or {}).get(SERVER_LABEL)
    return str(value) if value else None
