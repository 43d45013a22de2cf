"""Pure admission logic: which pods get an epoch, how a pod is changed to carry it, and the
AdmissionReview answer.

The server in ``admission`` does the I/O (reading the review, issuing the epoch); everything
it decides is here, as functions from plain dicts to plain dicts, so it is tested without a
cluster.
"""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass
from typing import Any

from mcp_epoch.contract import (
    DEFAULT_EVENTS_PER_SECOND,
    DEFAULT_RECONNECT_WINDOW_SECONDS,
    DNS1123_LABEL_RE,
    ENV_HANDOFF,
    ENV_SERVICE_TOKEN_FILE,
    HANDOFF_ANNOTATION,
    RATE_ANNOTATION,
    TOKEN_EXPIRATION_SECONDS,
    TOKEN_FILE,
    TOKEN_MOUNT_PATH,
    TOKEN_VOLUME,
    UID_RE,
    WINDOW_ANNOTATION,
)
from mcp_epoch_operator import jsondiff
from mcp_epoch_operator.metrics import Admission
from mcp_epoch_operator.names import (
    ENV_BUFFER,
    ENV_EPOCH,
    ENV_NAMESPACE,
    ENV_POD_NAME,
    ENV_POD_UID,
    ENV_SERVER,
    ENV_SERVICE_TOKEN,
    ENV_SERVICE_URL,
    EPOCH_ANNOTATION,
    SERVER_LABEL,
    WEBHOOK_NAME,
    WEBHOOK_PATH,
)
from mcp_epoch_operator.resources import (
    ReplicaDefaults,
    buffer_events,
    field_env,
    handoff_value,
    secret_env,
)
from mcp_epoch_operator.sidecar import SidecarRefusal, add_sidecar


class Refusal(ValueError):
    """The pod cannot get an epoch for a reason its author must fix (not a transient error)."""


@dataclass(frozen=True, slots=True)
class Target:
    """Who an admission request issues an epoch for."""

    namespace: str
    server: str
    request_uid: str


def target_of(request: dict[str, Any]) -> Target | None:
    """The (namespace, server, request UID) of a pod CREATE, or None if it needs no epoch.

    Raises Refusal when the pod asks for an epoch in a way the ledger cannot accept, so the
    author sees why instead of getting a pod that silently runs without one.
    """
    pod = request.get("object") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    server = labels.get(SERVER_LABEL)
    if server is None:
        return None
    if not DNS1123_LABEL_RE.match(server):
        raise Refusal(
            f"label {SERVER_LABEL}={server!r} must be a DNS-1123 label (lowercase letters, "
            "digits and '-', at most 63 characters): it names the MCP server in the epoch ledger"
        )
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace")
    if not namespace:
        raise Refusal("the admission request names no namespace for the pod")
    uid = str(request.get("uid") or "")
    if not UID_RE.match(uid):
        raise Refusal(f"the admission request UID {uid[:64]!r} is not usable as an idempotency key")
    return Target(namespace=namespace, server=server, request_uid=uid)


