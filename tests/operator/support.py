"""The operator as a real process, and small helpers shared by the operator's cluster tests."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.samples import Sample

from mcp_epoch import api
from tests.cluster.harness import Cluster
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.metrics import find, samples
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "mcpservers.mcp.epochs.dev.yaml"
SERVER_LABEL = "mcp.epochs.dev/server"
EPOCH_ANNOTATION = "mcp.epochs.dev/epoch"
OPERATOR_NAMESPACE = "mcp-epoch-system"
WEBHOOK_CONFIG = "mcp-epoch-operator"  # the operator's default --webhook-config-name


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.3) -> Any:
    """Poll until ``check`` returns something truthy; return it. Exceptions mean "not yet"."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval)


_PEER_HOSTS = itertools.count()


@dataclass(frozen=True)
class Metrics:
    """The samples of one scrape: read many from it, and they agree with each other (and a
    histogram's buckets cost one scrape, not one each)."""

    samples: list[Sample]

    def value(self, name: str, **labels: str) -> float:
        """One sample's value (0 when the scrape has none yet)."""
        found = find(self.samples, name, **labels)
        return 0.0 if found is None else found


class OperatorProcess:
    """``mcp-epoch operator`` in its own process group, stopped and restarted for real.

    The webhook port is chosen once, so the registered configuration stays valid across
    restarts (as the chart's Service would).
    """

    def __init__(
        self,
        cluster: Cluster,
        service: EpochServiceProcess,
        port: int,
        log_path: Path,
        resync_interval: float = 2.0,
        rotation_stall_seconds: float | None = None,
    ) -> None:
        self.cluster = cluster
        self.resync_interval = resync_interval
        self.rotation_stall_seconds = rotation_stall_seconds
        self.service = service
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.metrics_port = free_port()
        # Its own loopback address for relayed admissions: the webhook port is shared.
        self.peer_address = f"127.0.0.{2 + next(_PEER_HOSTS) % 250}:{port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "epochsvc.cli",
            "operator",
            "--all-namespaces",
            "--operator-namespace",
            OPERATOR_NAMESPACE,
            "--epoch-service-url",
            self.service.url,
            "--webhook-host",
            "127.0.0.1",
            "--webhook-port",
            str(self.port),
            "--webhook-share-port",  # a second operator process may serve it too
            "--webhook-peer-address",
            self.peer_address,
            "--webhook-cert",
            str(self.cluster.webhook_cert),
            "--webhook-key",
            str(self.cluster.webhook_key),
            "--webhook-ca",
            str(self.cluster.ca_cert),
            "--register-webhook",
            "--replica-token-secret",
            "replica-token",
            "--sidecar-image",  # never pulled: the pod runner runs the sidecar's command
            "registry.invalid/mcp-epoch:local",
            "--resync-interval",
            str(self.resync_interval),
            "--metrics-port",
            str(self.metrics_port),
            *(
                ("--rotation-stall-seconds", str(self.rotation_stall_seconds))
                if self.rotation_stall_seconds is not None
                else ()
            ),
        ]

    def metrics(self) -> Metrics:
        """One scrape of the operator's ``/metrics``, every sample of it at one moment."""
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text
        return Metrics(samples(text))

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the operator's ``/metrics`` (0 when it has none yet)."""
        return self.metrics().value(name, **labels)

    def start(self) -> OperatorProcess:
        assert self.proc is None, "already running"
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "MCP_EPOCH_OPERATOR_TOKEN": self.service.operator_token,
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._serving, 60, "the operator's webhook to answer")
        return self

    def _serving(self) -> bool:
        """A server-side dry run of a labelled pod passes through the webhook only when this
        process serves it (and issues nothing: sideEffects NoneOnDryRun)."""
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the operator exited; log:\n{self.tail()}")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe", "labels": {SERVER_LABEL: "probe"}},
            "spec": {"containers": [{"name": "c", "image": "registry.invalid/probe:1"}]},
        }
        proc = self.cluster.kubectl(
            "create",
            "-n",
            "default",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
            stdin=json.dumps(pod),
            check=False,
        )
        return proc.returncode == 0 and "dry run" in proc.stderr

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: nothing runs on the way out, as in a crash or an eviction."""
        self.stop(signal.SIGKILL)

    def tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


# ----------------------------------------------------------------------------- kubectl helpers


def install_crd(cluster: Cluster) -> Path:
    """The McpServer CRD as the chart ships it, served, plus the operator's namespace
    (idempotent: several test packages install it)."""
    cluster.kubectl("apply", "-f", str(CRD_FILE))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/mcpservers.mcp.epochs.dev", "--timeout=60s"
    )
    wait_for(
        lambda: cluster.kubectl("get", "mcps", "-A", check=False).returncode == 0,
        30,
        "mcpservers to be served",
    )
    make_namespace(cluster, OPERATOR_NAMESPACE)
    return CRD_FILE


@contextmanager
def operator_running(
    cluster: Cluster, service: EpochServiceProcess, log: Path, resync_interval: float = 2.0
) -> Iterator[OperatorProcess]:
    """``mcp-epoch operator`` as a real process that serves and registers its webhook; the
    registration goes with it, so other test packages never meet a leftover webhook.

    Tests resync every 2 s (a lost event shows within a test's patience); a benchmark passes
    the operator's default, 30 s, to measure what a cluster runs."""
    proc = OperatorProcess(cluster, service, free_port(), log, resync_interval)
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()
        cluster.kubectl(
            "delete", "mutatingwebhookconfiguration", WEBHOOK_CONFIG, "--ignore-not-found"
        )


def apply(cluster: Cluster, *objects: dict[str, Any]) -> None:
    body = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))


