"""Pure builders: an ``McpServer`` object → the Deployment and Service it owns.

Kept free of I/O so the shapes are unit-tested directly. The operator server-side-applies what
these return (field manager ``mcp-epoch-operator``, forced): fields it sets are put back when
someone edits them (drift), fields others own — e.g. ``kubectl rollout restart``'s annotation —
are left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import kopf

from mcp_epoch.contract import (
    DATA_PLANE_ANNOTATION,
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_EVENTS_PER_SECOND,
    DEFAULT_MIN_READY_SECONDS,
    DEFAULT_PRESTOP_SECONDS,
    DEFAULT_RECONNECT_WINDOW_SECONDS,
    ENV_DRAIN,
    ENV_HANDOFF,
    INJECTED_ENV,
    MAX_OPERATOR_BUFFER_EVENTS,
    READY_PATH,
    SIDECAR_PORT_ANNOTATION,
    TOKEN_AUDIENCE,
    UPSTREAM_PORT_ANNOTATION,
)
from mcp_epoch_operator.names import (
    API_VERSION,
    ENV_BUFFER,
    ENV_NAMESPACE,
    ENV_POD_NAME,
    ENV_POD_UID,
    ENV_SERVER,
    ENV_SERVICE_TOKEN,
    ENV_SERVICE_URL,
    KIND,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    SERVER_LABEL,
)

#: Replay buffer sizing (docs/design.md: reconnect window * event rate). The floor keeps a short
#: burst resumable even for a server declared as quiet; the cap bounds replica memory. The CRD
#: rejects products above the cap, so the clamp only matters for objects stored before that rule.
BUFFER_FLOOR = 256
BUFFER_CAP = MAX_OPERATOR_BUFFER_EVENTS
DEFAULT_PORT = 8080
DEFAULT_PATH = "/mcp"
CONTAINER_NAME = "mcp"
#: How often the kubelet asks ``/readyz`` (a cheap answer from memory): a new pod counts as
#: Ready at most this long after it serves.
READINESS_PERIOD_SECONDS = 2
PORT_NAME = "mcp"
DEFAULT_TOKEN_KEY = "token"
#: Grace period beyond preStop + drain: time for the process to close its streams and exit.
GRACE_SLACK_SECONDS = 5

#: Environment variables the operator sets itself; the CRD forbids them in ``spec.env``.
RESERVED_ENV = INJECTED_ENV


@dataclass(frozen=True, slots=True)
class TokenSecretRef:
    """Where a pod finds the replica token: a Secret key in the pod's own namespace."""

    name: str
    key: str = DEFAULT_TOKEN_KEY


@dataclass(frozen=True, slots=True)
class ReplicaDefaults:
    """What the operator (not the McpServer) decides for every managed pod."""

    #: The epoch service URL as replicas reach it (in-cluster: the chart's Service DNS name).
    service_url: str
    #: Default replica-token Secret when an McpServer names none (None: inject no token).
    #: Only for an epoch service with static tokens; it turns the projected token off.
    token_secret: TokenSecretRef | None = None
    #: Audience of the projected ServiceAccount token the webhook mounts into every managed
    #: pod (None: mount none).
    token_audience: str | None = TOKEN_AUDIENCE
    #: The mcp-epoch image, whose ``mcp-epoch proxy`` the webhook injects as the sidecar of
    #: pods that choose it (None: such pods are refused, with what to set).
    sidecar_image: str | None = None


def buffer_events(reconnect_window_seconds: float | None, events_per_second: float | None) -> int:
    """Ring-buffer capacity: ``window * rate`` rounded up, clamped to [floor, cap]."""
    window = reconnect_window_seconds or DEFAULT_RECONNECT_WINDOW_SECONDS
    rate = events_per_second or DEFAULT_EVENTS_PER_SECOND
    wanted = math.ceil(float(window) * float(rate))
    return max(BUFFER_FLOOR, min(BUFFER_CAP, wanted))


def server_selector(name: str) -> dict[str, str]:
    """Labels that select an McpServer's pods (Deployment selector, Service, scale selector)."""
    return {SERVER_LABEL: name}


def selector_string(name: str) -> str:
    """The same selector in the string form the scale subresource reports."""
    return ",".join(f"{k}={v}" for k, v in server_selector(name).items())


