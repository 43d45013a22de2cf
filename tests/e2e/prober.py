"""The kubelet's readiness prober, for pods whose container the pod runner runs.

kwok runs no probes, so a pod labelled for it (:data:`tests.cluster.kwok_stages.PROBER_LABEL`)
starts Running with its container not ready, and :class:`ReadinessProber` does what the
kubelet's prober would: it probes the container's ``readinessProbe`` at the pod's IP every
``periodSeconds`` (after ``initialDelaySeconds``), turns the pod Ready after
``successThreshold`` passes in a row and not ready after ``failureThreshold`` failures in a
row, and writes that to the pod's status (``Ready``, ``ContainersReady``, the container's
``ready``), where the EndpointSlice and Deployment controllers read it. A container without a
readiness probe is ready once it has started, as with a kubelet.

Supported probes: ``httpGet`` (HTTP, any 2xx/3xx passes) and ``tcpSocket``; an ``exec`` or
``grpc`` probe is refused up front (:class:`ProbeError`), never treated as passing.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from tests.cluster.kwok_stages import PROBER_LABEL, PROBER_VALUE

Pod = dict[str, Any]
#: Writes the pod's readiness (the runner owns the API client); returns False once the pod
#: is gone.
Report = Callable[[bool], Awaitable[bool]]


class ProbeError(ValueError):
    """A readiness probe the prober cannot run."""


@dataclass(frozen=True)
class Probe:
    """One container's readiness probe, resolved against its pod: where and how often."""

    host: str
    port: int
    path: str | None  # None: a TCP probe
    headers: tuple[tuple[str, str], ...] = ()
    initial_delay: float = 0.0
    period: float = 10.0
    timeout: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3


def probed_by_runner(pod: Pod) -> bool:
    """Whether this pod's readiness is the runner's to report (kwok left it not ready)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(PROBER_LABEL) == PROBER_VALUE


def _port(value: Any, container: Mapping[str, Any]) -> int:
    if isinstance(value, int):
        return value
    for p in container.get("ports") or []:
        if p.get("name") == value:
            return int(p["containerPort"])
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise ProbeError(f"probe port {value!r} is not a port of container {container.get('name')}")


def probe_of(container: Mapping[str, Any], pod_ip: str) -> Probe | None:
    """The container's readiness probe with the kubelet's defaults (None: it has none)."""
    spec = container.get("readinessProbe")
    if not spec:
        return None
    timing = {
        "initial_delay": float(spec.get("initialDelaySeconds", 0)),
        "period": float(spec.get("periodSeconds", 10)),
        "timeout": float(spec.get("timeoutSeconds", 1)),
        "success_threshold": int(spec.get("successThreshold", 1)),
        "failure_threshold": int(spec.get("failureThreshold", 3)),
    }
    if "httpGet" in spec:
        get = spec["httpGet"]
        if str(get.get("scheme", "HTTP")).upper() != "HTTP":
            raise ProbeError(f"httpGet scheme {get.get('scheme')!r} is not supported")
        headers = tuple((str(h["name"]), str(h["value"])) for h in get.get("httpHeaders") or [])
        return Probe(
            str(get.get("host") or pod_ip),
            _port(get["port"], container),
            str(get.get("path") or "/"),
            headers,
            **timing,
        )
    if "tcpSocket" in spec:
        tcp = spec["tcpSocket"]
        return Probe(str(tcp.get("host") or pod_ip), _port(tcp["port"], container), None, **timing)
    raise ProbeError(f"readiness probe {sorted(spec)} is not supported (httpGet, tcpSocket)")


async def probe_once(probe: Probe) -> bool:
    """One probe, as the kubelet counts it: an answer 200-399 within the timeout, or a TCP
    connection that opens."""
    try:
        if probe.path is None:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(probe.host, probe.port), probe.timeout
            )
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        async with httpx.AsyncClient(timeout=probe.timeout) as client:
            url = f"http://{probe.host}:{probe.port}{probe.path}"
            resp = await client.get(url, headers=list(probe.headers))
        return 200 <= resp.status_code < 400
    except (OSError, TimeoutError, httpx.HTTPError):
        return False


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_readiness(
    status: Mapping[str, Any],
    container: str,
    ready: bool,
    *,
    sidecars: Sequence[str] = (),
    probeless: Sequence[str] = (),
) -> dict[str, Any]:
    """``status`` with ``container`` ready or not, and the pod's ``ContainersReady`` and
    ``Ready`` following from all its containers (a transition time only where one changes).

    ``sidecars``: the pod's native sidecars (init containers with ``restartPolicy: Always``),
    whose status the kubelet keeps in ``initContainerStatuses`` and counts for the pod's
    readiness (kwok writes none: it is added, started). ``probeless``: containers without a
    readiness probe, which the kubelet counts ready once started."""
    out = dict(status)
    statuses = [dict(c) for c in status.get("containerStatuses") or []]
    for c in statuses:
        if c.get("name") == container:
            c["ready"] = ready
        elif c.get("name") in probeless:
            c["ready"] = True
    out["containerStatuses"] = statuses
    inits = [dict(c) for c in status.get("initContainerStatuses") or []]
    for name in sidecars:
        if not any(c.get("name") == name for c in inits):
            running = {"running": {"startedAt": _now()}}
            inits.append({"name": name, "ready": False, "started": True, "state": running})
    for c in inits:
        if c.get("name") == container:
            c["ready"] = ready
    if inits:
        out["initContainerStatuses"] = inits
    every = (
        bool(statuses)
        and all(c.get("ready") for c in statuses)
        and all(c.get("ready") for c in inits if c.get("name") in sidecars)
    )
    value = "True" if every else "False"
    conditions = [dict(c) for c in status.get("conditions") or []]
    for kind in ("ContainersReady", "Ready"):
        cond = next((c for c in conditions if c.get("type") == kind), None)
        if cond is None:
            cond = {"type": kind}
            conditions.append(cond)
        if cond.get("status") != value:
            cond["status"] = value
            cond["lastTransitionTime"] = _now()
        if every:
            cond.pop("reason", None)
            cond.pop("message", None)
        else:
            cond["reason"] = "ContainersNotReady"
    out["conditions"] = conditions
    return out


class ReadinessProber:
    """Probes one container for as long as its pod runs and reports every change of its
    readiness. It starts not ready, as kwok's stage left the pod."""

    def __init__(self, probe: Probe | None, report: Report) -> None:
        self.probe = probe
        self.report = report
        self.ready = False

    async def run(self) -> None:
        probe = self.probe
        if probe is None:  # no probe: ready once started, as a kubelet has it
            self.ready = await self.report(True)
            return
        await asyncio.sleep(probe.initial_delay)
        streak = 0  # probes in a row that disagree with the reported readiness
        while True:
            passed = await probe_once(probe)
            streak = 0 if passed == self.ready else streak + 1
            if streak >= (probe.success_threshold if passed else probe.failure_threshold):
                if not await self.report(passed):
                    return  # the pod is gone
                self.ready, streak = passed, 0
            await asyncio.sleep(probe.period)  # the prober's own schedule
