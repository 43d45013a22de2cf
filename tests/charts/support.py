"""Helpers for the chart's tests: running helm, reading rendered manifests, and running the
chart's workloads as local processes under the chart's own ServiceAccount credentials."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.harness import Cluster
from tests.operator.support import OperatorProcess
from tests.support.epochsvc_proc import EpochServiceProcess

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "mcp-epoch"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
CRD_NAME = "mcpservers.mcp.epochs.dev.yaml"


class HelmError(AssertionError):
    """helm exited non-zero; the message carries its stderr (what a user would read)."""

    def __init__(self, args: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
        super().__init__(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        self.stderr = proc.stderr


@dataclass(frozen=True)
class Helm:
    """The pinned helm binary, optionally bound to a kubeconfig."""

    binary: Path
    kubeconfig: Path | None = None

    def run(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        """Run helm; returns stdout, raises HelmError (with stderr) when ``check``."""
        cmd = [str(self.binary), *args]
        if self.kubeconfig is not None:
            cmd.append(f"--kubeconfig={self.kubeconfig}")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise HelmError(args, proc)
        return proc.stdout

    def template(
        self,
        *,
        values: Iterable[Path] = (),
        sets: Iterable[str] = (),
        namespace: str = "mcp-epoch-system",
        release: str = "r",
        extra: Sequence[str] = (),
    ) -> list[dict[str, Any]]:
        """``helm template`` decoded into a list of manifests."""
        args = ["template", release, str(CHART), "--namespace", namespace, *extra]
        for path in values:
            args += ["--values", str(path)]
        for item in sets:
            args += ["--set", item]
        return parse_manifests(self.run(*args))


def ledger_volume(
    name: str, host_path: str, claim: tuple[str, str] | None = None
) -> dict[str, Any]:
    """A hostPath PersistentVolume for the ledger's claim (no provisioner runs here);
    ``claim`` (namespace, name) reserves it for that claim."""
    spec: dict[str, Any] = {
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "hostPath": {"path": host_path},
    }
    if claim is not None:
        spec["claimRef"] = {"namespace": claim[0], "name": claim[1]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": spec,
    }


def parse_manifests(text: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document of a rendered stream."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def find(
    manifests: Iterable[dict[str, Any]], kind: str, name_suffix: str = ""
) -> list[dict[str, Any]]:
    """Manifests of a kind whose name ends with ``name_suffix``."""
    return [
        m for m in manifests if m["kind"] == kind and m["metadata"]["name"].endswith(name_suffix)
    ]


def one(manifests: Iterable[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The single manifest of a kind (and name suffix); fails loudly otherwise."""
    found = find(manifests, kind, name_suffix)
    assert len(found) == 1, f"expected one {kind} *{name_suffix}, got {len(found)}"
    return found[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    """The only container of a Deployment's pod template."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def env_of(container_spec: dict[str, Any]) -> dict[str, Any]:
    """name -> value or valueFrom."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container_spec.get("env") or []}


def secret_value(cluster: Cluster, namespace: str, name: str, key: str) -> str:
    """A decoded Secret value, read as the admin."""
    data = cluster.kubectl_json("get", "secret", "-n", namespace, name)["data"]
    return base64.b64decode(data[key]).decode()


def serviceaccount_kubeconfig(cluster: Cluster, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig holding a fresh token of a ServiceAccount: whatever runs with it has
    exactly that account's permissions (what a pod of the chart would have)."""
    token = cluster.kubectl(
        "create", "token", name, "-n", namespace, "--duration=2h"
    ).stdout.strip()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority": str(cluster.ca_cert),
                },
            }
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": "local", "user": name, "namespace": namespace},
            }
        ],
        "current-context": name,
    }
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    path.chmod(0o600)
    return path


class ServiceAccountView:
    """The cluster as a ServiceAccount sees it, for ``OperatorProcess``.

    ``kubeconfig`` is the account's, so the operator process runs with the account's token;
    every other attribute (``kubectl``, certificates) is the harness's own, so the test's
    probes and set-up still act as the admin.
    """

    def __init__(self, cluster: Cluster, kubeconfig: Path) -> None:
        self._cluster = cluster
        self.kubeconfig = kubeconfig

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)


class ChartOperator(OperatorProcess):
    """``mcp-epoch operator`` with the flags of the chart's Deployment (as installed), only the
    in-pod paths and addresses swapped for local ones. Reuses the operator tests' process
    handling (start, the webhook readiness probe, stop)."""

    def __init__(
        self,
        view: ServiceAccountView,
        service: EpochServiceProcess,
        port: int,
        log_path: Path,
        args: list[str],
    ) -> None:
        super().__init__(view, service, port, log_path)  # type: ignore[arg-type]
        self.args = args

    def command(self) -> list[str]:
        return [sys.executable, "-m", "epochsvc.cli", *self.args]


def localize_operator_args(chart_args: list[str], local: dict[str, str]) -> list[str]:
    """The chart's ``--flag=value`` arguments with the values in ``local`` replaced.

    Every flag to replace must be present: a renamed flag in the chart is caught here rather
    than silently running the operator with defaults.
    """
    out: list[str] = []
    seen: set[str] = set()
    for arg in chart_args:
        flag, eq, _value = arg.partition("=")
        if eq and flag in local:
            out.append(f"{flag}={local[flag]}")
            seen.add(flag)
        else:
            out.append(arg)
    missing = set(local) - seen
    assert not missing, f"the chart's operator Deployment lacks {sorted(missing)}"
    return out