def _owned_metadata(mcps: dict[str, Any]) -> dict[str, Any]:
    meta = mcps["metadata"]
    owned_meta: dict[str, Any] = {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE, **server_selector(meta["name"])},
    }
    # kopf's controller reference: deleting the McpServer cascades to what it owns.
    owned = {"metadata": owned_meta}
    owner = {"apiVersion": API_VERSION, "kind": KIND, **mcps}
    kopf.append_owner_reference(owned, owner=owner)  # type: ignore[arg-type]  # a raw body
    return owned_meta


def token_secret_of(spec: dict[str, Any], defaults: ReplicaDefaults) -> TokenSecretRef | None:
    """The McpServer's own Secret reference wins over the operator's default."""
    ref = (spec.get("epochService") or {}).get("tokenSecretRef")
    if ref and ref.get("name"):
        return TokenSecretRef(ref["name"], ref.get("key") or DEFAULT_TOKEN_KEY)
    return defaults.token_secret


def field_env(name: str, field_path: str) -> dict[str, Any]:
    """A Downward API variable."""
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def secret_env(name: str, ref: TokenSecretRef) -> dict[str, Any]:
    """A variable from a Secret: the token never sits in a Deployment or Pod spec."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


@dataclass(frozen=True, slots=True)
class Drain:
    """How an McpServer's pods leave: preStop wait, then SIGTERM and at most ``seconds`` of
    drain; the grace period covers both with slack, so the kubelet never kills a drain."""

    seconds: int = DEFAULT_DRAIN_SECONDS
    prestop: int = DEFAULT_PRESTOP_SECONDS
    min_ready: int = DEFAULT_MIN_READY_SECONDS
    #: The draining process hands its sessions on (``spec.drain.handoff``).
    handoff: bool = True

    @classmethod
    def of(cls, spec: dict[str, Any]) -> Drain:
        d = spec.get("drain") or {}
        return cls(
            int(d.get("seconds", DEFAULT_DRAIN_SECONDS)),
            int(d.get("preStopSeconds", DEFAULT_PRESTOP_SECONDS)),
            int(d.get("minReadySeconds", DEFAULT_MIN_READY_SECONDS)),
            d.get("handoff", True) is not False,
        )

    @property
    def grace(self) -> int:
        return self.prestop + self.seconds + GRACE_SLACK_SECONDS

    def within(self, grace: int | None) -> Drain:
        """The drain that fits an explicit grace period: the API server wants a preStop sleep
        shorter than the grace period, and a drain past it would be cut by SIGKILL anyway."""
        if grace is None:
            return self
        prestop = min(self.prestop, max(grace - 1, 0))
        seconds = min(self.seconds, max(grace - prestop - 1, 0))
        return Drain(seconds, prestop, self.min_ready, self.handoff)


def handoff_value(on: bool) -> str:
    """``MCP_EPOCH_HANDOFF`` as the library reads it."""
    return "on" if on else "off"


def replica_env(
    server: str,
    buffer: int,
    service_url: str | None,
    token: TokenSecretRef | None,
    drain: Drain | None = None,
) -> list[dict[str, Any]]:
    """Everything the replica library reads, except ``MCP_EPOCH`` (the webhook adds that)."""
    env: list[dict[str, Any]] = [
        {"name": ENV_SERVER, "value": server},
        field_env(ENV_NAMESPACE, "metadata.namespace"),
        field_env(ENV_POD_NAME, "metadata.name"),
        field_env(ENV_POD_UID, "metadata.uid"),
        {"name": ENV_BUFFER, "value": str(buffer)},
        {"name": ENV_DRAIN, "value": str((drain or Drain()).seconds)},
        {"name": ENV_HANDOFF, "value": handoff_value((drain or Drain()).handoff)},
    ]
    if service_url:
        env.append({"name": ENV_SERVICE_URL, "value": service_url})
    if token is not None:
        env.append(secret_env(ENV_SERVICE_TOKEN, token))
    return env


def readiness_probe(spec: dict[str, Any]) -> dict[str, Any]:
    """The container's readiness probe: ``spec.readinessProbe`` as given, else the replica
    library's ``/readyz`` on the MCP port. Without one a pod is Ready the moment its container
    starts, before the server listens, so a rollout would stop an old pod while its
    replacement cannot serve yet; and a draining process or one whose credentials the epoch
    service refuses would stay in the Service's endpoints."""
    if spec.get("readinessProbe"):
        return dict(spec["readinessProbe"])
    return {
        "httpGet": {"path": READY_PATH, "port": PORT_NAME},
        "periodSeconds": READINESS_PERIOD_SECONDS,
        "failureThreshold": 2,
    }


