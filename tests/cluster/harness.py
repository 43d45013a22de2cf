"""A real Kubernetes control plane as local processes on 127.0.0.1.

``Cluster`` generates a throw-away PKI, picks free ports, and starts
etcd -> kube-apiserver -> kube-controller-manager -> kube-scheduler -> kwok,
waiting for each to report healthy before starting the next, then registers
a few kwok-managed fake nodes.  Every process runs in its own process group
and is stopped by the process IDs recorded at start, never by name, so two
clusters (or a cluster and anything else) coexist on one machine.

There is no kubelet: kwok plays every node, making nodes Ready and pods
Running/Ready and finishing deletions, while everything above the node
(API validation, admission webhooks, RBAC, controllers, scheduling) is the
real upstream code. A pod whose process a pod runner really runs can leave
its readiness to that runner (:mod:`tests.cluster.kwok_stages`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.cluster import build, certs, kwok_stages
from tests.cluster.kube import Kube, status_of

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
#: Pod addresses kwok hands out, from the benchmarking range (RFC 2544; EndpointSlices refuse
#: loopback addresses). :func:`pod_addresses_local` makes the range local to this machine, so a
#: pod runner's process binds its pod's IP and other processes reach it there, as in a cluster.
POD_CIDR = "198.18.0.0/16"


def pod_addresses_local() -> str | None:
    """Route :data:`POD_CIDR` to the loopback device (``ip route replace local``, idempotent and
    harmless: nothing else uses the range). None when done; otherwise why it could not be
    (not root, no ``ip``): pods then get addresses that nothing serves on."""
    probe = POD_CIDR.split("/", 1)[0].rsplit(".", 1)[0] + ".1"
    with contextlib.suppress(OSError), socket.socket() as sock:
        sock.bind((probe, 0))
        return None  # already local
    try:
        done = subprocess.run(
            ["ip", "route", "replace", "local", POD_CIDR, "dev", "lo"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except OSError as exc:
        return f"cannot run ip: {exc}"
    return None if done.returncode == 0 else f"ip route failed: {done.stderr.strip()}"


FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
COMPONENT_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


class ClusterError(RuntimeError):
    """The control plane failed to start; the message includes log tails."""


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int) -> str:
    """Last ``lines`` lines of a text file (empty if it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 256 * 1024))
            data = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    # kwok and etcd log long JSON lines; clip them so a failure report stays readable.
    return "\n".join(line[:400] for line in data.splitlines()[-lines:])


