"""A pod runner: the part of a kubelet that a kwok control plane leaves out.

kwok makes pods ``Running``/``Ready`` without running anything, so on a kwok cluster nothing
would serve the MCP traffic of an ``McpServer``'s pods. :class:`PodRunner` closes that gap for
the demo: it watches the pods of one server through the API server and, for each pod reported
``Running``, starts the pod's container command as a local process with the environment the
kubelet would give it (literal values with ``$(VAR)`` expansion, ``secretKeyRef`` and
``configMapKeyRef`` read from the API, Downward API ``fieldRef``), so the process sees the
``MCP_EPOCH`` the operator's webhook injected, the token from the Secret, its pod name and UID.
When the pod gets a deletion timestamp (or disappears), the runner stops the process as a
kubelet does, not more kindly: the preStop hook (a ``sleep`` action), then SIGTERM, then
SIGKILL at the end of the grace period (counted from the deletion, preStop included). The
balancer learns of it *concurrently*, from the Service's EndpointSlices: a pod leaves the
rotation when the EndpointSlice controller marks its endpoint not ready, whenever that is.

For a pod labelled for it (:data:`~tests.cluster.kwok_stages.PROBER_LABEL`), which kwok starts
Running but not ready, the runner also plays the kubelet's readiness prober
(:mod:`tests.e2e.prober`): it probes the container's ``readinessProbe`` once the process serves
and writes the pod's ``Ready`` condition, so the Deployment controller counts a new pod only
once it serves and the EndpointSlice controller follows the probe.

A pod with **native sidecars** (init containers with ``restartPolicy: Always``, such as the
mcp-epoch sidecar the webhook injects) runs in the kubelet's order: each sidecar is started
before the next container (none has a startup probe, so started is enough), then the main
container; the pod is Ready when the sidecar's readiness probe passes (a main container without
a probe is ready once started). On deletion the main container's preStop runs to its end (an
``httpGet`` hook is the request, with its headers, answered or timed out at the grace period),
then the main container gets SIGTERM, and only once it has exited do the sidecars get theirs,
in reverse order; SIGKILL for whatever outlives the grace period (a hook that used it all up
leaves 2 s, as the kubelet grants). All containers of a pod share its network namespace, so
its loopback is its own; the pods here share this machine's, so ``127.0.0.1``, ``localhost``
and ``0.0.0.0`` in a container's command mean the pod's IP.

What it deliberately does not emulate: images (the command runs with this machine's Python),
liveness and startup probes, restarts, volumes. Pod IPs are real: the control plane hands out
addresses of the benchmarking range (``198.18.0.0/16``, routed to the loopback device), so a
process binds its pod's IP and container port, and the address the operator records for
forwarding reaches it. The demo's replica (:mod:`epochsvc.demo.replica`) prints one JSON line
``{"port": ..., "epoch": ...}`` on start.

Only loopback addresses carry traffic; the API server is reached through ``kubernetes_asyncio``
with the kubeconfig given in :class:`KubeAccess` (the admin identity of the local control plane
in the tests).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from epochsvc.demo.balancer import Backend
from epochsvc.demo.fleet import ReplicaSetListener, _wait_serving, drain_report
from tests.cluster.kube import MERGE, AsyncApiException, AsyncKube
from tests.e2e.prober import ReadinessProber, probe_of, probed_by_runner, with_readiness

Log = Callable[[str], None]
Pod = dict[str, Any]
#: Reads a Secret's or ConfigMap's data by name (decoded strings), ``None`` when it is absent.
Lookup = Callable[[str], Awaitable[dict[str, str] | None]]

#: What keeps a deleted pod's object until the runner has stopped its process.
FINALIZER = "mcp-epoch.test/pod-runner"
#: The pod annotation that records the epoch the webhook injected (see docs/design.md).
EPOCH_ANNOTATION = "mcp.epochs.dev/epoch"
#: Environment the runner never passes down from its own process: a pod gets these only from
#: its spec, so a value left in the runner's shell can never stand in for an injected one.
_NOT_INHERITED = ("MCP_", "EPOCHSVC_", "KUBECONFIG")


#: What a container's command says for "this pod": its IP here (see the module's docstring).
POD_LOCAL = ("127.0.0.1", "localhost", "0.0.0.0")


def in_pod_network(argv: list[str], ip: str) -> list[str]:
    """``argv`` with the pod's own addresses (``127.0.0.1[:port]`` ...) as its pod IP."""
    out = []
    for word in argv:
        for local in POD_LOCAL:
            if word == local or word.startswith(local + ":"):
                word = ip + word[len(local) :]
                break
        out.append(word)
    return out


