"""The demo's fleet on Kubernetes: an ``McpServer``, the operator, a pod runner, a real rollout.

:class:`KubernetesFleet` is the :class:`~epochsvc.demo.fleet.FleetDriver` the scenario runs
when the replicas are pods. It does what a user does, with ``kubectl``: apply an ``McpServer``
(whose container command is the demo's replica) and later ``kubectl rollout restart`` the
Deployment the operator made for it. Everything in between is the cluster's job: the operator's
webhook injects ``MCP_EPOCH`` into every pod, the operator binds, drains and retires the pod
epochs in the epoch service, the Deployment controller replaces the pods one at a time
(``maxSurge: 1``, ``maxUnavailable: 0``), and kwok makes them Running and finishes deletions.
The :class:`~tests.e2e.podrunner.PodRunner` stands in for the kubelet's container runtime and
readiness prober: a local process per Running pod, with that pod's environment, in and out of
the balancer, and the pod Ready once its probe passes.

The driver never calls the epoch service itself (unlike the local fleet, which plays the
operator): every epoch a replica holds reached it through the API server.

One driver is one ``McpServer`` named ``demo-<kind>``; the naive fleet is the same server with
``--kind naive``, so both fleets go through the very same Kubernetes path and differ only in the
replica library (the naive replicas ignore ``MCP_EPOCH``) and the client.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from epochsvc.demo import upstream
from epochsvc.demo.fleet import FleetDriver, Kind, Replica, ReplicaSetListener
from tests.cluster.kwok_stages import PROBER_LABEL, PROBER_VALUE
from tests.e2e.podrunner import KubeAccess, PodProcess, PodRunner

Log = Callable[[str], None]
#: A fault made while the rollout runs (given the fleet); the rollout waits for it to end.
DuringDeploy = Callable[["KubernetesFleet"], Awaitable[None]]

API_VERSION = "mcp.epochs.dev/v1alpha1"
SERVER_LABEL = "mcp.epochs.dev/server"
#: Never pulled: kwok runs no containers, the pod runner runs the command with local Python.
IMAGE = "registry.invalid/mcp-epoch-demo:local"
#: The replica's buffer is sized as the operator computes it: window (s) x events per second.
RECONNECT_WINDOW_S = 30
PORT = 8080


def mcpserver_manifest(
    name: str,
    namespace: str,
    kind: Kind,
    replicas: int,
    token_secret: str,
    buffer_events: int,
    min_ready_seconds: int = 2,
    replica_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The ``McpServer`` of one fleet: the demo replica as the container command, the pod
    name as the replica's name (``$(MCP_POD_NAME)``, expanded as a kubelet would), serving on
    its pod IP and container port, rollouts one pod at a time with no capacity lost, a short
    preStop wait and drain, the replica token through a Secret reference, and its readiness
    (the operator's default probe, ``/readyz``) reported by the pod runner."""
    if kind == "sidecar":
        return sidecar_mcpserver_manifest(
            name, namespace, replicas, token_secret, buffer_events, min_ready_seconds
        )
    return {
        "apiVersion": API_VERSION,
        "kind": "McpServer",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": IMAGE,
            "replicas": replicas,
            "port": PORT,
            "path": "/mcp",
            "command": ["python", "-m", "epochsvc.demo.replica"],
            "args": [
                "--kind",
                kind,
                "--name",
                "$(MCP_POD_NAME)",
                "--buffer-events",
                "$(MCP_RESUME_BUFFER_EVENTS)",
                "--host",
                "$(MCP_POD_IP)",
                "--port",
                str(PORT),
                *replica_args,
            ],
            "env": [
                {"name": "MCP_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                *({"name": k, "value": v} for k, v in (env or {}).items()),
            ],
            "drain": {"seconds": 10, "preStopSeconds": 1, "minReadySeconds": min_ready_seconds},
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            "resumption": {
                "reconnectWindowSeconds": RECONNECT_WINDOW_S,
                "eventsPerSecond": max(1, math.ceil(buffer_events / RECONNECT_WINDOW_S)),
            },
            "epochService": {"tokenSecretRef": {"name": token_secret, "key": "token"}},
            # The pod runner, not kwok, says when a pod is Ready: when its probe passes.
            "podLabels": {
                "app.kubernetes.io/part-of": "mcp-epoch-demo",
                PROBER_LABEL: PROBER_VALUE,
            },
        },
    }


#: Where the TypeScript server listens inside its pod, behind the injected sidecar.
UPSTREAM_PORT = 3000


def sidecar_mcpserver_manifest(
    name: str,
    namespace: str,
    replicas: int,
    token_secret: str,
    buffer_events: int,
    min_ready_seconds: int,
) -> dict[str, Any]:
    """The ``McpServer`` of the sidecar fleet: the TypeScript SDK server (no event store, no
    mcp-epoch in it) as the container, listening on ``127.0.0.1:3000`` in its pod, and
    ``spec.dataPlane.mode: sidecar``: the webhook injects ``mcp-epoch proxy`` in front of it.
    Everything else as for the library's fleet."""
    base = mcpserver_manifest(
        name, namespace, "epoch", replicas, token_secret, buffer_events, min_ready_seconds
    )
    command = upstream.command("$(MCP_POD_NAME)", port=UPSTREAM_PORT, standalone=False)
    spec = base["spec"]
    spec["command"], spec["args"] = command[:2], [*command[2:], "--host", "127.0.0.1"]
    spec["env"] = []
    spec["dataPlane"] = {"mode": "sidecar", "upstreamPort": UPSTREAM_PORT}
    return base


def token_secret_manifest(name: str, namespace: str, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "Opaque",
        "stringData": {"token": token},
    }


class KubernetesFleet(FleetDriver):
    """Replicas as pods of an ``McpServer``, run locally by a :class:`PodRunner`."""

    def __init__(
        self,
        kind: Kind,
        listener: ReplicaSetListener,
        access: KubeAccess,
        namespace: str,
        workdir: Path,
        *,
        replica_token: str,
        buffer_events: int = 3000,
        name: str | None = None,
        min_ready: int = 2,
        settle_timeout: float = 90.0,
        log: Log = lambda _line: None,
        replica_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        during_deploy: DuringDeploy | None = None,
    ) -> None:
        self.kind = kind
        self.during_deploy = during_deploy
        self.killed: list[str] = []  # pods a fault killed (their names)
        self.replica_args = tuple(replica_args)  # more flags of the demo replica
        self.env = dict(env or {})  # more environment of its container
        self.min_ready = min_ready
        self.listener = listener
        self.access = access
        self.namespace = namespace
        self.name = name or f"demo-{kind}"
        self.token_secret = f"{self.name}-replica-token"
        self.replica_token = replica_token
        self.buffer_events = buffer_events
        self.settle_timeout = settle_timeout
        self.log = log
        self.count = 0
        #: Fewest replicas serving at any moment of the rolling deploy (None before it).
        self.min_serving_during_deploy: int | None = None
        self.deploy_seconds: float | None = None
        self.runner = PodRunner(
            access,
            namespace,
            f"{SERVER_LABEL}={self.name}",
            listener,
            workdir,
            service=self.name,  # the operator's Service has the McpServer's name
            log=log,
        )

    def replicas(self) -> list[Replica]:
        return [
            Replica(
                p.backend,
                p.env_epoch,
                p.process_epoch,
                drain=p.drain,
                ready_at=p.started_at,
                retiring_at=p.stopped_at,
            )
            for p in self.runner.processes()
            if p.backend is not None
        ]

    def pods(self) -> list[PodProcess]:
        """What the runner did, pod by pod (for checks beyond the scenario's figures)."""
        return self.runner.processes()

    async def start(self, count: int) -> None:
        self.count = count
        manifest = {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                token_secret_manifest(self.token_secret, self.namespace, self.replica_token),
                mcpserver_manifest(
                    self.name,
                    self.namespace,
                    self.kind,
                    count,
                    self.token_secret,
                    self.buffer_events,
                    self.min_ready,
                    self.replica_args,
                    self.env,
                ),
            ],
        }
        await self.access.run_kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        self.log(f"  kubectl apply: McpServer {self.namespace}/{self.name} ({count} replicas)")
        await self.runner.start()
        await self.runner.wait_until(
            lambda: len(self.runner.serving()) == count,
            self.settle_timeout,
            f"{count} pods of {self.name} serving",
        )

    async def rolling_deploy(self, pause: float) -> None:
        """``kubectl rollout restart``: the Deployment controller stops an old pod once a new
        one has been Ready (its readiness probe passed, so its process serves) for the
        ``minReadySeconds`` the operator sets from ``spec.drain`` (``pause``)."""
        deployment = f"deployment/{self.name}"
        ns = ("-n", self.namespace)
        old = {p.uid for p in self.runner.serving()}
        t0 = time.monotonic()
        mark = len(self.runner.timeline)
        await self.access.run_kubectl("rollout", "restart", deployment, *ns)
        self.log(f"  kubectl rollout restart {deployment} (minReadySeconds {self.min_ready})")
        fault = (
            None if self.during_deploy is None else asyncio.ensure_future(self.during_deploy(self))
        )
        timeout = f"--timeout={int(self.settle_timeout)}s"
        await self.access.run_kubectl("rollout", "status", deployment, *ns, timeout)
        if fault is not None:
            await fault

        def replaced() -> bool:
            now = {p.uid for p in self.runner.serving()}
            return len(now) == self.count and not now & old

        await self.runner.wait_until(replaced, self.settle_timeout, "the rollout's pods serving")
        self.deploy_seconds = time.monotonic() - t0
        during = [n for _, n in self.runner.timeline[mark:]]
        self.min_serving_during_deploy = min(during, default=self.count)
        self.log(
            f"  rollout finished in {self.deploy_seconds:.1f}s; fewest replicas serving "
            f"meanwhile: {self.min_serving_during_deploy}"
        )

    async def close(self) -> None:
        await self.runner.close()
        await self.access.run_kubectl(
            "delete",
            "mcpserver",
            self.name,
            "-n",
            self.namespace,
            "--ignore-not-found",
            "--wait=false",
        )


class KubeFleets:
    """A :data:`~epochsvc.demo.scenario.DriverFactory`: one :class:`KubernetesFleet` (one
    ``McpServer``) per fleet kind, all in ``namespace``; keeps them for inspection afterwards."""

    def __init__(
        self,
        access: KubeAccess,
        namespace: str,
        workdir: Path,
        *,
        replica_token: str,
        buffer_events: int = 3000,
        min_ready: int = 2,
        log: Log = lambda _line: None,
        during_deploy: DuringDeploy | None = None,
    ) -> None:
        self.access = access
        self.during_deploy = during_deploy
        self.namespace = namespace
        self.workdir = workdir
        self.replica_token = replica_token
        self.buffer_events = buffer_events
        self.min_ready = min_ready
        self.log = log
        self.fleets: list[KubernetesFleet] = []

    def __call__(self, kind: Kind, listener: ReplicaSetListener) -> FleetDriver:
        same = sum(f.kind == kind for f in self.fleets)
        fleet = KubernetesFleet(
            kind,
            listener,
            self.access,
            self.namespace,
            self.workdir,
            replica_token=self.replica_token,
            buffer_events=self.buffer_events,
            name=f"demo-{kind}" + (f"-{same + 1}" if same else ""),
            min_ready=self.min_ready,
            log=self.log,
            during_deploy=self.during_deploy,
        )
        self.fleets.append(fleet)
        return fleet
