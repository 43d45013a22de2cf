"""A node whose pods really run: kwok keeps it Ready and reports its pods, this runs them.

:class:`ImageNode` registers a kwok-managed Node with a pod range of its own and a taint
(only pods that tolerate it land there), then follows the API server in a thread:

- every pod bound to the node that kwok has given an IP gets its containers started from
  the loaded image (:mod:`tests.image.kubelet`), with the volumes, environment (Service
  links included) and security context the API server holds for it, and the service
  account token the API server issues for that very pod (a bound TokenRequest);
- a pod that is deleted has its containers stopped: SIGTERM, SIGKILL at its grace period;
- every Service's ClusterIP is routed to its ready endpoints on this node, and
  ``kubernetes.default`` to the API server (:mod:`tests.image.netns`): kube-proxy's part.

A pod whose image is not the loaded one, or whose containers cannot be configured, is
recorded in :attr:`ImageNode.errors` (a kubelet would report ``ErrImageNeverPull`` or
``CreateContainerConfigError``), never silently skipped.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tests.cluster.harness import FAKE_NODE_ANNOTATION, SERVICE_IP, Cluster
from tests.cluster.kube import ApiException, Kube
from tests.e2e.podrunner import PodEnvError, container_env
from tests.image.kubelet import Pod, VolumeSources, decoded, prepare_volumes, run_args
from tests.image.netns import NodeNetwork, ServiceRule
from tests.image.runtime import ImageRuntime

TAINT_KEY = "mcp-epoch.test/image-node"


@dataclass
class RunningPod:
    uid: str
    name: str
    namespace: str
    containers: list[str]
    grace: float


def service_links(services: list[dict[str, Any]]) -> dict[str, str]:
    """The variables a kubelet sets for each Service of the pod's namespace
    (``enableServiceLinks``), e.g. ``MY_SVC_SERVICE_HOST`` and ``MY_SVC_PORT``."""
    env: dict[str, str] = {}
    for svc in services:
        ip = svc["spec"].get("clusterIP")
        if not ip or ip == "None":
            continue
        prefix = svc["metadata"]["name"].upper().replace("-", "_")
        ports = svc["spec"].get("ports") or []
        if not ports:
            continue
        env[f"{prefix}_SERVICE_HOST"] = ip
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        env[f"{prefix}_PORT"] = f"tcp://{ip}:{ports[0]['port']}"
        for port in ports:
            proto, number = str(port.get("protocol", "TCP")), int(port["port"])
            if port.get("name"):
                env[f"{prefix}_SERVICE_PORT_{port['name'].upper().replace('-', '_')}"] = str(number)
            base = f"{prefix}_PORT_{number}_{proto}"
            env[base] = f"{proto.lower()}://{ip}:{number}"
            env[f"{base}_PROTO"], env[f"{base}_PORT"] = proto.lower(), str(number)
            env[f"{base}_ADDR"] = ip
    return env


def service_hosts(services: list[dict[str, Any]], namespace: str) -> dict[str, str]:
    """Cluster DNS names of every Service -> its ClusterIP (written to ``/etc/hosts``)."""
    hosts: dict[str, str] = {}
    for svc in services:
        ip = svc["spec"].get("clusterIP")
        if not ip or ip == "None":
            continue
        name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
        for host in (f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"):
            hosts[host] = ip
        if ns == namespace:
            hosts[name] = ip
    return hosts


def service_rules(
    services: list[dict[str, Any]], slices: list[dict[str, Any]], node: NodeNetwork
) -> list[ServiceRule]:
    """ClusterIP ports -> the first ready endpoint on this node (one is all the tests need)."""
    by_service: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for sl in slices:
        owner = (sl["metadata"].get("labels") or {}).get("kubernetes.io/service-name")
        if owner:
            by_service.setdefault((sl["metadata"]["namespace"], owner), []).append(sl)
    rules = []
    for svc in services:
        ip = svc["spec"].get("clusterIP")
        if not ip or ip == "None":
            continue
        key = (svc["metadata"]["namespace"], svc["metadata"]["name"])
        for port in svc["spec"].get("ports") or []:
            target = _ready_endpoint(by_service.get(key, []), port.get("name") or "", node)
            if target:
                rules.append(ServiceRule(ip, int(port["port"]), *target))
    return rules


def _ready_endpoint(
    slices: list[dict[str, Any]], port_name: str, node: NodeNetwork
) -> tuple[str, int] | None:
    for sl in slices:
        number = next(
            (int(p["port"]) for p in sl.get("ports") or [] if (p.get("name") or "") == port_name),
            None,
        )
        for endpoint in sl.get("endpoints") or []:
            if number is None or not (endpoint.get("conditions") or {}).get("ready"):
                continue
            for address in endpoint.get("addresses") or []:
                if node.owns(address):
                    return address, number
    return None


@dataclass
class ImageNode:
    cluster: Cluster
    image: ImageRuntime
    net: NodeNetwork
    name: str = "image-node"
    claims: Path = field(default_factory=Path)
    errors: list[str] = field(default_factory=list)
    running: dict[str, RunningPod] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None
    _api_rule: ServiceRule | None = None

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> ImageNode:
        self.claims = self.image.pods / "claims"
        self.claims.mkdir(exist_ok=True)
        server = urlparse(self.cluster.server)
        self._api_rule = self.net.relay_to_host((server.hostname or "", server.port or 443))
        capacity = {"cpu": "8", "memory": "16Gi", "pods": "20"}
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                "labels": {
                    "kubernetes.io/hostname": self.name,
                    "kubernetes.io/os": "linux",
                    TAINT_KEY: "true",
                },
            },
            "spec": {
                "podCIDR": str(self.net.pod_addresses),
                "taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}],
            },
            "status": {"allocatable": capacity, "capacity": capacity},
        }
        with self.cluster.api() as api:
            api.find(api.core.delete_node, self.name)
            api.json(api.core.create_node, node)
        self._thread = threading.Thread(target=self._loop, name="image-node", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        for uid in list(self.running):
            self._stop_pod(uid)
        with self.cluster.api() as api:
            api.find(api.core.delete_node, self.name)

    def wait(self, check: Any, within: float, what: str) -> Any:
        """Until ``check()`` is truthy, re-checked after every pass of the node loop (an
        exception counts as "not yet" and is reported if time runs out)."""
        deadline = time.monotonic() + within
        last: Any = None
        with self._changed:
            while True:
                try:
                    if result := check():
                        return result
                except Exception as exc:
                    last = exc
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out after {within:.0f}s waiting for {what}; last: {last!r}; "
                        f"node errors: {self.errors[-3:]}"
                    )
                self._changed.wait(min(left, 1.0))

    # ---------------------------------------------------------------- the loop

    def _loop(self) -> None:
        with self.cluster.api() as api:
            while not self._stop.is_set():
                try:
                    self._pass(api)
                except Exception as exc:
                    self.errors.append(f"node loop: {exc!r}")
                with self._changed:
                    self._changed.notify_all()
                self._stop.wait(0.5)

    def _pass(self, api: Kube) -> None:
        listed = api.json(
            api.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={self.name}"
        )
        pods = {p["metadata"]["uid"]: p for p in listed["items"]}
        services = api.json(api.core.list_service_for_all_namespaces)["items"]
        slices = api.json(api.discovery.list_endpoint_slice_for_all_namespaces)["items"]
        # Routes first: a container may call a Service (the API server) the moment it starts.
        rules = service_rules(services, slices, self.net)
        if self._api_rule is not None:
            rules.append(
                ServiceRule(SERVICE_IP, 443, self._api_rule.target_ip, self._api_rule.target_port)
            )
        self.net.set_services(rules)
        for uid in list(self.running):
            pod = pods.get(uid)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                self._stop_pod(uid)
            else:
                self._check_alive(self.running[uid])
        for uid, pod in pods.items():
            if uid in self.running or pod["metadata"].get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("podIP"):
                self._start_pod(api, pod, services)

    def _check_alive(self, pod: RunningPod) -> None:
        """A container that exits while its pod stays is a crash (restarts are not emulated:
        the test fails on it, with the container's output)."""
        for cname in list(pod.containers):
            container = self.image.containers.get(cname)
            if container is not None and container.proc.poll() is not None:
                self.errors.append(
                    f"{pod.namespace}/{pod.name}: container {cname} exited "
                    f"{container.proc.returncode}:\n{container.output()[-2000:]}"
                )
                pod.containers.remove(cname)

    def _start_pod(self, api: Kube, pod: Pod, services: list[dict[str, Any]]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        started: list[str] = []
        self.running[uid] = RunningPod(
            uid, name, ns, started, float(spec.get("terminationGracePeriodSeconds", 30))
        )
        try:
            sources = self._sources(api, pod)
            volumes = prepare_volumes(pod, self.image.pods / uid, sources)
            netns = self.net.attach(uid, pod["status"]["podIP"])
            own = [s for s in services if s["metadata"]["namespace"] == ns]
            for index, container in enumerate(spec["containers"]):
                if container["image"] != self.image.image:
                    raise PodEnvError(
                        f"ErrImageNeverPull: {container['image']} (loaded: {self.image.image})"
                    )
                env = service_links(own) if spec.get("enableServiceLinks", True) else {}
                env.update(KUBERNETES_SERVICE_HOST=SERVICE_IP, KUBERNETES_SERVICE_PORT="443")
                env.update(asyncio.run(container_env(pod, container, *self._lookups(api, ns))))
                cname = f"{name}-{index}"[:60]
                args = run_args(
                    name=cname,
                    image=self.image.image,
                    pod_spec=spec,
                    container=container,
                    env=env,
                    volumes={k: self.image.inside(v) for k, v in volumes.items()},
                    netns=netns,
                    hosts=service_hosts(services, ns),
                )
                self.image.start(args)
                started.append(cname)
        except (PodEnvError, OSError) as exc:
            self.errors.append(f"{ns}/{name}: {exc}")

    def _stop_pod(self, uid: str) -> None:
        pod = self.running.pop(uid)
        for cname in pod.containers:
            self.image.stop(cname, grace=pod.grace)
        self.net.detach(uid)

    # ---------------------------------------------------------------- what the API holds

    def _sources(self, api: Kube, pod: Pod) -> VolumeSources:
        meta = pod["metadata"]
        ns = meta["namespace"]

        def secret(name: str) -> dict[str, bytes] | None:
            body = api.find(api.core.read_namespaced_secret, name, ns)
            return None if body is None else decoded_secret(body)

        def config_map(name: str) -> dict[str, bytes] | None:
            body = api.find(api.core.read_namespaced_config_map, name, ns)
            return None if body is None else decoded(body.get("data"), body.get("binaryData"))

        def token(account: str, audience: str | None, seconds: int) -> str:
            audiences = [audience] if audience else None
            try:
                return api.mint_token(ns, account, audiences, pod=pod, seconds=seconds)
            except ApiException as exc:
                raise PodEnvError(
                    f"TokenRequest for {ns}/{account} refused: {str(exc.body)[:200]}"
                ) from exc

        def claim(name: str) -> Path:
            return self.claims / f"{ns}-{name}"

        return VolumeSources(secret=secret, config_map=config_map, token=token, claim=claim)

    def _lookups(self, api: Kube, ns: str) -> tuple[Any, Any]:
        async def secret(name: str) -> dict[str, str] | None:
            body = api.find(api.core.read_namespaced_secret, name, ns)
            if body is None:
                return None
            return {k: v.decode() for k, v in decoded_secret(body).items()}

        async def config_map(name: str) -> dict[str, str] | None:
            body = api.find(api.core.read_namespaced_config_map, name, ns)
            return None if body is None else dict(body.get("data") or {})

        return secret, config_map

    def pod_output(self, name_prefix: str) -> str:
        return "\n".join(
            f"--- {c.name}\n{c.output()[-4000:]}"
            for c in self.image.containers.values()
            if c.name.startswith(name_prefix)
        )


def decoded_secret(secret: Mapping[str, Any]) -> dict[str, bytes]:
    return decoded(None, secret.get("data"))