def wait_until(
    check: Callable[[], bool], timeout: float, what: str, interval: float = 0.25
) -> None:
    """Poll ``check`` until it returns True; raise TimeoutError naming ``what``."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except ClusterError:
            raise
        except Exception as exc:  # any failure just means "not yet"
            last_exc = exc
        time.sleep(interval)
    detail = f" (last error: {last_exc})" if last_exc else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_runs(pid: int, binary: str) -> bool:
    """True if ``pid`` is alive and still runs ``binary`` (guards PID reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return cmdline == binary


def _set_parent_death_signal() -> None:
    """In the child: get SIGTERM if the test runner dies, so nothing leaks."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


# --------------------------------------------------------------------------- cluster


@dataclass
class Ports:
    """Every port the control plane listens on (all on 127.0.0.1)."""

    etcd_client: int = 0
    etcd_peer: int = 0
    apiserver: int = 0
    controller_manager: int = 0
    scheduler: int = 0
    kwok: int = 0

    @classmethod
    def pick(cls) -> Ports:
        """Choose distinct free ports, so several clusters can run at once."""
        chosen: set[int] = set()
        values = {}
        for name in cls.__dataclass_fields__:
            port = free_port()
            while port in chosen:
                port = free_port()
            chosen.add(port)
            values[name] = port
        return cls(**values)


@dataclass
class ProcessRecord:
    """What is needed to find and stop a started component later."""

    name: str
    pid: int
    binary: str
    log: str


@dataclass(repr=False)
class Cluster:
    """A loopback Kubernetes control plane; use ``with Cluster() as c:``.

    ``run_dir`` holds the PKI, kubeconfig, etcd data, logs and state file;
    by default a fresh temporary folder that ``stop()`` removes unless
    ``keep_run_dir`` is set.  ``die_with_parent`` ties the processes to the
    creating process (right for tests, wrong for ``up``).
    """

    run_dir: Path | None = None
    nodes: int = 3
    keep_run_dir: bool = False
    die_with_parent: bool = True
    log: Callable[[str], None] = print
    ports: Ports = field(default_factory=Ports)
    processes: list[ProcessRecord] = field(default_factory=list)
    _owns_run_dir: bool = False
    _binaries: dict[str, Path] = field(default_factory=dict)

    def __repr__(self) -> str:
        """Short form: tracebacks print the fixture value."""
        return f"Cluster(server={self.server!r}, run_dir={str(self.run_dir)!r})"

    # ---------------------------------------------------------------- paths

    def _path(self, *parts: str) -> Path:
        if self.run_dir is None:
            raise ClusterError("cluster has no run directory yet; call start()")
        return self.run_dir.joinpath(*parts)

    @property
    def pki(self) -> certs.Pki:
        """Certificates and keys of this cluster."""
        return certs.Pki(self._path("pki"))

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (``system:masters``)."""
        return self._path("kubeconfig")

    @property
    def ca_cert(self) -> Path:
        """CA certificate: trust it for the API server and the webhook cert."""
        return self.pki.ca_cert

    @property
    def webhook_cert(self) -> Path:
        """Serving certificate for webhooks on 127.0.0.1, signed by the CA."""
        return self.pki.webhook_cert

    @property
    def webhook_key(self) -> Path:
        """Key of ``webhook_cert``."""
        return self.pki.webhook_key

    @property
    def server(self) -> str:
        """API server URL."""
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def state_file(self) -> Path:
        """JSON record of PIDs and ports, read by ``python -m tests.cluster down``."""
        return self._path("state.json")

    def log_path(self, name: str) -> Path:
        """Log file of one component."""
        return self._path("logs", f"{name}.log")

    def binary(self, name: str) -> Path:
        """Path of a built binary (kubectl, helm, ...)."""
        return self._binaries.get(name) or build.binary_path(name)

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> Cluster:
        """Build what is missing, then bring the control plane up.

        On any failure everything already started is stopped and a
        ClusterError carrying the component log tails is raised.
        """
        self._binaries = build.ensure_built(log=self.log)
        if self.run_dir is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix="mcp-epoch-cluster-"))
            self._owns_run_dir = True
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._path("logs").mkdir(exist_ok=True)
        self.ports = Ports.pick()
        certs.generate(self._path("pki"), SERVICE_IP)
        self._write_kubeconfig()
        steps: Sequence[tuple[str, Callable[[], None]]] = (
            ("etcd", self._start_etcd),
            ("kube-apiserver", self._start_apiserver),
            ("kube-controller-manager", self._start_controller_manager),
            ("kube-scheduler", self._start_scheduler),
            ("kwok", self._start_kwok),
            ("nodes", self._create_nodes),
        )
        try:
            for name, step in steps:
                began = time.monotonic()
                step()
                self.log(f"[cluster] {name} ready in {time.monotonic() - began:.1f}s")
        except BaseException as exc:
            details = self.logs_tail(lines=25)
            self.stop(remove=False)
            if isinstance(exc, Exception):
                raise ClusterError(f"control plane failed to start: {exc}\n{details}") from exc
            raise
        self._write_state()
        return self

    def stop(self, remove: bool | None = None) -> None:
        """Stop every started process (reverse order) by its recorded PID."""
        for record in reversed(self.processes):
            stop_process(record)
        self.processes.clear()
        if remove is None:
            remove = self._owns_run_dir and not self.keep_run_dir
        if remove and self.run_dir is not None:
            import shutil

            shutil.rmtree(self.run_dir, ignore_errors=True)

    # ---------------------------------------------------------------- process plumbing

    def _spawn(self, name: str, binary: str, args: Sequence[str]) -> ProcessRecord:
        """Start one component in its own process group, logging to a file."""
        path = str(self.binary(binary))
        log = self.log_path(name)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [path, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.run_dir,
                start_new_session=True,
                preexec_fn=_set_parent_death_signal if self.die_with_parent else None,
            )
        record = ProcessRecord(name=name, pid=proc.pid, binary=path, log=str(log))
        self.processes.append(record)
        self._write_state()
        return record

    def _wait_healthy(
        self, record: ProcessRecord, url: str, timeout: float = 90, client_cert: bool = False
    ) -> None:
        """Wait for a health URL to answer 200, failing fast if the process died."""

        def check() -> bool:
            if not _pid_alive(record.pid) or _is_zombie(record.pid):
                raise ClusterError(f"{record.name} exited during start-up")
            return _http_ok(url, self.pki if client_cert else None)

        try:
            wait_until(check, timeout, f"{record.name} at {url}")
        except TimeoutError as exc:
            raise ClusterError(str(exc)) from exc

    # ---------------------------------------------------------------- components

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer = f"http://127.0.0.1:{self.ports.etcd_peer}"
        record = self._spawn(
            "etcd",
            "etcd",
            [
                "--name=default",
                f"--data-dir={self._path('etcd')}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--initial-cluster-state=new",
                # Test data is disposable: skipping fsync makes etcd fast on slow disks.
                "--unsafe-no-fsync",
                "--auto-compaction-retention=1",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        self._wait_healthy(record, f"{client}/health")

    def _start_apiserver(self) -> None:
        pki = self.pki
        record = self._spawn(
            "kube-apiserver",
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # Recent API servers refuse a loopback address for the
                # `kubernetes` Service endpoints; nothing in-cluster needs them.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.ports.apiserver}",
                f"--tls-cert-file={pki.apiserver_cert}",
                f"--tls-private-key-file={pki.apiserver_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--requestheader-client-ca-file={pki.ca_cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.path('front-proxy-client.crt')}",
                f"--proxy-client-key-file={pki.path('front-proxy-client.key')}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,"
                "MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                # Service-referenced webhooks are called at a ready endpoint's pod IP, as with
                # kube-proxy on the node; there is no kube-proxy here (tests/image/netns.py).
                "--enable-aggregator-routing=true",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait_healthy(record, f"{self.server}/readyz", timeout=120, client_cert=True)

    def _component_kubeconfig_args(self) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            f"--cert-dir={self._path('pki', 'generated')}",
        ]

    def _start_controller_manager(self) -> None:
        pki = self.pki
        record = self._spawn(
            "kube-controller-manager",
            "kube-controller-manager",
            [
                *self._component_kubeconfig_args(),
                f"--secure-port={self.ports.controller_manager}",
                "--controllers=*",
                f"--service-account-private-key-file={pki.sa_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--cluster-signing-cert-file={pki.ca_cert}",
                f"--cluster-signing-key-file={pki.ca_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--use-service-account-credentials=true",
                "--v=1",
            ],
        )
        self._wait_healthy(record, f"https://127.0.0.1:{self.ports.controller_manager}/healthz")
        # Pods are refused by the ServiceAccount admission plugin until the
        # controller-manager has created the namespace's default account.
        with self.api() as api:
            account = api.core.read_namespaced_service_account
            wait_until(
                lambda: status_of(lambda: account("default", "default")) == 200,
                60,
                "the default ServiceAccount",
            )

    def _start_scheduler(self) -> None:
        record = self._spawn(
            "kube-scheduler",
            "kube-scheduler",
            [*self._component_kubeconfig_args(), f"--secure-port={self.ports.scheduler}", "--v=1"],
        )
        self._wait_healthy(record, f"https://127.0.0.1:{self.ports.scheduler}/healthz")

    def _start_kwok(self) -> None:
        stages = self.run_dir / "kwok-stages.yaml"
        stages.write_text(
            kwok_stages.compose(build.kwok_stages_path().read_text(encoding="utf-8")),
            encoding="utf-8",
        )
        record = self._spawn(
            "kwok",
            "kwok",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{self.ports.kwok}",
                "--node-ip=127.0.0.1",
                f"--cidr={POD_CIDR}",
                "--node-lease-duration-seconds=40",
            ],
        )
        self._wait_healthy(record, f"http://127.0.0.1:{self.ports.kwok}/healthz")

    def _create_nodes(self) -> None:
        with self.api() as api:
            for index in range(self.nodes):
                api.json(api.core.create_node, fake_node(f"kwok-node-{index}"))
            wait_until(lambda: self._nodes_ready(api), 60, f"{self.nodes} Ready nodes")

    def _nodes_ready(self, api: Kube) -> bool:
        nodes = api.json(api.core.list_node, label_selector="type=kwok")["items"]
        ready = [n for n in nodes if _condition(n, "Ready") == "True"]
        return len(ready) >= self.nodes

    # ---------------------------------------------------------------- files

    def _write_kubeconfig(self) -> None:
        pki = self.pki
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "mcp-epoch",
                    "cluster": {"server": self.server, "certificate-authority": str(pki.ca_cert)},
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(pki.admin_cert),
                        "client-key": str(pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {"name": "mcp-epoch", "context": {"cluster": "mcp-epoch", "user": "admin"}}
            ],
            "current-context": "mcp-epoch",
        }
        # JSON is valid YAML, and every kubeconfig reader accepts it.
        self.kubeconfig.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        self.kubeconfig.chmod(0o600)

    def _write_state(self) -> None:
        state = {
            "run_dir": str(self.run_dir),
            "kubeconfig": str(self.kubeconfig),
            "server": self.server,
            "ports": asdict(self.ports),
            "processes": [asdict(p) for p in self.processes],
        }
        self.state_file.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")

    # ---------------------------------------------------------------- clients & logs

    def api(self) -> Kube:
        """The official client as the admin, from this cluster's kubeconfig (close it)."""
        return Kube(self.kubeconfig)

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster.

        With ``check`` a non-zero exit raises RuntimeError carrying stderr,
        which is what a failing test wants to show.
        """
        proc = subprocess.run(
            [str(self.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}"
            )
        return proc

    def kubectl_json(self, *args: str) -> Any:
        """``kubectl ... -o json`` decoded."""
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def logs_tail(self, names: Sequence[str] | None = None, lines: int = 40) -> str:
        """Tail of each component's log, headed by the component name."""
        if self.run_dir is None:
            return ""
        chunks = []
        for name in names or COMPONENT_ORDER:
            text = tail(self.log_path(name), lines)
            if text:
                chunks.append(f"----- {name} ({self.log_path(name)}) -----\n{text}")
        return "\n".join(chunks)


