"""How a pod gets the sidecar: the webhook's pure functions, and the McpServer's Deployment."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from mcp_epoch_operator.resources import ReplicaDefaults, build_deployment
from mcp_epoch_operator.sidecar import SidecarRefusal, check
from mcp_epoch_operator.webhook import Refusal, injected

from mcp_epoch.contract import (
    DATA_PLANE_ANNOTATION,
    DRAIN_PATH,
    DRAIN_TOKEN_HEADER,
    ENV_DRAIN_TOKEN,
    ENV_EPOCH,
    ENV_PRESTOP,
    SIDECAR_CONTAINER,
    SIDECAR_PORT_ANNOTATION,
    TOKEN_MOUNT_PATH,
    UPSTREAM_PORT_ANNOTATION,
)

IMAGE = "ghcr.io/example/mcp-epoch:1.2.3"
DEFAULTS = ReplicaDefaults("http://epochs:8080", sidecar_image=IMAGE)
EPOCH = "0123abcd-7"


def pod(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {
            "labels": {"mcp.epochs.dev/server": "weather"},
            "annotations": {
                DATA_PLANE_ANNOTATION: "sidecar",
                UPSTREAM_PORT_ANNOTATION: "3000",
                **annotations,
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": "node:22",
                    "command": ["node", "server.js"],
                    "lifecycle": {"preStop": {"sleep": {"seconds": 3}}},
                }
            ]
        },
    }


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def test_the_sidecar_is_a_native_sidecar_serving_the_pods_port_in_front_of_the_server() -> None:
    out = injected(pod(), EPOCH, "weather", DEFAULTS)
    (side,) = out["spec"]["initContainers"]
    assert side["name"] == SIDECAR_CONTAINER and side["image"] == IMAGE
    assert side["restartPolicy"] == "Always"  # native: up before the server, down after it
    assert side["command"] == ["mcp-epoch"]
    assert side["args"][:3] == ["proxy", "--upstream", "127.0.0.1:3000"]
    assert side["ports"] == [{"name": "mcp", "containerPort": 8080, "protocol": "TCP"}]
    assert side["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8080}
    env = env_of(side)
    # The sidecar authenticates as its pod and carries the pod's epoch, like the library.
    assert env[ENV_EPOCH] == EPOCH
    assert any(m["mountPath"] == TOKEN_MOUNT_PATH for m in side["volumeMounts"])
    # The main container's sleep preStop became the sidecar's wait before its drain, and its
    # preStop now waits for that drain, with this pod's token.
    assert env[ENV_PRESTOP] == "3"
    (server,) = out["spec"]["containers"]
    get = server["lifecycle"]["preStop"]["httpGet"]
    assert get["path"] == DRAIN_PATH and get["port"] == 8080
    assert get["httpHeaders"] == [{"name": DRAIN_TOKEN_HEADER, "value": env[ENV_DRAIN_TOKEN]}]
    assert len(env[ENV_DRAIN_TOKEN]) >= 32


def test_each_pod_gets_its_own_drain_token_and_a_second_invocation_changes_nothing() -> None:
    once = injected(pod(), EPOCH, "weather", DEFAULTS)
    twice = injected(copy.deepcopy(once), EPOCH, "weather", DEFAULTS)
    assert twice == once
    other = injected(pod(), EPOCH, "weather", DEFAULTS)
    token = env_of(once["spec"]["initContainers"][0])[ENV_DRAIN_TOKEN]
    assert env_of(other["spec"]["initContainers"][0])[ENV_DRAIN_TOKEN] != token


def test_a_pod_without_the_annotation_gets_no_sidecar() -> None:
    plain = pod()
    del plain["metadata"]["annotations"][DATA_PLANE_ANNOTATION]
    out = injected(plain, EPOCH, "weather", DEFAULTS)
    assert "initContainers" not in out["spec"]
    assert out["spec"]["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": 3}}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda p: p["metadata"]["annotations"].pop(UPSTREAM_PORT_ANNOTATION), "upstream-port"),
        (lambda p: p["metadata"]["annotations"].update({UPSTREAM_PORT_ANNOTATION: "x"}), "port"),
        (
            lambda p: p["metadata"]["annotations"].update({SIDECAR_PORT_ANNOTATION: "3000"}),
            "differ",
        ),
        (lambda p: p["metadata"]["annotations"].update({DATA_PLANE_ANNOTATION: "mesh"}), "one of"),
        (
            lambda p: p["spec"]["containers"][0].update(
                {"lifecycle": {"preStop": {"exec": {"command": ["drain.sh"]}}}}
            ),
            "own preStop",
        ),
        (
            lambda p: p["spec"]["containers"][0].update(
                {"ports": [{"name": "mcp", "containerPort": 8080}]}
            ),
            "declares port",
        ),
    ],
)
def test_a_pod_asking_wrongly_is_refused_before_any_epoch_is_taken(change: Any, said: str) -> None:
    bad = pod()
    change(bad)
    with pytest.raises(SidecarRefusal, match=said):
        check(bad, IMAGE)
    with pytest.raises(Refusal, match=said):
        injected(bad, EPOCH, "weather", DEFAULTS)


def test_without_a_sidecar_image_the_operator_refuses_with_what_to_set() -> None:
    with pytest.raises(SidecarRefusal, match="--sidecar-image"):
        check(pod(), None)


def test_an_mcpserver_with_the_sidecar_data_plane_marks_its_pods_for_it() -> None:
    mcps = {
        "metadata": {"name": "weather", "namespace": "tools", "uid": "u-1"},
        "spec": {
            "image": "node:22",
            "port": 8080,
            "dataPlane": {"mode": "sidecar", "upstreamPort": 3000},
            "epochService": {"tokenSecretRef": {"name": "weather-token", "key": "token"}},
            "drain": {"seconds": 12},
        },
    }
    deployment = build_deployment(mcps, DEFAULTS)
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        DATA_PLANE_ANNOTATION: "sidecar",
        UPSTREAM_PORT_ANNOTATION: "3000",
        SIDECAR_PORT_ANNOTATION: "8080",
    }
    (server,) = template["spec"]["containers"]
    assert "ports" not in server and "readinessProbe" not in server  # the sidecar's now
    # The pod the Deployment makes is what the webhook turns into a sidecar pod.
    out = injected(
        {"metadata": {**template["metadata"]}, "spec": template["spec"]},
        EPOCH,
        "weather",
        DEFAULTS,
    )
    side = out["spec"]["initContainers"][0]
    assert side["name"] == SIDECAR_CONTAINER
    # The server's mcp-epoch settings are the sidecar's: its token Secret and its drain.
    env = {e["name"]: e for e in side["env"]}
    assert env["MCP_EPOCH_SERVICE_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "weather-token"
    assert env["MCP_EPOCH_DRAIN_SECONDS"]["value"] == "12"
