"""How a pod gets the mcp-epoch sidecar: pure functions from a pod to the pod that runs it.

A pod chooses the sidecar with the annotation ``mcp.epochs.dev/data-plane: sidecar`` (an
``McpServer`` with ``spec.dataPlane.mode: sidecar`` sets it on its pods; a plain labelled
Deployment sets it itself) and names the port its MCP server listens on inside the pod with
``mcp.epochs.dev/upstream-port``. The webhook then:

* adds ``mcp-epoch proxy`` from the mcp-epoch image as a **native sidecar** (an init container
  with ``restartPolicy: Always``): it starts before the server and serves the pod's MCP port
  (``mcp.epochs.dev/port``, default 8080), named ``mcp`` so a Service's ``targetPort: mcp``
  reaches it; its readiness is its ``/readyz``, which fails while the server does not answer;
* gives every main container a preStop that asks the sidecar to drain and waits until it has
  (``GET`` the drain path with this pod's own drain token). The kubelet signals a pod's main
  containers first and its native sidecars only after they exit; without this the server would
  be gone while the sidecar still had calls to finish. A main container's own ``sleep``
  preStop becomes the sidecar's wait before draining (the pod leaves the Service's endpoints
  meanwhile); any other preStop is refused: it would have to be given up.

Everything is replaced where it stands, so a second invocation (``reinvocationPolicy:
IfNeeded``) changes nothing but the drain token, which is kept.
"""

from __future__ import annotations

import copy
import secrets
from typing import Any

from mcp_epoch.contract import (
    DATA_PLANE_ANNOTATION,
    DATA_PLANES,
    DRAIN_PATH,
    DRAIN_TOKEN_HEADER,
    ENV_DRAIN_TOKEN,
    ENV_PRESTOP,
    INJECTED_ENV,
    READY_PATH,
    SIDECAR_CONTAINER,
    SIDECAR_PORT_ANNOTATION,
    UPSTREAM_PORT_ANNOTATION,
)
from mcp_epoch_operator.resources import DEFAULT_PORT, PORT_NAME, READINESS_PERIOD_SECONDS

#: The sidecar's command in the mcp-epoch image (its entrypoint, spelled out: a runtime that
#: ignores entrypoints still runs the right program).
COMMAND = ["mcp-epoch"]
#: The mcp-epoch image's user and group (its Dockerfile's ``USER 10001:10001``).
IMAGE_UID = 10001


class SidecarRefusal(ValueError):
    """The pod asks for the sidecar in a way that cannot work; its author must fix it."""