def _env_defaults(
    pod: dict[str, Any], server: str, defaults: ReplicaDefaults
) -> list[dict[str, Any]]:
    """Variables added only where a container does not already set them.

    McpServer pods get them from their Deployment; plain labelled Deployments get the same
    environment here, so "exactly like an McpServer's" holds without touching their manifests.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    buffer = buffer_events(
        _number(annotations.get(WINDOW_ANNOTATION), DEFAULT_RECONNECT_WINDOW_SECONDS),
        _number(annotations.get(RATE_ANNOTATION), DEFAULT_EVENTS_PER_SECOND),
    )
    env: list[dict[str, Any]] = [
        {"name": ENV_SERVER, "value": server},
        field_env(ENV_NAMESPACE, "metadata.namespace"),
        field_env(ENV_POD_NAME, "metadata.name"),
        field_env(ENV_POD_UID, "metadata.uid"),
        {"name": ENV_BUFFER, "value": str(buffer)},
        {
            "name": ENV_HANDOFF,
            "value": handoff_value(str(annotations.get(HANDOFF_ANNOTATION, "on")).lower() != "off"),
        },
    ]
    if defaults.service_url:
        env.append({"name": ENV_SERVICE_URL, "value": defaults.service_url})
    if defaults.token_secret is not None:
        env.append(secret_env(ENV_SERVICE_TOKEN, defaults.token_secret))
    elif defaults.token_audience:
        env.append({"name": ENV_SERVICE_TOKEN_FILE, "value": TOKEN_FILE})
    return env


def token_volume(audience: str) -> dict[str, Any]:
    """The pod's own credential for the epoch service: a ServiceAccount token bound to this
    pod, for this audience only, short-lived and rotated by the kubelet. Nothing is copied
    between namespaces, and the token dies with the pod."""
    source = {
        "audience": audience,
        "expirationSeconds": TOKEN_EXPIRATION_SECONDS,
        "path": TOKEN_FILE.rsplit("/", 1)[1],
    }
    return {"name": TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": source}]}}


TOKEN_MOUNT: dict[str, Any] = {
    "name": TOKEN_VOLUME,
    "mountPath": TOKEN_MOUNT_PATH,
    "readOnly": True,
}


def _replace_named(items: list[dict[str, Any]], item: dict[str, Any]) -> list[dict[str, Any]]:
    """``items`` with ``item`` in place of any entry of the same name (a copied pod's)."""
    return [*(i for i in items if i.get("name") != item["name"]), item]


def _number(raw: Any, default: float) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return default
    return value if value > 0 else default


def inject(pod: dict[str, Any], epoch: str, server: str, defaults: ReplicaDefaults) -> None:
    """Put ``epoch`` into ``pod`` in place: the annotation and ``MCP_EPOCH`` in every container.

    Init containers get it too: native sidecars are init containers, and a process that
    serves MCP there needs its epoch as much as a main container. An ``MCP_EPOCH`` already in
    a manifest (e.g. a copied pod) is replaced: each pod gets its own epoch, never a copy.
    """
    try:
        add_sidecar(pod, defaults.sidecar_image)  # first: the sidecar gets the same variables
    except SidecarRefusal as exc:
        raise Refusal(str(exc)) from None
    meta = pod.setdefault("metadata", {})
    annotations = meta.get("annotations") or {}
    annotations[EPOCH_ANNOTATION] = epoch
    meta["annotations"] = annotations
    extra = _env_defaults(pod, server, defaults)
    spec = pod.setdefault("spec", {})
    projected = defaults.token_secret is None and bool(defaults.token_audience)
    if projected:
        assert defaults.token_audience is not None
        volumes = list(spec.get("volumes") or [])
        spec["volumes"] = _replace_named(volumes, token_volume(defaults.token_audience))
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            env = list(container.get("env") or [])
            mine = {"name": ENV_EPOCH, "value": epoch}
            slots = [i for i, e in enumerate(env) if e.get("name") == ENV_EPOCH]
            if slots:  # replaced where it stands: a second invocation changes nothing
                env[slots[0]] = mine
                env = [e for i, e in enumerate(env) if i not in slots[1:]]
            else:
                env.append(mine)
            present = {e.get("name") for e in env}
            # A container given a static token (an McpServer's tokenSecretRef) keeps it.
            own_token = projected and ENV_SERVICE_TOKEN not in present
            if not own_token:
                present.add(ENV_SERVICE_TOKEN_FILE)
            env.extend(e for e in extra if e["name"] not in present)
            container["env"] = env
            if own_token:
                mounts = [
                    m
                    for m in container.get("volumeMounts") or []
                    if m.get("mountPath") != TOKEN_MOUNT_PATH
                ]
                container["volumeMounts"] = _replace_named(mounts, dict(TOKEN_MOUNT))


def injected(
    pod: dict[str, Any], epoch: str, server: str, defaults: ReplicaDefaults
) -> dict[str, Any]:
    """A changed copy of ``pod`` (for callers that must keep the original)."""
    out = copy.deepcopy(pod)
    inject(out, epoch, server, defaults)
    return out


def pod_patch(
    pod: dict[str, Any], epoch: str, server: str, defaults: ReplicaDefaults
) -> list[dict[str, Any]]:
    """The JSON Patch that turns ``pod`` into the pod carrying ``epoch`` (what the API server
    applies: an admission answer carries the change, not the changed pod)."""
    return jsondiff.diff(pod, injected(pod, epoch, server, defaults))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the webhook answers for one pod, and how the metrics count it."""

    outcome: Admission
    allowed: bool
    code: int = 200
    message: str = ""
    patch: list[dict[str, Any]] | None = None
    warnings: tuple[str, ...] = ()


SKIPPED = Verdict("skipped", allowed=True)


def refused(code: int, message: str) -> Verdict:
    return Verdict("refused", allowed=False, code=code, message=message)


def review_response(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The ``admission.k8s.io/v1`` AdmissionReview answering request ``uid``."""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": verdict.code, "message": verdict.message}
    if verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(verdict.patch).encode()).decode("ascii")
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def refusal_message(target: Target, service_url: str, reason: str) -> str:
    """What ``kubectl`` shows when the epoch service cannot answer: what, why, what to do."""
    return (
        f"mcp-epoch: no epoch could be issued for this pod of MCP server "
        f"{target.namespace}/{target.server}: the epoch service at {service_url} is not "
        f"answering ({reason}). The pod is refused rather than started without an epoch; it "
        "will be admitted once the epoch service is reachable again (check the epoch service "
        "Deployment and the operator's --epoch-service-url)."
    )


