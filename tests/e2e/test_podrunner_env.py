"""The pod runner's kubelet-like environment on hand-made pods (no cluster needed).

The end-to-end proof is only as good as this: the process must see exactly the environment
the pod spec gives it (the webhook's MCP_EPOCH, the Downward API fields, the Secret's token),
with Kubernetes' own ``$(VAR)`` rules, and fail like a kubelet when a reference is missing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.e2e.podrunner import (
    PodEnvError,
    container_argv,
    container_env,
    expand,
    field_value,
)

POD: dict[str, Any] = {
    "metadata": {
        "name": "demo-epoch-abc",
        "namespace": "ns1",
        "uid": "u-1",
        "labels": {"mcp.epochs.dev/server": "demo-epoch"},
        "annotations": {"mcp.epochs.dev/epoch": "9f2c1a7e-42"},
    },
    "spec": {"nodeName": "kwok-node-0"},
    "status": {"podIP": "10.244.0.7"},
}

SECRETS = {"tok": {"token": "s3cret"}}
MAPS = {"cfg": {"MODE": "fast", "LEVEL": "2"}}


async def _secret(name: str) -> dict[str, str] | None:
    return SECRETS.get(name)


async def _map(name: str) -> dict[str, str] | None:
    return MAPS.get(name)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return asyncio.run(container_env(POD, container, _secret, _map))


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("$(A)-$(B)", "1-two"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("cost $5", "cost $5"),
        ("$(A", "$(A"),
        ("end$", "end$"),
        ("", ""),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, want: str) -> None:
    assert expand(text, {"A": "1", "B": "two"}) == want


def test_field_refs() -> None:
    assert field_value(POD, "metadata.name") == "demo-epoch-abc"
    assert field_value(POD, "metadata.uid") == "u-1"
    assert field_value(POD, "metadata.namespace") == "ns1"
    assert field_value(POD, "metadata.annotations['mcp.epochs.dev/epoch']") == "9f2c1a7e-42"
    assert field_value(POD, "metadata.labels['mcp.epochs.dev/server']") == "demo-epoch"
    assert field_value(POD, "status.podIP") == "10.244.0.7"
    with pytest.raises(PodEnvError):
        field_value(POD, "spec.containers[0]")


def test_operator_style_env_resolves_like_a_kubelet() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "APP_"}],
        "env": [
            {"name": "MCP_SERVER_NAME", "value": "demo-epoch"},
            {"name": "MCP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "MCP_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {
                "name": "MCP_EPOCH_SERVICE_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}},
            },
            {"name": "MCP_EPOCH", "value": "9f2c1a7e-42"},
            {"name": "GREETING", "value": "$(MCP_POD_NAME) in $(APP_MODE), $(LATER)"},
            {"name": "LATER", "value": "x"},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}},
            },
        ],
    }
    env = env_of(container)
    assert env["MCP_EPOCH"] == "9f2c1a7e-42"
    assert env["MCP_POD_NAME"] == "demo-epoch-abc"
    assert env["MCP_POD_UID"] == "u-1"
    assert env["MCP_EPOCH_SERVICE_TOKEN"] == "s3cret"
    assert env["APP_MODE"] == "fast" and env["APP_LEVEL"] == "2"
    # Only variables defined earlier expand; a later one stays as written.
    assert env["GREETING"] == "demo-epoch-abc in fast, $(LATER)"
    assert "OPT" not in env


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "token"}}},
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "other"}}},
        {"name": "T", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "MODE"}}},
        {"name": "T", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
    ],
)
def test_missing_or_unsupported_reference_refuses_to_start(entry: dict[str, Any]) -> None:
    with pytest.raises(PodEnvError):
        env_of({"env": [entry]})


def test_argv_expands_and_maps_the_interpreter() -> None:
    container = {
        "command": ["python", "-m", "epochsvc.demo.replica"],
        "args": ["--name", "$(MCP_POD_NAME)", "--raw", "$$(MCP_POD_NAME)"],
    }
    argv = container_argv(container, {"MCP_POD_NAME": "p1"}, {"python": "/venv/bin/python"})
    want = ["/venv/bin/python", "-m", "epochsvc.demo.replica", "--name", "p1"]
    assert argv == [*want, "--raw", "$(MCP_POD_NAME)"]
    with pytest.raises(PodEnvError):
        container_argv({"args": ["x"]}, {}, {})