def wants_sidecar(pod: dict[str, Any]) -> bool:
    """Whether the pod chose the sidecar (raises for a data plane that does not exist)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    plane = annotations.get(DATA_PLANE_ANNOTATION, "library")
    if plane not in DATA_PLANES:
        raise SidecarRefusal(
            f"annotation {DATA_PLANE_ANNOTATION}={plane!r} must be one of {', '.join(DATA_PLANES)}"
        )
    return bool(plane == "sidecar")


def _port(annotations: dict[str, Any], key: str, default: int | None) -> int:
    raw = annotations.get(key)
    if raw is None and default is not None:
        return default
    if raw is None or not str(raw).isdigit() or not 1 <= int(raw) <= 65535:
        raise SidecarRefusal(
            f"annotation {key}={raw!r} must be a port number (1-65535): "
            + (
                "the port the MCP server listens on inside the pod, behind the sidecar"
                if key == UPSTREAM_PORT_ANNOTATION
                else "the port the sidecar serves the pod's MCP clients on"
            )
        )
    return int(raw)


def _injected(pod: dict[str, Any], name: str) -> str | None:
    """A variable of the sidecar a first invocation injected, if any."""
    for container in (pod.get("spec") or {}).get("initContainers") or []:
        if container.get("name") == SIDECAR_CONTAINER:
            for var in container.get("env") or []:
                if var.get("name") == name and var.get("value"):
                    return str(var["value"])
    return None


def _prestop_seconds(container: dict[str, Any], token_header: str, port: int) -> int:
    """The seconds a main container's own preStop waited (a ``sleep``), 0 for none or for the
    drain request this module put there; refuse any other preStop."""
    pre = ((container.get("lifecycle") or {}).get("preStop")) or None
    if pre is None:
        return 0
    if set(pre) == {"sleep"}:
        return int((pre.get("sleep") or {}).get("seconds") or 0)
    get = pre.get("httpGet") or {}
    headers = {h.get("name"): h.get("value") for h in get.get("httpHeaders") or []}
    if get.get("path") == DRAIN_PATH and token_header in headers and get.get("port") == port:
        return 0
    raise SidecarRefusal(
        f"container {container.get('name')!r} has its own preStop hook: with the sidecar its "
        "preStop must wait for the sidecar's drain (a sleep preStop is kept as the wait before "
        "the drain); remove the hook or use the library"
    )


def sidecar_container(
    image: str, port: int, upstream_port: int, token: str, prestop: int
) -> dict[str, Any]:
    """The injected native sidecar: ``mcp-epoch proxy`` in front of the pod's server."""
    return {
        "name": SIDECAR_CONTAINER,
        "image": image,
        "restartPolicy": "Always",
        "command": list(COMMAND),
        "args": [
            "proxy",
            "--upstream",
            f"127.0.0.1:{upstream_port}",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--drain-report",
        ],
        "ports": [{"name": PORT_NAME, "containerPort": port, "protocol": "TCP"}],
        "env": [
            {"name": ENV_DRAIN_TOKEN, "value": token},
            {"name": ENV_PRESTOP, "value": str(prestop)},
        ],
        "readinessProbe": {
            "httpGet": {"path": READY_PATH, "port": port},
            "periodSeconds": READINESS_PERIOD_SECONDS,
            "failureThreshold": 2,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            # The image's own user (its USER is numeric too), stated so that runAsNonRoot is
            # checkable whatever the pod's securityContext says.
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def drain_prestop(port: int, token: str) -> dict[str, Any]:
    """A main container's preStop: ask the sidecar to drain, and wait for it."""
    header = {"name": DRAIN_TOKEN_HEADER, "value": token}
    return {"httpGet": {"path": DRAIN_PATH, "port": port, "httpHeaders": [header]}}


def add_sidecar(pod: dict[str, Any], image: str | None) -> None:
    """Put the sidecar into ``pod`` in place (see the module's docstring). Raises
    :class:`SidecarRefusal` when the pod's request cannot be met."""
    if not wants_sidecar(pod):
        return
    if not image:
        raise SidecarRefusal(
            "this pod asks for the mcp-epoch sidecar, but the operator was started without "
            "--sidecar-image (the chart sets it to the mcp-epoch image)"
        )
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    upstream_port = _port(annotations, UPSTREAM_PORT_ANNOTATION, None)
    port = _port(annotations, SIDECAR_PORT_ANNOTATION, DEFAULT_PORT)
    if port == upstream_port:
        raise SidecarRefusal(
            f"the sidecar's port ({SIDECAR_PORT_ANNOTATION}={port}) must differ from the MCP "
            f"server's ({UPSTREAM_PORT_ANNOTATION}={upstream_port})"
        )
    spec = pod.setdefault("spec", {})
    token = _injected(pod, ENV_DRAIN_TOKEN) or secrets.token_urlsafe(24)
    containers = spec.get("containers") or []
    earlier = _injected(pod, ENV_PRESTOP)
    prestop = int(earlier) if earlier and earlier.isdigit() else 0
    for container in containers:
        for declared in container.get("ports") or []:
            if declared.get("containerPort") == port or declared.get("name") == PORT_NAME:
                raise SidecarRefusal(
                    f"container {container.get('name')!r} declares port "
                    f"{declared.get('name') or declared.get('containerPort')}: with the sidecar "
                    f"the pod's MCP port {port} (named {PORT_NAME!r}) is the sidecar's"
                )
        prestop = max(prestop, _prestop_seconds(container, DRAIN_TOKEN_HEADER, port))
    for container in containers:
        lifecycle = dict(container.get("lifecycle") or {})
        lifecycle["preStop"] = drain_prestop(port, token)
        container["lifecycle"] = lifecycle
    sidecar = sidecar_container(image, port, upstream_port, token, prestop)
    # What an McpServer's Deployment gave its server for mcp-epoch (its token Secret, drain,
    # buffer, ...) is the sidecar's now; the webhook adds the rest, as for any container.
    carried = [
        dict(e)
        for e in (containers[0].get("env") or [] if containers else [])
        if e.get("name") in INJECTED_ENV
    ]
    sidecar["env"] = [*sidecar["env"], *carried]
    others = [c for c in spec.get("initContainers") or [] if c.get("name") != SIDECAR_CONTAINER]
    # First among the init containers: the server's own init containers may need the network
    # the sidecar serves, and a native sidecar starts before everything after it.
    spec["initContainers"] = [sidecar, *others]


def check(pod: dict[str, Any], image: str | None) -> None:
    """Raise :class:`SidecarRefusal` if :func:`add_sidecar` would (before any epoch is
    issued for the pod: a refused pod takes nothing from the ledger)."""
    add_sidecar(copy.deepcopy(pod), image)