def webhook_configuration(
    name: str,
    *,
    url: str | None = None,
    service: dict[str, Any] | None = None,
    ca_bundle: bytes,
    excluded_namespaces: list[str],
    included_namespaces: list[str] | None = None,
    timeout_seconds: int = 5,
) -> dict[str, Any]:
    """The MutatingWebhookConfiguration (locally registered by the operator; in a cluster the
    chart renders the same shape).

    - objectSelector on the server label: nothing else in the cluster ever calls the webhook;
    - namespaceSelector excludes kube-system and the operator's own namespace, so the operator
      can always start even though failurePolicy is Fail (and, for a namespace-scoped
      operator, admits only the namespaces it watches);
    - sideEffects NoneOnDryRun: a dry run is admitted without issuing an epoch;
    - reinvocationPolicy IfNeeded: if a later webhook adds a container, it gets MCP_EPOCH too.
    """
    namespace_rules: list[dict[str, Any]] = [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": sorted(set(excluded_namespaces)),
        }
    ]
    if included_namespaces:
        namespace_rules.append(
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": sorted(set(included_namespaces)),
            }
        )
    client: dict[str, Any] = {"caBundle": base64.b64encode(ca_bundle).decode("ascii")}
    if url is not None:
        client["url"] = url.rstrip("/") + WEBHOOK_PATH
    elif service is not None:
        client["service"] = {**service, "path": WEBHOOK_PATH}
    else:
        raise ValueError("a webhook configuration needs a url or a service")
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "mcp-epoch"}},
        "webhooks": [
            {
                "name": WEBHOOK_NAME,
                "admissionReviewVersions": ["v1"],
                "clientConfig": client,
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "objectSelector": {
                    "matchExpressions": [{"key": SERVER_LABEL, "operator": "Exists"}]
                },
                "namespaceSelector": {"matchExpressions": namespace_rules},
                "failurePolicy": "Fail",
                "sideEffects": "NoneOnDryRun",
                "timeoutSeconds": timeout_seconds,
                "matchPolicy": "Equivalent",
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }
