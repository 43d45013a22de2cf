"""Fleet drivers: how replicas come and go, and how a rolling deploy happens.

The scenario only asks a :class:`FleetDriver` for "N replicas" and "a rolling deploy", and
learns the replica set of the moment through a :class:`ReplicaSetListener` (the balancer).
:class:`LocalProcessFleet` runs replicas as local processes and plays the operator against the
epoch service itself; a Kubernetes driver (pods, ``kubectl rollout restart``, a pod runner) can
implement the same interface and reuse the scenario, clients and checker unchanged.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx

from epochsvc.demo.balancer import Backend
from epochsvc.demo.service import EpochService
from mcp_epoch import api, contract
from mcp_epoch.api_client import EpochServiceClient

#: What a fleet's replicas run: mcp-epoch (the library, or the sidecar in front of the
#: TypeScript SDK server), the naive model, or the SDK with its example store.
Kind = Literal["naive", "epoch", "sidecar", "sdk"]
#: The kinds that run mcp-epoch: they need the epoch service.
EPOCH_KINDS: frozenset[Kind] = frozenset({"epoch", "sidecar"})
NAMESPACE = "demo"
SERVER = "demo"


class ReplicaSetListener(Protocol):
    """Whoever routes traffic: told when a replica joins or leaves the set."""

    def add(self, backend: Backend) -> None: ...

    def remove(self, name: str) -> None: ...


@dataclass
class Replica:
    backend: Backend
    epoch: str  # pod epoch ("" for naive replicas)
    process_epoch: str
    proc: subprocess.Popen[str] | None = None
    #: How the process left: seconds from SIGTERM to exit, and what its drain reported.
    stop_seconds: float | None = None
    drain: dict[str, Any] = field(default_factory=dict)
    killed: bool = False
    #: The handoff counters its ``/metrics`` showed just before it was stopped (a replica
    #: killed at teardown prints no drain report).
    counters: dict[str, float] = field(default_factory=dict)
    #: Stopped when the scenario ended, not by the deploy: its drain is not the deploy's.
    at_teardown: bool = False
    #: Its life on the driver's monotonic clock, for the report's timeline (``None``: this
    #: driver does not know): started (process or pod created), serving (joined the
    #: rotation), retiring (the deploy took it out: drain, leave the rotation, stop), exited.
    started_at: float | None = None
    ready_at: float | None = None
    retiring_at: float | None = None
    exited_at: float | None = None


@dataclass(frozen=True)
class Termination:
    """How a replica is stopped, as a kubelet stops a pod: the preStop wait, SIGTERM, and
    SIGKILL at the end of the grace period; the balancer learns of it *concurrently*, after
    ``endpoints_lag`` seconds (Endpoints/EndpointSlices are updated while the kubelet acts)."""

    prestop: float = 0.5
    grace: float = 10.0
    endpoints_lag: float = 0.3


class FleetDriver(abc.ABC):
    """Starts N replicas, replaces them all one by one, and tears everything down."""

    kind: Kind

    @abc.abstractmethod
    async def start(self, count: int) -> None:
        """Bring up ``count`` replicas and announce each to the listener once it serves."""

    @abc.abstractmethod
    async def rolling_deploy(self, pause: float) -> None:
        """Replace every replica, one at a time, ``pause`` seconds apart."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop every replica (and whatever else the driver started)."""

    @abc.abstractmethod
    def replicas(self) -> list[Replica]:
        """Every replica this driver started so far, in start order (for the report)."""


class LocalProcessFleet(FleetDriver):
    """Replicas as ``python -m epochsvc.demo.replica`` processes on loopback.

    For the mcp-epoch fleet the driver does what the operator does for a pod: issue a pod
    epoch, bind it, start the process with the injected environment; and for the old pod:
    drain, take it out of the rotation, stop the process, retire.
    """

    def __init__(
        self,
        kind: Kind,
        listener: ReplicaSetListener,
        workdir: Path,
        *,
        service: EpochService | None = None,
        buffer_events: int = 3000,
        log: Callable[[str], None] = lambda _line: None,
        termination: Termination | None = None,
        request_state: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if kind in EPOCH_KINDS and service is None:
            raise ValueError(f"the {kind} fleet needs the epoch service")
        self.kind = kind
        self.listener = listener
        self.workdir = workdir
        self.service = service
        self.buffer_events = buffer_events
        self.log = log
        self.termination = termination or Termination()
        self.request_state = request_state  # the replica's --request-state (None: its default)
        self.env = dict(env or {})  # added to every replica's environment
        self._all: list[Replica] = []
        self._live: list[Replica] = []
        self._counter = 0
        self._ops: EpochServiceClient | None = service.client() if service else None

    def replicas(self) -> list[Replica]:
        return list(self._all)

    async def start(self, count: int) -> None:
        started = await asyncio.gather(*(self._launch() for _ in range(count)))
        for rep in started:
            self._live.append(rep)
            self.listener.add(rep.backend)

    async def rolling_deploy(self, pause: float) -> None:
        for old in list(self._live):
            t0 = time.monotonic()
            new = await self._launch()
            self._live.append(new)
            self.listener.add(new.backend)
            await self._retire(old)
            self.log(
                f"  replaced {old.backend.name} by {new.backend.name}"
                + (f" (epoch {new.process_epoch})" if new.process_epoch else "")
                + f" in {time.monotonic() - t0:.1f}s"
            )
            await asyncio.sleep(pause)

    async def close(self) -> None:
        for r in self._all:
            r.at_teardown = r.at_teardown or (r.proc is not None and r.proc.poll() is None)
        await asyncio.gather(*(self._stop(r) for r in self._all))
        self._live.clear()
        if self._ops is not None:
            await self._ops.aclose()

    # --- one replica ----------------------------------------------------------------------

    async def _launch(self) -> Replica:
        started = time.monotonic()
        self._counter += 1
        name = f"{self.kind}-r{self._counter}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_")}
        epoch = ""
        uid = str(uuid.uuid4())
        if self.service is not None and self._ops is not None:
            epoch = (await self._ops.send(api.issue(NAMESPACE, SERVER, uid))).epoch
            await self._ops.send(api.bind(epoch, name, uid))
            env.update(
                {
                    contract.ENV_EPOCH: epoch,
                    contract.ENV_SERVICE_URL: self.service.url,
                    contract.ENV_SERVICE_TOKEN: self.service.replica_token,
                    contract.ENV_NAMESPACE: NAMESPACE,
                    contract.ENV_SERVER: SERVER,
                    contract.ENV_POD_NAME: name,
                    contract.ENV_POD_UID: uid,
                    contract.ENV_BUFFER: str(self.buffer_events),
                    # Room after the deadline for the exit itself (the operator leaves 5 s).
                    contract.ENV_DRAIN: str(self.termination.grace - 2.0),
                }
            )
        cmd = [sys.executable, "-m", "epochsvc.demo.replica", "--kind", self.kind, "--name", name]
        cmd += ["--buffer-events", str(self.buffer_events)]
        if self.request_state is not None:
            cmd += ["--request-state", self.request_state]
        env.update(self.env)
        log = self.workdir / f"{name}.log"
        proc = await asyncio.to_thread(_spawn, cmd, env, log)
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        if not line:
            raise RuntimeError(f"replica {name} exited at start; see {log}")
        info = json.loads(line)
        backend = Backend(name, "127.0.0.1", int(info["port"]))
        rep = Replica(backend, epoch, info["epoch"], proc, started_at=started)
        self._all.append(rep)
        await _wait_serving(rep.backend)
        if epoch and self._ops is not None:
            # As the operator does once the pod has an IP: the ledger learns where it serves.
            await self._ops.send(api.bind(epoch, name, uid, f"{backend.host}:{backend.port}"))
        rep.ready_at = time.monotonic()  # its caller adds it to the rotation now
        return rep

    async def _retire(self, rep: Replica) -> None:
        """The pod is deleted: the operator drains its epoch, the balancer drops it and the
        kubelet stops it, the last two concurrently; once it is gone the epoch is retired."""
        rep.retiring_at = time.monotonic()
        epoch = rep.epoch
        if epoch and self._ops is not None:
            await self._ops.send(api.drain(epoch))
        self._live.remove(rep)

        async def leave_rotation() -> None:
            await asyncio.sleep(self.termination.endpoints_lag)
            self.listener.remove(rep.backend.name)

        await asyncio.gather(leave_rotation(), self._stop(rep, self.termination))
        if epoch and self._ops is not None:
            await self._ops.send(api.retire(epoch))

    async def _stop(self, rep: Replica, how: Termination | None = None) -> None:
        proc, rep.proc = rep.proc, None
        if proc is None or proc.poll() is not None:
            return
        if self.kind in EPOCH_KINDS:
            rep.counters = await _scrape(rep.backend)
        if how is not None:
            await asyncio.sleep(how.prestop)  # the preStop hook, as the pod spec says
        began = time.monotonic()
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, how.grace if how else 2.0)
        except subprocess.TimeoutExpired:
            rep.killed = True
            proc.kill()
            await asyncio.to_thread(proc.wait)
        rep.exited_at = time.monotonic()
        rep.stop_seconds = rep.exited_at - began
        if proc.stdout is not None:
            rep.drain = drain_report(await asyncio.to_thread(proc.stdout.read))
            proc.stdout.close()


#: The replicas' handoff counters the report sums (``/metrics`` names, report keys).
COUNTERS = {
    "mcp_epoch_sessions_adopted_total": "adopted",
    "mcp_epoch_handed_session_requests_total": "served_handed",
    "mcp_epoch_tail_replays_total": "tail_replays",
}


async def _scrape(backend: Backend) -> dict[str, float]:
    """The handoff counters of a replica's ``/metrics`` (empty if it does not answer)."""
    url = f"http://{backend.host}:{backend.port}/metrics"
    try:
        async with httpx.AsyncClient(timeout=2.0) as http:
            text = (await http.get(url)).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            with contextlib.suppress(ValueError):
                out[COUNTERS[name]] = float(value)
    return out


def drain_report(output: str) -> dict[str, Any]:
    """The drain report an epoch replica prints as it exits (see :mod:`epochsvc.demo.replica`):
    the last JSON line with ``drained``, or empty (a naive replica, or a killed one)."""
    report: dict[str, Any] = {}
    for line in output.splitlines():
        with contextlib.suppress(ValueError):
            parsed = json.loads(line)
            if isinstance(parsed, dict) and "drained" in parsed:
                report = parsed
    return report


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[str]:
    with log.open("a") as err:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)


async def _wait_serving(backend: Backend, within: float = 20.0) -> None:
    """Ready = the app answers (the replicas say 405 to a plain GET: no standalone stream)."""
    url = f"http://{backend.host}:{backend.port}/mcp"
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2.0) as http:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url)).status_code == 405:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {backend.name} is not serving")
            await asyncio.sleep(0.05)