# --------------------------------------------------------------------------- free functions


def fake_node(name: str) -> dict[str, Any]:
    """A Node object that kwok will adopt and keep Ready.

    The capacity is generous so scheduling is never the bottleneck in tests.
    """
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "status": {"allocatable": capacity, "capacity": capacity},
    }


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _http_ok(url: str, pki: certs.Pki | None) -> bool:
    """True if ``url`` answers 200 (TLS verified against the CA when given)."""
    if url.startswith("https"):
        if pki is not None:
            ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
            ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        else:
            # controller-manager and scheduler serve a self-signed certificate.
            ctx = ssl._create_unverified_context()
    else:
        ctx = None
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            return bool(resp.status == 200)
    except OSError:  # URLError and HTTPError are OSErrors: "not healthy yet"
        return False


def stop_process(record: ProcessRecord, grace: float = 10) -> None:
    """SIGTERM the component's process group, then SIGKILL after ``grace``.

    The group is only signalled while its leader still runs the binary we
    started, so a recycled PID is never hit.  Returns once the process is
    really gone (reaped), not merely exiting, so its ports are free again.
    """
    if not _pid_runs(record.pid, record.binary):
        _wait_gone(record.pid, 1)
        return
    _signal_group(record.pid, signal.SIGTERM)
    if _wait_gone(record.pid, grace):
        return
    _signal_group(record.pid, signal.SIGKILL)
    _wait_gone(record.pid, 10)


def _wait_gone(pid: int, timeout: float) -> bool:
    """Reap ``pid`` if it is our child and wait until it has disappeared.

    A Go process whose main thread exited shows as a zombie until all its
    threads are done; only a successful reap (or, for someone else's child,
    the zombie state) means it is over.
    """
    deadline = time.monotonic() + timeout
    while True:
        _reap(pid)
        if not Path(f"/proc/{pid}").exists():
            return True
        if _is_zombie(pid) and _parent(pid) != os.getpid():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _parent(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("PPid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (no zombies)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop_from_state(state_file: Path) -> list[str]:
    """Stop the processes listed in a state file; returns their names."""
    state = json.loads(state_file.read_text(encoding="utf-8"))
    records = [ProcessRecord(**p) for p in state.get("processes", [])]
    for record in reversed(records):
        stop_process(record)
    return [r.name for r in records]


def running_from_state(state_file: Path) -> Iterator[ProcessRecord]:
    """Records of a state file whose process is still running."""
    state = json.loads(state_file.read_text(encoding="utf-8"))
    for entry in state.get("processes", []):
        record = ProcessRecord(**entry)
        if _pid_runs(record.pid, record.binary):
            yield record
