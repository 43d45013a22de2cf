"""``mcp-epoch status`` (and ``kubectl mcp-epoch status``) against the loopback control plane:
an McpServer of two demo replicas (real processes, run by the pod runner, serving their pod
IPs), the real operator and epoch service, and the command run as a user runs it, as a
subprocess with a kubeconfig.

It must show what the ledger holds for each pod, the ring the service reports, the pods'
``/metrics`` read through the API server's pod proxy, and the exit code a script relies on; with
the epoch service out of reach it must still show what the cluster says, and say so. Without
flags it finds the service and the operator's token the way the chart's operator Deployment
declares them.

With ``MCP_EPOCH_STATUS_SAMPLE_DIR`` set, the outputs are also written there (the README's
sample is one of them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from epochsvc.demo.balancer import Backend
from mcp_epoch import api
from mcp_epoch.contract import ENV_RING_REFRESH
from tests.cluster.harness import Cluster
from tests.e2e.kube_fleet import KubernetesFleet
from tests.e2e.podrunner import KubeAccess
from tests.operator.support import EPOCH_ANNOTATION, OperatorProcess, apply, make_namespace, pods
from tests.operator.support import wait_for as wait_until
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.ports import free_port

pytestmark = pytest.mark.cluster
NAME = "status-demo"
REPLICAS = 2
SAMPLE_DIR = os.environ.get("MCP_EPOCH_STATUS_SAMPLE_DIR")
#: The operator's Deployment as the chart renders it (auth.mode=static), reduced to what status
#: reads; it has no replicas: nothing runs it, status only reads it.
OPERATOR_NS = "status-chart-operator"
TOKEN_DIR = "/var/run/secrets/mcp-epoch/operator-token"


class Unrouted:
    """No traffic here: the replicas join no balancer (status reads them, nothing calls them)."""

    def add(self, backend: Backend) -> None:
        pass

    def remove(self, name: str) -> None:
        pass


def run_status(
    cluster: Cluster, *args: str, via_kubectl: bool = False
) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: no epoch service settings inherited from this process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_EPOCH", "KUBECONFIG"))}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    if via_kubectl:
        # kubectl finds kubectl-mcp_epoch on PATH and passes every argument after it on.
        cmd = [str(cluster.binary("kubectl")), "mcp-epoch", "status"]
    else:
        cmd = [sys.executable, "-m", "epochsvc.cli", "status"]
    cmd += [*args, "--kubeconfig", str(cluster.kubeconfig)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def keep_sample(name: str, text: str) -> None:
    """Write ``text`` to the sample directory, if one is set."""
    if SAMPLE_DIR:
        Path(SAMPLE_DIR).mkdir(parents=True, exist_ok=True)
        Path(SAMPLE_DIR, name).write_text(text)


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"{proc.stdout}{proc.stderr}(exit code {proc.returncode})\n"


def _settled_json(cluster: Cluster, *args: str) -> tuple[dict[str, Any], str]:
    """The JSON status once it is healthy with every pod's epoch live and metrics read (the
    operator binds an epoch when it sees its pod, the replicas load the ring as they start)."""

    def look() -> tuple[dict[str, Any], str] | None:
        proc = run_status(cluster, *args, "-o", "json")
        assert proc.returncode in (0, 1), proc.stderr
        out = json.loads(proc.stdout)
        live = [p for p in out["pods"] if p["epochState"] == "live"]
        rs = out["requestState"] or {}
        done = (
            proc.returncode == 0
            and len(live) == REPLICAS == len(out["pods"])
            and out["handoffs"]["podsRead"] == REPLICAS
            and rs.get("podsAtRevision") == REPLICAS
        )
        return (out, proc.stdout) if done else None

    found: tuple[dict[str, Any], str] = wait_until(look, 45, "a settled, healthy status")
    return found


def test_status_shows_the_ledger_the_ring_and_the_problems_of_an_mcpserver(
    k8s_cluster: Cluster,
    e2e_operator: OperatorProcess,
    e2e_service: EpochServiceProcess,
    kube_access: KubeAccess,
    demo_namespace: str,
    tmp_path: Path,
) -> None:
    ns = demo_namespace
    token_file = tmp_path / "operator-token"
    token_file.write_text(e2e_service.operator_token + "\n")
    flags = ("-n", ns, "--epoch-service-url", e2e_service.url, "--token-file", str(token_file))

    def checks() -> None:
        out, raw = _settled_json(k8s_cluster, NAME, *flags)
        keep_sample("status.json", raw)
        # Every pod the cluster has, with the epoch the webhook gave it, as the ledger has it.
        listing = e2e_service.send(api.list_server(ns, NAME))
        ledger = {e.epoch: e for e in listing.epochs}
        current = {p["metadata"]["name"]: p for p in pods(k8s_cluster, ns, NAME)}
        assert {p["name"] for p in out["pods"]} == set(current)
        for row in out["pods"]:
            pod = current[row["name"]]
            entry = ledger[row["epoch"]]
            assert row["epoch"] == pod["metadata"]["annotations"][EPOCH_ANNOTATION]
            assert entry.pod_uid == pod["metadata"]["uid"] == row["uid"]
            assert (row["epochState"], row["processEpoch"], row["incarnation"]) == (
                entry.state,
                entry.process_epoch,
                entry.incarnation,
            )
            assert row["address"] == entry.address
            assert row["address"].startswith(pod["status"]["podIP"] + ":")
            assert row["ready"] is True and row["registered"] is True
            assert row["sessionsAdopted"] == 0 == row["sessionsHandedOff"]
        assert out["ledger"]["id"] == listing.ledger_id
        assert out["ledger"]["revision"] <= listing.revision
        assert out["ledger"]["epochs"]["live"] == REPLICAS
        ring = e2e_service.send(api.ring_status(ns, NAME))
        assert out["requestState"]["revision"] == ring.revision
        assert out["requestState"]["phase"] == "steady" == ring.phase
        assert out["requestState"]["behind"] == [] and not out["requestState"]["stalled"]
        assert out["epochService"] == {
            "url": e2e_service.url,
            "urlFrom": "--epoch-service-url",
            "tokenFrom": f"--token-file {token_file}",
            "reachable": True,
            "error": None,
            "hint": None,
        }
        assert not [p for p in out["problems"] if p["severity"] == "error"], out["problems"]
        types = {c["type"]: c["status"] for c in out["conditions"]}
        assert types == {
            "Ready": "True",
            "Progressing": "False",
            "EpochServiceReachable": "True",
            "RequestStateRing": "True",
        }

        # Through kubectl's plugin mechanism, as text, with no flags but the namespaces: the
        # URL and the token come from the operator's Deployment as the chart makes it (its
        # args, and the Secret its token volume mounts).
        chart_operator(k8s_cluster, e2e_service)
        text = run_status(
            k8s_cluster, NAME, "-n", ns, "--operator-namespace", OPERATOR_NS, via_kubectl=True
        )
        keep_sample("status.txt", _output(text))
        assert text.returncode == 0, text.stdout + text.stderr
        for row in out["pods"]:
            line = next(ln for ln in text.stdout.splitlines() if ln.startswith(row["name"]))
            assert line.split()[2:6] == [row["epoch"], "live", "0", row["address"]], line
        words = " ".join(text.stdout.split())
        assert (
            f"{e2e_service.url} reachable (from Deployment {OPERATOR_NS}/r-mcp-epoch-operator; "
            f"token from Secret {OPERATOR_NS}/r-mcp-epoch-operator-token key token)"
        ) in words
        assert f"revision {ring.revision}, steady: {REPLICAS} of {REPLICAS} pods" in words
        assert "ERROR" not in text.stdout

        # The epoch service out of reach: the cluster's side is still shown, and why not the
        # rest, with what to do; exit 1.
        closed = f"http://127.0.0.1:{free_port()}"
        down = run_status(k8s_cluster, NAME, "-n", ns, "--epoch-service-url", closed)
        keep_sample("status-unreachable.txt", _output(down))
        assert down.returncode == 1, down.stderr
        assert f"{closed} UNREACHABLE" in down.stdout
        assert "Problems (1):" in down.stdout
        assert f"ERROR   epoch service unreachable at {closed}: " in down.stdout
        for row in out["pods"]:
            line = next(ln for ln in down.stdout.splitlines() if ln.startswith(row["name"]))
            assert line.split()[2] == row["epoch"], line

        missing = run_status(k8s_cluster, "no-such-server", "-n", ns)
        assert missing.returncode == 3
        assert "neither an McpServer nor a Deployment" in missing.stderr

    async def scenario() -> None:
        fleet = KubernetesFleet(
            "epoch",
            Unrouted(),
            kube_access,
            ns,
            tmp_path / "fleet",
            replica_token=e2e_service.replica_token,
            name=NAME,
            min_ready=1,
            env={ENV_RING_REFRESH: "0.3"},
        )
        (tmp_path / "fleet").mkdir()
        try:
            await fleet.start(REPLICAS)
            await asyncio.to_thread(checks)
        finally:
            await fleet.close()

    asyncio.run(scenario())


def chart_operator(cluster: Cluster, service: EpochServiceProcess) -> None:
    """The operator-token Secret and the operator Deployment the chart renders with
    ``auth.mode=static`` (the parts status reads), scaled to zero."""
    make_namespace(cluster, OPERATOR_NS)
    labels = {
        "app.kubernetes.io/name": "mcp-epoch",
        "app.kubernetes.io/instance": "r",
        "app.kubernetes.io/component": "operator",
        "app.kubernetes.io/part-of": "mcp-epoch",
    }
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "r-mcp-epoch-operator-token", "namespace": OPERATOR_NS},
        "stringData": {"token": service.operator_token},
    }
    container = {
        "name": "operator",
        "image": "registry.invalid/mcp-epoch:local",
        "args": [
            "operator",
            "--all-namespaces",
            f"--epoch-service-url={service.url}",
            f"--operator-token-file={TOKEN_DIR}/token",
        ],
        "volumeMounts": [{"name": "operator-token", "mountPath": TOKEN_DIR, "readOnly": True}],
    }
    selector = {k: labels[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/component")}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "r-mcp-epoch-operator", "namespace": OPERATOR_NS, "labels": labels},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "operator-token",
                            "secret": {
                                "secretName": "r-mcp-epoch-operator-token",
                                "items": [{"key": "token", "path": "token"}],
                            },
                        }
                    ],
                },
            },
        },
    }
    apply(cluster, secret, deployment)