def native_sidecars(pod: Pod) -> list[dict[str, Any]]:
    """The pod's native sidecars, in spec order."""
    inits = (pod.get("spec") or {}).get("initContainers") or []
    return [c for c in inits if c.get("restartPolicy") == "Always"]


#: What ends one list-and-watch round: the runner lists again (an expired version is a 410).
WATCH_ERRORS = (AsyncApiException, aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError)


class PodEnvError(RuntimeError):
    """The pod's environment cannot be built (a kubelet would report CreateContainerConfigError)."""


@dataclass(frozen=True)
class KubeAccess:
    """How to reach one API server: a kubeconfig (read by the official client), and the
    kubectl binary for the operations a human would type (apply, rollout restart)."""

    kubeconfig: Path
    kubectl: Path

    async def client(self) -> AsyncKube:
        return await AsyncKube.connect(self.kubeconfig)

    async def run_kubectl(self, *args: str, stdin: str | None = None) -> str:
        """``kubectl --kubeconfig=... args``; a non-zero exit raises with kubectl's stderr."""
        proc = await asyncio.create_subprocess_exec(
            str(self.kubectl),
            f"--kubeconfig={self.kubeconfig}",
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        if proc.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} exited {proc.returncode}: {err.decode().strip()}"
            )
        return out.decode()


# ------------------------------------------------------------------------ environment (pure)


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: a defined ``$(VAR)`` is replaced, an undefined one is
    left as written, ``$$`` is one literal ``$`` (so ``$$(VAR)`` stays ``$(VAR)``)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "$" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end < 0:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def field_value(pod: Pod, path: str) -> str:
    """A Downward API ``fieldRef`` of the fields a container can ask for."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            key = path[len(prefix) + 2 : -2]
            return str((meta.get(source) or {}).get(key, ""))
    raise PodEnvError(f"unsupported fieldRef {path!r}")


async def container_env(
    pod: Pod,
    container: Mapping[str, Any],
    secret: Lookup,
    config_map: Lookup,
) -> dict[str, str]:
    """The environment a kubelet builds for ``container`` of ``pod``, in its order: ``envFrom``
    first, then ``env`` entries, each literal value expanded against the ones before it.

    """
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        for kind, fetch in (("secretRef", secret), ("configMapRef", config_map)):
            ref = source.get(kind)
            if ref is None:
                continue
            data = await fetch(str(ref["name"]))
            if data is None:
                if ref.get("optional"):
                    continue
                raise PodEnvError(f"envFrom {kind} {ref['name']!r} not found")
            env.update({prefix + k: v for k, v in data.items()})
    for entry in container.get("env") or []:
        name = str(entry["name"])
        if "valueFrom" not in entry:
            env[name] = expand(str(entry.get("value") or ""), env)
            continue
        value_from = entry["valueFrom"] or {}
        if "fieldRef" in value_from:
            env[name] = field_value(pod, str(value_from["fieldRef"]["fieldPath"]))
            continue
        for kind, fetch in (("secretKeyRef", secret), ("configMapKeyRef", config_map)):
            ref = value_from.get(kind)
            if ref is None:
                continue
            data = await fetch(str(ref["name"]))
            key = str(ref["key"])
            if data is not None and key in data:
                env[name] = data[key]
            elif not ref.get("optional"):
                raise PodEnvError(f"{name}: {kind} {ref['name']}/{key} not found")
            break
        else:
            raise PodEnvError(f"{name}: unsupported valueFrom {sorted(value_from)}")
    return env


def container_argv(
    container: Mapping[str, Any], env: Mapping[str, str], executables: Mapping[str, str]
) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded; the first word is mapped through
    ``executables`` (the image's ``python`` is this machine's interpreter)."""
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    argv = [expand(word, env) for word in command + args]
    if not command:
        raise PodEnvError("the container has no command (the runner has no image entrypoints)")
    argv[0] = executables.get(argv[0], argv[0])
    return argv


# ------------------------------------------------------------------------------ the runner


@dataclass
class PodProcess:
    """One pod and the local process that stands for its container."""

    pod: str
    uid: str
    annotated_epoch: str  # what the webhook recorded on the pod
    grace: float  # seconds from the deletion to SIGKILL (preStop included)
    prestop: float = 0.0  # the preStop hook's sleep
    prestop_get: dict[str, Any] | None = None  # the preStop hook's httpGet
    sidecars: tuple[str, ...] = ()  # the pod's native sidecars, by name
    main: str = ""  # the main container's name
    sidecar_procs: list[asyncio.subprocess.Process] = field(default_factory=list, repr=False)
    #: Monotonic times of a sidecar pod's stop: its preStop hook answered, its main container
    #: exited, its last sidecar exited (the kubelet's order, as the tests check it).
    hook_done_at: float | None = None
    main_exited_at: float | None = None
    sidecars_exited_at: float | None = None
    #: Set as the main container is sent SIGTERM, its preStop hook done: its drain begins.
    sigterm_sent: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    ip: str = "127.0.0.1"
    in_rotation: bool = False  # the balancer routes to it
    endpoint_ready: bool = False  # its EndpointSlice endpoint has been ready
    held: bool = False  # the runner's finalizer is on the pod
    probed: bool = False  # the runner reports its readiness (kwok left it not ready)
    drain: dict[str, Any] = field(default_factory=dict)  # the process's drain report
    alive: asyncio.subprocess.Process | None = field(default=None, repr=False)  # until it exits
    env_epoch: str = ""  # MCP_EPOCH the process was given
    process_epoch: str = ""  # what the process announced
    backend: Backend | None = None
    started_at: float | None = None  # monotonic: serving
    stopped_at: float | None = None  # monotonic: out of the balancer, process stopping
    error: str | None = None
    deleted: bool = False  # the pod is being deleted or is gone
    exited: bool = False  # the process ended on its own while its pod was Running
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)
    prober: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def serving(self) -> bool:
        return (
            self.backend is not None
            and self.started_at is not None
            and not self.deleted
            and not self.exited
        )


class PodRunner:
    """Runs a local process for every ``Running`` pod matching ``selector`` in ``namespace``
    and announces it to ``listener`` once it serves; stops it when the pod is deleted.

    Pods are followed with list + watch (re-listed after every watch ends or expires), so a
    missed event only delays the runner; it never leaves a process without its pod.
    """

    def __init__(
        self,
        access: KubeAccess,
        namespace: str,
        selector: str,
        listener: ReplicaSetListener,
        workdir: Path,
        *,
        executables: Mapping[str, str] | None = None,
        start_timeout: float = 30.0,
        service: str | None = None,
        log: Log = lambda _line: None,
    ) -> None:
        self.access = access
        self.service = service  # whose EndpointSlices take pods out of the rotation
        self.namespace = namespace
        self.selector = selector
        self.listener = listener
        self.workdir = workdir
        self.executables = dict(
            executables
            or {
                "python": sys.executable,
                "python3": sys.executable,
                # The mcp-epoch image's entrypoint (the injected sidecar runs it).
                "mcp-epoch": str(Path(sys.executable).with_name("mcp-epoch")),
            }
        )
        self.start_timeout = start_timeout
        self.log = log
        self.errors: list[str] = []
        self._pods: dict[str, PodProcess] = {}  # by pod UID, in the order pods were seen
        self._stops: list[asyncio.Task[None]] = []
        self._api: AsyncKube | None = None
        self._watch: asyncio.Task[None] | None = None
        self._endpoints: asyncio.Task[None] | None = None
        self._slices: dict[str, dict[str, bool]] = {}  # EndpointSlice -> pod UID -> ready
        self._changed = asyncio.Event()
        #: (monotonic time, replicas serving) after every change of the balancer's set.
        self.timeline: list[tuple[float, int]] = []

    # --- what the fleet asks ----------------------------------------------------------------

    def processes(self) -> list[PodProcess]:
        """Every pod the runner started a process for, in start order."""
        started = [p for p in self._pods.values() if p.started_at is not None]
        return sorted(started, key=lambda p: p.started_at or 0.0)

    def serving(self) -> list[PodProcess]:
        return [p for p in self._pods.values() if p.serving]

    async def wait_until(self, check: Callable[[], bool], within: float, what: str) -> None:
        """Wait for the runner's state to satisfy ``check`` (re-checked on every change)."""
        deadline = time.monotonic() + within
        while True:
            self._changed.clear()  # before checking, so no change between the two is missed
            if check():
                return
            left = deadline - time.monotonic()
            if left <= 0:
                problems = "; ".join(self.errors[-3:]) or "no process errors"
                raise TimeoutError(f"timed out after {within:.0f}s waiting for {what} ({problems})")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))

    async def start(self) -> None:
        self._api = await self.access.client()
        self._watch = asyncio.create_task(self._follow(), name=f"podrunner-{self.selector}")
        if self.service is not None:
            self._endpoints = asyncio.create_task(self._follow_endpoints())

    async def close(self) -> None:
        """Stop following pods and stop every process (as if every pod were deleted)."""
        for task in (self._watch, self._endpoints):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for pp in list(self._pods.values()):
            self._gone(pp)
        tasks = [
            t
            for pp in self._pods.values()
            for t in (pp.task, pp.watcher, pp.prober)
            if t is not None
        ]
        await asyncio.gather(*tasks, *self._stops, return_exceptions=True)
        if self._api is not None:
            await self._api.close()

    # --- following the API server -----------------------------------------------------------

    async def _follow(self) -> None:
        assert self._api is not None
        while True:
            try:
                version = await self._relist(self._api)
                await self._watch_from(self._api, version)
            except asyncio.CancelledError:
                raise
            except WATCH_ERRORS as exc:
                self.log(f"  pod runner: watch interrupted ({exc!r}); listing again")
                await asyncio.sleep(0.5)

    async def _relist(self, api: AsyncKube) -> str:
        body = await api.json(
            api.core.list_namespaced_pod, self.namespace, label_selector=self.selector
        )
        present = set()
        for pod in body.get("items") or []:
            present.add(pod["metadata"]["uid"])
            self._observe(pod)
        for uid, pp in list(self._pods.items()):
            if uid not in present:
                self._gone(pp)
        return str(body["metadata"]["resourceVersion"])

    async def _watch_from(self, api: AsyncKube, version: str) -> None:
        events = api.watch(
            api.core.list_namespaced_pod,
            self.namespace,
            label_selector=self.selector,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=60,
        )
        async for kind, obj in events:
            if kind in ("ADDED", "MODIFIED"):
                self._observe(obj)
            elif kind == "DELETED":
                pp = self._pods.get(obj["metadata"]["uid"])
                if pp is not None:
                    self._gone(pp)

    def _observe(self, pod: Pod) -> None:
        meta = pod["metadata"]
        uid = str(meta["uid"])
        phase = (pod.get("status") or {}).get("phase")
        known = self._pods.get(uid)
        if meta.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
            if known is not None:
                self._gone(known)
            return
        if known is not None or phase != "Running":
            return
        spec = pod.get("spec") or {}
        grace = meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds"))
        container = (spec.get("containers") or [{}])[0]
        pre = (container.get("lifecycle") or {}).get("preStop") or {}
        sleep = pre.get("sleep") or {}
        pp = PodProcess(
            pod=str(meta["name"]),
            uid=uid,
            annotated_epoch=str((meta.get("annotations") or {}).get(EPOCH_ANNOTATION, "")),
            grace=float(30 if grace is None else grace),
            prestop=float(sleep.get("seconds") or 0),
            ip=str((pod.get("status") or {}).get("podIP") or "127.0.0.1"),
            probed=probed_by_runner(pod),
            prestop_get=pre.get("httpGet"),
            sidecars=tuple(str(c["name"]) for c in native_sidecars(pod)),
            main=str(container.get("name", "")),
        )
        self._pods[uid] = pp
        pp.task = asyncio.create_task(self._run(pp, pod), name=f"pod-{pp.pod}")

    # --- one pod's process ------------------------------------------------------------------

    async def _secret(self, name: str) -> dict[str, str] | None:
        data = await self._object("secrets", name)
        if data is None:
            return None
        return {k: base64.b64decode(v).decode() for k, v in (data.get("data") or {}).items()}

    async def _config_map(self, name: str) -> dict[str, str] | None:
        data = await self._object("configmaps", name)
        return None if data is None else {k: str(v) for k, v in (data.get("data") or {}).items()}

    async def _object(self, plural: str, name: str) -> dict[str, Any] | None:
        assert self._api is not None
        read = {
            "secrets": self._api.core.read_namespaced_secret,
            "configmaps": self._api.core.read_namespaced_config_map,
        }[plural]
        body: dict[str, Any] | None = await self._api.find(read, name, self.namespace)
        return body

    async def _run(self, pp: PodProcess, pod: Pod) -> None:
        t0 = time.monotonic()
        sidecars = native_sidecars(pod)
        # The container whose probe decides the pod's readiness: the sidecar's, if it has one.
        container = sidecars[0] if sidecars else (pod.get("spec") or {}).get("containers", [{}])[0]
        try:
            probe = probe_of(container, pp.ip) if pp.probed else None
            await self._hold(pp, pod)
            await self._ip_free(pp)
            if sidecars:
                await self._launch_with_sidecars(pp, pod, sidecars)
            else:
                await self._launch(pp, pod)
        except Exception as exc:
            pp.error = f"pod {pp.pod}: {exc}"
            self.errors.append(pp.error)
            self.log(f"  pod runner: {pp.error}")
            await self._terminate(pp)
            return
        finally:
            self._changed.set()
        if pp.deleted:  # deleted while starting: never announce it
            await self._terminate(pp)
            return
        assert pp.backend is not None
        self.listener.add(pp.backend)
        pp.in_rotation = True
        pp.started_at = time.monotonic()
        self.timeline.append((pp.started_at, len(self.serving())))
        self._changed.set()
        shown = pp.process_epoch or "counter ids"
        self.log(
            f"  pod {pp.pod} Running -> serving ({shown}) on {pp.backend.host}:"
            f"{pp.backend.port} after {pp.started_at - t0:.1f}s"
        )
        if pp.proc is not None:
            watched = [pp.proc, *pp.sidecar_procs]
            pp.watcher = asyncio.create_task(self._watch_exits(pp, watched))
        if pp.probed:  # only now: the pod turns Ready no earlier than its process serves
            prober = ReadinessProber(probe, lambda ready: self._report_ready(pp, container, ready))
            pp.prober = asyncio.create_task(self._probing(pp, prober), name=f"probe-{pp.pod}")

    async def _watch_exits(self, pp: PodProcess, procs: list[asyncio.subprocess.Process]) -> None:
        """A process that ends while its pod runs is an error the run must show (a kubelet
        would restart the container; the runner does not, it reports and takes it out)."""
        waits = [asyncio.ensure_future(p.wait()) for p in procs]
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        code = next(iter(done)).result()
        if pp.deleted:
            return
        pp.exited = True
        pp.error = f"pod {pp.pod}: the process exited with {code} while the pod was Running"
        self.errors.append(pp.error)
        self.log(f"  pod runner: {pp.error}")
        self._leave_rotation(pp)
        self.timeline.append((time.monotonic(), len(self.serving())))
        self._changed.set()

    async def _launch(self, pp: PodProcess, pod: Pod) -> None:
        container = (pod.get("spec") or {}).get("containers", [{}])[0]
        pod_env = await container_env(pod, container, self._secret, self._config_map)
        argv = container_argv(container, pod_env, self.executables)
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
        pp.env_epoch = pod_env.get("MCP_EPOCH", "")
        log = (self.workdir / f"{pp.pod}.log").open("ab")
        try:
            pp.proc = await asyncio.create_subprocess_exec(
                *argv,
                env={**inherited, **pod_env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
            pp.alive = pp.proc
        finally:
            log.close()
        assert pp.proc.stdout is not None
        line = await asyncio.wait_for(pp.proc.stdout.readline(), self.start_timeout)
        if not line:
            raise RuntimeError(f"the process exited at start; see {self.workdir / pp.pod}.log")
        info = json.loads(line)
        pp.process_epoch = str(info.get("epoch") or "")
        pp.backend = Backend(pp.pod, pp.ip, int(info["port"]))
        await _wait_serving(pp.backend, self.start_timeout)

    async def _launch_with_sidecars(
        self, pp: PodProcess, pod: Pod, sidecars: list[dict[str, Any]]
    ) -> None:
        """The kubelet's order: every native sidecar started, then the main container; the pod
        serves once its sidecar's readiness (``/readyz``, which also needs the server behind
        it) passes. The sidecar's ``/readyz`` names its process epoch."""
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
        log = (self.workdir / f"{pp.pod}.log").open("ab")
        try:
            for sidecar in sidecars:
                env = await container_env(pod, sidecar, self._secret, self._config_map)
                argv = in_pod_network(container_argv(sidecar, env, self.executables), pp.ip)
                pp.env_epoch = pp.env_epoch or env.get("MCP_EPOCH", "")
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    env={**inherited, **env},
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                )
                pp.sidecar_procs.append(proc)
                pp.alive = pp.sidecar_procs[0]  # the pod's IP is held until its last exit
            main = (pod.get("spec") or {}).get("containers", [{}])[0]
            env = await container_env(pod, main, self._secret, self._config_map)
            argv = in_pod_network(container_argv(main, env, self.executables), pp.ip)
            pp.proc = await asyncio.create_subprocess_exec(
                *argv,
                env={**inherited, **env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            log.close()
        port = int(sidecars[0]["ports"][0]["containerPort"])
        pp.backend = Backend(pp.pod, pp.ip, port)
        pp.process_epoch = await _ready_epoch(pp.backend, self.start_timeout)

    async def _prestop_get(self, pp: PodProcess, deadline: float) -> None:
        """The preStop ``httpGet`` hook: the request, waited for until it is answered or the
        grace period ends (a failed hook is logged, as the kubelet records an event)."""
        get = pp.prestop_get or {}
        host = str(get.get("host") or pp.ip)
        url = f"http://{host}:{get['port']}{get.get('path') or '/'}"
        headers = [(str(h["name"]), str(h["value"])) for h in get.get("httpHeaders") or []]
        try:
            async with httpx.AsyncClient(timeout=max(deadline - time.monotonic(), 0.1)) as http:
                answer = await http.get(url, headers=headers)
            if answer.status_code >= 400:
                self.log(f"  pod {pp.pod}: preStop hook answered {answer.status_code}")
        except httpx.HTTPError as exc:
            self.log(f"  pod {pp.pod}: preStop hook failed: {exc!r}")

    async def _terminate_with_sidecars(self, pp: PodProcess) -> None:
        """preStop of the main container to its end, SIGTERM to it and its exit, then SIGTERM
        to the sidecars in reverse order; SIGKILL past the grace period (see the module)."""
        began = time.monotonic()
        deadline = began + pp.grace
        main, pp.proc = pp.proc, None
        hooked = False
        if main is not None and main.returncode is None:
            if pp.prestop_get is not None:
                await self._prestop_get(pp, deadline)
                hooked = True
            elif pp.prestop:
                await asyncio.sleep(min(pp.prestop, pp.grace))
                hooked = True
            pp.hook_done_at = time.monotonic()
            pp.sigterm_sent.set()
            await _stop(main, max(deadline - time.monotonic(), 2.0 if hooked else 0.1))
        pp.main_exited_at = time.monotonic()
        for proc in reversed(pp.sidecar_procs):
            if proc.returncode is None:
                await _stop(proc, max(deadline - time.monotonic(), 2.0))
        pp.sidecars_exited_at = time.monotonic()
        self._leave_rotation(pp)
        if pp.sidecar_procs and pp.sidecar_procs[0].stdout is not None:
            out = await pp.sidecar_procs[0].stdout.read()
            pp.drain = drain_report(out.decode(errors="replace"))
        pp.alive = None
        await self._release(pp)
        self._changed.set()

    def _gone(self, pp: PodProcess) -> None:
        """The pod is being deleted: stop its process as a kubelet does. The balancer is not
        told here: the EndpointSlice controller decides that, concurrently."""
        if pp.deleted:
            return
        pp.deleted = True
        if pp.prober is not None:
            pp.prober.cancel()  # a terminating pod's endpoint is not ready whatever it answers
        self._changed.set()
        if pp.started_at is not None and pp.backend is not None and not pp.exited:
            pp.stopped_at = time.monotonic()
            self.timeline.append((pp.stopped_at, len(self.serving())))
            self.log(
                f"  pod {pp.pod} deleted -> preStop {pp.prestop:g}s, SIGTERM, grace {pp.grace:g}s"
            )
        if pp.task is not None and not pp.task.done():
            return  # _run sees ``deleted`` when the start finishes and stops the process
        self._stops.append(asyncio.create_task(self._terminate(pp)))

    def _leave_rotation(self, pp: PodProcess) -> None:
        if pp.in_rotation and pp.backend is not None:
            pp.in_rotation = False
            self.listener.remove(pp.backend.name)

    async def _terminate(self, pp: PodProcess) -> None:
        """preStop, SIGTERM, then SIGKILL when the grace period (counted from the deletion,
        preStop included, and at least 2 s after SIGTERM, as the kubelet grants) is over."""
        if pp.sidecar_procs:
            await self._terminate_with_sidecars(pp)
            return
        began = time.monotonic()
        if pp.proc is not None and pp.proc.returncode is None and pp.prestop:
            await asyncio.sleep(min(pp.prestop, pp.grace))  # the hook's own sleep action
        proc, pp.proc = pp.proc, None
        if proc is None:
            self._leave_rotation(pp)
            await self._release(pp)
            return
        if proc.returncode is None:
            left = max(pp.grace - (time.monotonic() - began), 2.0 if pp.prestop else 0.1)
            pp.sigterm_sent.set()
            await _stop(proc, left)
        self._leave_rotation(pp)  # a stopped process is unreachable, endpoints or not
        if proc.stdout is not None:  # what the process said on its way out (its drain)
            pp.drain = drain_report((await proc.stdout.read()).decode(errors="replace"))
        pp.alive = None
        await self._release(pp)
        self._changed.set()

    # --- readiness, for the pods whose prober the runner plays ---------------------------------

    async def _probing(self, pp: PodProcess, prober: ReadinessProber) -> None:
        try:
            await prober.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed status write: the run must show it
            pp.error = f"pod {pp.pod}: readiness not reported: {exc!r}"
            self.errors.append(pp.error)
            self.log(f"  pod runner: {pp.error}")

    async def _report_ready(
        self, pp: PodProcess, container: Mapping[str, Any], ready: bool
    ) -> bool:
        """Write the pod's readiness to its status (read, change, replace; again on a
        conflict). False when the pod is gone."""
        api = self._api
        assert api is not None
        while True:
            pod = await api.find(api.core.read_namespaced_pod, pp.pod, self.namespace)
            if pod is None or pod["metadata"]["uid"] != pp.uid:
                return False  # gone, or a new pod of the same name
            pod["status"] = with_readiness(
                pod.get("status") or {},
                str(container["name"]),
                ready,
                sidecars=pp.sidecars,
                probeless=(pp.main,) if pp.sidecars else (),
            )
            try:
                await api.json(api.core.replace_namespaced_pod_status, pp.pod, self.namespace, pod)
            except AsyncApiException as exc:
                if exc.status == 409:
                    continue  # changed meanwhile (kwok, the scheduler): read it again
                if exc.status == 404:
                    return False
                raise
            self.log(
                f"  pod {pp.pod} readiness probe {'passed' if ready else 'failed'} -> "
                f"{'Ready' if ready else 'not ready'}"
            )
            self._changed.set()
            return True

    # --- the pod object stays while its process runs, as a kubelet keeps it --------------------

    async def _hold(self, pp: PodProcess, pod: Pod) -> None:
        """Add the runner's finalizer: a deleted pod stays (Terminating) until its process has
        stopped, as with a kubelet, so the operator retires its epoch only then (kwok on its own
        deletes a pod the moment it is marked for deletion)."""
        finalizers = list((pod.get("metadata") or {}).get("finalizers") or [])
        if FINALIZER in finalizers:
            return
        await self._set_finalizers(pp.pod, [*finalizers, FINALIZER])
        pp.held = True

    async def _release(self, pp: PodProcess) -> None:
        """Drop the finalizer once the process is gone: the pod object may go now."""
        api = self._api
        if not pp.held or api is None:
            return
        pp.held = False
        with contextlib.suppress(*WATCH_ERRORS):
            pod = await api.find(api.core.read_namespaced_pod, pp.pod, self.namespace)
            if pod is None:
                return
            meta = pod["metadata"]
            left = [f for f in meta.get("finalizers") or [] if f != FINALIZER]
            await self._set_finalizers(pp.pod, left or None, meta["resourceVersion"])

    async def _set_finalizers(
        self, pod: str, finalizers: list[str] | None, version: str | None = None
    ) -> None:
        """A merge patch of the pod's finalizers (``version``: only if the pod is unchanged)."""
        assert self._api is not None
        meta: dict[str, Any] = {"finalizers": finalizers}
        if version is not None:
            meta["resourceVersion"] = version
        await self._api.json(
            self._api.core.patch_namespaced_pod,
            pod,
            self.namespace,
            {"metadata": meta},
            _content_type=MERGE,
        )

    async def _ip_free(self, pp: PodProcess) -> None:
        """kwok hands a freed pod IP to the next pod at once; a node would not while the old
        pod's sandbox still exists. Start the process once no other process holds the IP."""
        for other in list(self._pods.values()):
            proc = other.alive
            if other is not pp and other.ip == pp.ip and proc is not None:
                self.log(f"  pod {pp.pod}: IP {pp.ip} still held by {other.pod}; waiting")
                await proc.wait()

    # --- the Service's EndpointSlices: who is in the rotation ----------------------------------

    async def _follow_endpoints(self) -> None:
        api = self._api
        assert api is not None and self.service is not None
        slices = api.discovery.list_namespaced_endpoint_slice
        selector = f"kubernetes.io/service-name={self.service}"
        while True:
            try:
                body = await api.json(slices, self.namespace, label_selector=selector)
                self._slices = {}
                for item in body.get("items") or []:
                    self._slice(item, deleted=False)
                events = api.watch(
                    slices,
                    self.namespace,
                    label_selector=selector,
                    resource_version=body["metadata"]["resourceVersion"],
                    timeout_seconds=60,
                )
                async for kind, obj in events:
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._slice(obj, kind == "DELETED")
            except asyncio.CancelledError:
                raise
            except WATCH_ERRORS as exc:
                self.log(f"  pod runner: endpoint watch interrupted ({exc!r}); listing again")
                await asyncio.sleep(0.5)

    def _slice(self, obj: dict[str, Any], deleted: bool) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        ready: dict[str, bool] = {}
        if not deleted:
            for ep in obj.get("endpoints") or []:
                uid = (ep.get("targetRef") or {}).get("uid")
                if uid:
                    ready[str(uid)] = bool((ep.get("conditions") or {}).get("ready"))
        self._slices[name] = ready
        now_ready = {u for sl in self._slices.values() for u, r in sl.items() if r}
        for uid, pp in self._pods.items():
            if uid in now_ready:
                pp.endpoint_ready = True
            elif pp.endpoint_ready and pp.in_rotation:
                self._leave_rotation(pp)  # the controller took it out: so does the balancer
                self.log(f"  pod {pp.pod} endpoint not ready -> out of the balancer")
                self._changed.set()


async def _stop(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM, and SIGKILL once ``grace`` seconds have passed."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def _ready_epoch(backend: Backend, within: float) -> str:
    """Wait until ``/readyz`` answers 200; the process epoch it names."""
    url = f"http://{backend.host}:{backend.port}/readyz"
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=2.0) as http:
        while True:  # polling a condition the process reaches by itself
            with contextlib.suppress(httpx.HTTPError):
                answer = await http.get(url)
                if answer.status_code == 200:
                    return str(answer.json().get("epoch") or "")
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {backend.name}: the sidecar never became ready")
            await asyncio.sleep(0.05)
