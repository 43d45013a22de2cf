"""``make image-smoke``: the image runs under the exact container spec the chart renders.

The epoch service's pod spec comes from ``helm template`` with the chart's defaults (UID and
group 10001, ``fsGroup``, read-only root filesystem, every capability dropped, no privilege
escalation, the seccomp default, ``/tmp`` as an ``emptyDir``, the ledger on a claim). It runs
with runc in a pod network namespace. The ServiceAccount admission plugin's token volume is
added as the API server would add it; no API server runs in this test, so the token and CA
in it are placeholders, which ``serve`` only needs to exist at start (it asks the API server
when a request comes).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp_epoch_operator.resources import ReplicaDefaults
from mcp_epoch_operator.webhook import injected

from mcp_epoch.contract import (
    DATA_PLANE_ANNOTATION,
    DRAIN_PATH,
    DRAIN_TOKEN_HEADER,
    ENV_DRAIN_TOKEN,
    SERVED_BY_HEADER,
    UPSTREAM_PORT_ANNOTATION,
)
from tests.charts.support import Helm, one
from tests.e2e.podrunner import container_env
from tests.image.kubelet import Pod, VolumeSources, prepare_volumes, run_args
from tests.image.netns import NodeNetwork
from tests.image.runtime import Container, ImageRuntime

NAMESPACE = "mcp-epoch-system"
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


def placeholder_ca(directory: Path) -> bytes:
    """A throw-away self-signed certificate: a well-formed CA that no API server holds."""
    key, cert = directory / "ca.key", directory / "ca.crt"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=smoke-placeholder",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert.read_bytes()


def with_service_account_volume(pod: Pod) -> Pod:
    """What the ServiceAccount admission plugin adds to a pod that automounts its token."""
    spec = pod["spec"]
    spec.setdefault("volumes", []).append(
        {
            "name": "kube-api-access",
            "projected": {
                "defaultMode": 0o644,
                "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {"fieldPath": "metadata.namespace"},
                                }
                            ]
                        }
                    },
                ],
            },
        }
    )
    for container in spec["containers"]:
        container.setdefault("volumeMounts", []).append(
            {"name": "kube-api-access", "mountPath": SA_MOUNT, "readOnly": True}
        )
    return pod


def service_pod(helm: Helm) -> Pod:
    deployment = one(helm.template(namespace=NAMESPACE), "Deployment", "-epoch-service")
    template = copy.deepcopy(deployment["spec"]["template"])
    pod = {
        "metadata": {
            "name": f"smoke-{uuid.uuid4().hex[:8]}",
            "namespace": NAMESPACE,
            "uid": str(uuid.uuid4()),
            "labels": template["metadata"].get("labels", {}),
        },
        "spec": template["spec"],
    }
    return with_service_account_volume(pod)


class Smoke:
    """One pod of the chart's epoch service spec, run from the image."""

    def __init__(self, image: ImageRuntime, net: NodeNetwork, helm: Helm, claim: Path) -> None:
        self.image, self.pod = image, service_pod(helm)
        self.address = net.take_address()
        name = self.pod["metadata"]["name"]
        netns = net.attach(name, self.address)
        self.pod["status"] = {"podIP": self.address}
        ca = placeholder_ca(claim.parent)
        sources = VolumeSources(
            config_map=lambda n: {"ca.crt": ca} if n == "kube-root-ca.crt" else None,
            token=lambda _sa, _aud, _exp: "placeholder-token",
            claim=lambda _claim: claim,
        )
        volumes = prepare_volumes(self.pod, image.pods / name, sources)
        container = self.pod["spec"]["containers"][0]
        env = asyncio.run(container_env(self.pod, container, _none, _none))
        env.update(KUBERNETES_SERVICE_HOST="10.96.0.1", KUBERNETES_SERVICE_PORT="443")
        self.args = run_args(
            name=name,
            image=image.image,
            pod_spec=self.pod["spec"],
            container=container,
            env=env,
            volumes={k: image.inside(v) for k, v in volumes.items()},
            netns=netns,
        )
        self.container: Container = image.start(self.args)

    def url(self, path: str) -> str:
        return f"http://{self.address}:8080{path}"

    def wait_ready(self, within: float = 90) -> None:
        """Until ``/readyz`` answers 200 (polled as a readiness probe is); fails at once if the
        container exits."""
        deadline = time.monotonic() + within
        with httpx.Client(timeout=2) as client:
            while time.monotonic() < deadline:
                try:
                    if client.get(self.url("/readyz")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = self.container.proc.wait(0.25)
                    pytest.fail(f"the container exited {code}:\n{self.container.output()}")
        pytest.fail(f"not ready after {within:.0f}s:\n{self.container.output()}")


async def _none(_name: str) -> dict[str, str] | None:
    return None


@pytest.fixture
def network() -> Iterator[NodeNetwork]:
    with NodeNetwork() as net:
        yield net


def test_serve_becomes_ready_under_the_chart_container_spec(
    image: ImageRuntime, network: NodeNetwork, helm: Helm
) -> None:
    claim = image.pods / f"claim-{uuid.uuid4().hex[:8]}"
    claim.mkdir()
    smoke = Smoke(image, network, helm, claim)
    smoke.wait_ready()
    assert "--read-only" in smoke.args and "--cap-drop=ALL" in smoke.args
    health = httpx.get(smoke.url("/healthz"), timeout=5).json()
    assert health["status"] == "ok", health
    # The ledger was created on the claim by the chart's UID, in the group the kubelet gave it.
    ledger = claim / "ledger.db"
    assert ledger.is_file()
    assert (ledger.stat().st_uid, claim.stat().st_gid) == (10001, 10001)
    # PID 1 of the container shuts down cleanly on the kubelet's SIGTERM.
    assert image.stop(smoke.container.name, grace=20) == 0, smoke.container.output()


def test_an_unwritable_ledger_is_one_clear_line(
    image: ImageRuntime, network: NodeNetwork, helm: Helm
) -> None:
    # A volume whose group already is the pod's fsGroup is left alone (OnRootMismatch), so
    # one that this group cannot write stays unwritable: as on storage without fsGroup.
    claim = image.pods / f"claim-{uuid.uuid4().hex[:8]}"
    claim.mkdir()
    os.chown(claim, 0, 10001)
    claim.chmod(0o2750)
    smoke = Smoke(image, network, helm, claim)
    code = smoke.container.proc.wait(60)
    output = smoke.container.output().strip()
    assert code != 0, output
    lines = output.splitlines()
    assert len(lines) == 1, output
    assert "/var/lib/mcp-epoch" in lines[0] and "Traceback" not in output, output


def test_the_injected_sidecar_runs_from_the_image_in_front_of_a_server(
    image: ImageRuntime, network: NodeNetwork, tmp_path: Path
) -> None:
    """The sidecar as the webhook injects it (its command, args and security context), run
    from the image in a pod's network namespace beside an MCP server on the pod's loopback
    (an unwrapped Python SDK server, started in that namespace as the main container). A client
    outside the pod calls a tool through it; the pod's drain request drains it; SIGTERM ends
    it with its drain report."""
    address = network.take_address()
    name = f"sidecar-{uuid.uuid4().hex[:8]}"
    netns = network.attach(name, address)
    pod = {
        "metadata": {
            "name": name,
            "namespace": "tools",
            "uid": str(uuid.uuid4()),
            "labels": {"mcp.epochs.dev/server": "weather"},
            "annotations": {
                DATA_PLANE_ANNOTATION: "sidecar",
                UPSTREAM_PORT_ANNOTATION: "3000",
            },
        },
        "spec": {"containers": [{"name": "server", "image": "any", "command": ["server"]}]},
        "status": {"podIP": address},
    }
    # No epoch service here: the sidecar runs on a fallback epoch, as a library replica would.
    defaults = ReplicaDefaults("", token_audience=None, sidecar_image=image.image)
    pod = injected(pod, "0123abcd-7", "weather", defaults)
    sidecar = pod["spec"]["initContainers"][0]
    server = [sys.executable, "-m", "tests.sidecar.py_server", "--port", "3000"]
    upstream = subprocess.Popen(
        ["ip", "netns", "exec", Path(netns).name, *server],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert upstream.stdout is not None and upstream.stdout.readline()  # it listens
        env = asyncio.run(container_env(pod, sidecar, _none, _none))
        args = run_args(
            name=name,
            image=image.image,
            pod_spec=pod["spec"],
            container=sidecar,
            env=env,
            volumes={},
            netns=netns,
        )
        assert "--read-only" in args and "--cap-drop=ALL" in args
        container = image.start(args)
        base = f"http://{address}:8080"
        deadline = time.monotonic() + 90
        with httpx.Client(timeout=5) as http:
            while True:  # polled as a readiness probe is
                with contextlib.suppress(httpx.TransportError):
                    if http.get(f"{base}/readyz").status_code == 200:
                        break
                assert container.proc.poll() is None, container.output()
                assert time.monotonic() < deadline, container.output()
                time.sleep(0.25)
            headers = {
                "accept": "application/json, text/event-stream",
                "content-type": "application/json",
            }
            init = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "smoke", "version": "0"},
                },
            }
            r = http.post(f"{base}/mcp", json=init, headers=headers)
            assert r.status_code == 200, r.text
            epoch = r.headers[SERVED_BY_HEADER]
            headers["mcp-session-id"] = r.headers["mcp-session-id"]
            headers["mcp-protocol-version"] = "2025-11-25"
            assert epoch in headers["mcp-session-id"]
            http.post(
                f"{base}/mcp",
                json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                headers=headers,
            )
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "from inside the pod"}},
            }
            r = http.post(f"{base}/mcp", json=call, headers=headers)
            assert "from inside the pod" in r.text and f"id: {epoch}:" in r.text, r.text
            token = env[ENV_DRAIN_TOKEN]
            drained = http.get(f"{base}{DRAIN_PATH}", headers={DRAIN_TOKEN_HEADER: token}).json()
            assert drained["abandoned"] == 0 and not drained["deadline"], drained
        assert image.stop(name, grace=20) == 0, container.output()
        assert '"drained"' in container.output()
    finally:
        upstream.terminate()
        upstream.wait(10)
        network.detach(name)