def build_deployment(mcps: dict[str, Any], defaults: ReplicaDefaults) -> dict[str, Any]:
    """The Deployment an McpServer owns, in the shape server-side apply expects."""
    name = mcps["metadata"]["name"]
    spec = mcps.get("spec") or {}
    resumption = spec.get("resumption") or {}
    buffer = buffer_events(
        resumption.get("reconnectWindowSeconds"), resumption.get("eventsPerSecond")
    )
    port = int(spec.get("port") or DEFAULT_PORT)
    grace = spec.get("terminationGracePeriodSeconds")
    drain = Drain.of(spec).within(None if grace is None else int(grace))
    token = token_secret_of(spec, defaults)
    plane = spec.get("dataPlane") or {}
    sidecar = plane.get("mode") == "sidecar"
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec["image"],
        "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "env": [
            *(spec.get("env") or []),
            *replica_env(name, buffer, defaults.service_url, token, drain),
        ],
        "readinessProbe": readiness_probe(spec),
    }
    sidecar_annotations: dict[str, str] = {}
    if sidecar:
        # The webhook injects the sidecar, which serves the MCP port and answers /readyz
        # (failing while the server does not answer); the server listens on upstreamPort.
        del container["ports"]
        if not spec.get("readinessProbe"):
            del container["readinessProbe"]
        sidecar_annotations = {
            DATA_PLANE_ANNOTATION: "sidecar",
            UPSTREAM_PORT_ANNOTATION: str(int(plane["upstreamPort"])),
            SIDECAR_PORT_ANNOTATION: str(port),
        }
    if drain.prestop:
        # The kubelet's own sleep (no binary needed in the image): endpoints are updated
        # while it waits, so SIGTERM finds the pod out of rotation.
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": drain.prestop}}}
    if spec.get("command"):
        container["command"] = list(spec["command"])
    if spec.get("args"):
        container["args"] = list(spec["args"])
    if spec.get("resources"):
        container["resources"] = spec["resources"]
    if spec.get("imagePullPolicy"):
        container["imagePullPolicy"] = spec["imagePullPolicy"]

    pod_spec: dict[str, Any] = {"containers": [container]}
    if spec.get("serviceAccountName"):
        pod_spec["serviceAccountName"] = spec["serviceAccountName"]
    pod_spec["terminationGracePeriodSeconds"] = drain.grace if grace is None else int(grace)

    rolling = spec.get("rollingUpdate") or {}
    template_meta: dict[str, Any] = {
        # The server label last, so a user label can never take it over.
        "labels": {**(spec.get("podLabels") or {}), **server_selector(name)},
    }
    if spec.get("podAnnotations") or sidecar_annotations:
        template_meta["annotations"] = {**(spec.get("podAnnotations") or {}), **sidecar_annotations}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _owned_metadata(mcps),
        "spec": {
            "replicas": int(spec.get("replicas", 1)),
            "minReadySeconds": drain.min_ready,
            "selector": {"matchLabels": server_selector(name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    # Surge first: a rollout never lowers capacity unless asked to.
                    "maxSurge": rolling.get("maxSurge", 1),
                    "maxUnavailable": rolling.get("maxUnavailable", 0),
                },
            },
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def build_service(mcps: dict[str, Any]) -> dict[str, Any]:
    """The ClusterIP Service in front of an McpServer's pods."""
    name = mcps["metadata"]["name"]
    spec = mcps.get("spec") or {}
    port = int(spec.get("port") or DEFAULT_PORT)
    meta = _owned_metadata(mcps)
    # Clients find the MCP endpoint path next to the port.
    meta["annotations"] = {"mcp.epochs.dev/path": spec.get("path") or DEFAULT_PATH}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": server_selector(name),
            "ports": [
                {"name": PORT_NAME, "port": port, "targetPort": PORT_NAME, "protocol": "TCP"}
            ],
        },
    }