def make_namespace(cluster: Cluster, name: str) -> str:
    apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def mcpserver(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mcp.epochs.dev/v1alpha1",
        "kind": "McpServer",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"image": "registry.invalid/mcp-echo:1", "terminationGracePeriodSeconds": 1} | spec,
    }


def pods(cluster: Cluster, ns: str, server: str) -> list[dict[str, Any]]:
    items = cluster.kubectl_json("get", "pods", "-n", ns, "-l", f"{SERVER_LABEL}={server}")
    return list(items["items"])


def ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", [])
    )


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def ledger(service: EpochServiceProcess, ns: str, server: str) -> list[api.Epoch]:
    return service.send(api.list_server(ns, server)).epochs


def ledger_states(service: EpochServiceProcess, ns: str, server: str) -> dict[str, str]:
    return {e.epoch: e.state for e in ledger(service, ns, server)}


def get_mcps(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return dict(cluster.kubectl_json("get", "mcpservers", "-n", ns, name))


def condition(mcps: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (mcps.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


def settled(
    cluster: Cluster, service: EpochServiceProcess, ns: str, name: str, replicas: int
) -> dict[str, Any] | None:
    """The agreed end state, or None: ``replicas`` ready pods, each carrying a distinct epoch
    that the ledger has live and bound to that pod; no other epoch of the server is live or
    draining (pending ones no pod carries are the admission pool's); and the McpServer status
    lists exactly those epochs as live."""
    current = [p for p in pods(cluster, ns, name) if not p["metadata"].get("deletionTimestamp")]
    if len(current) != replicas or not all(ready(p) for p in current):
        return None
    by_pod = {p["metadata"]["annotations"][EPOCH_ANNOTATION]: p for p in current}
    if len(by_pod) != replicas:
        return None
    entries = ledger(service, ns, name)
    active = {
        e.epoch: e
        for e in entries
        if e.state in ("live", "draining") or (e.state == "pending" and e.epoch in by_pod)
    }
    if set(active) != set(by_pod):
        return None
    for epoch, entry in active.items():
        if entry.state != "live" or entry.pod_uid != by_pod[epoch]["metadata"]["uid"]:
            return None
    mcps = get_mcps(cluster, ns, name)
    status = mcps.get("status") or {}
    listed = {e["epoch"]: e["state"] for e in status.get("epochs") or []}
    if listed != dict.fromkeys(by_pod, "live") or status.get("readyReplicas") != replicas:
        return None
    if condition(mcps, "Ready").get("status") != "True":
        return None
    return {"pods": by_pod, "ledger": entries, "mcps": mcps}
