"""``helm install``, and the release's pods run as containers of the image ``make image`` built.

The chart is installed on the local control plane with its defaults, except the image (the
locally built one, never pulled) and a node selector and toleration that put both pods on
the :class:`~tests.image.node.ImageNode`: a kwok node whose pods run with runc, each in a pod
network namespace, with exactly the environment, arguments, mounts (the webhook's TLS Secret,
the projected tokens the API server issues for that pod, the ledger claim) and security
context the API server holds. Emulated, because no kubelet can run here: the node's status
(kwok), cluster DNS (``/etc/hosts``) and kube-proxy (DNAT rules in the node's namespace); see
tests/image/node.py. The API server calls the webhook through its Service as the chart
configures it, and verifies the certificate the chart made for the Service's DNS name.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx
import pytest
from pydantic import BaseModel

from mcp_epoch.api import Call
from mcp_epoch.api_client import SyncEpochServiceClient
from mcp_epoch.contract import TOKEN_AUDIENCE
from tests.charts.support import CHART, Helm, ledger_volume
from tests.cluster.harness import Cluster
from tests.image.netns import NodeNetwork
from tests.image.node import TAINT_KEY, ImageNode
from tests.image.runtime import ImageRuntime
from tests.operator.support import (
    EPOCH_ANNOTATION,
    apply,
    env_of,
    ledger_states,
    make_namespace,
    mcpserver,
    settled,
    wait_for,
)

pytestmark = pytest.mark.cluster

RELEASE = "mcp-epoch"
NS = "mcp-epoch-image"
SERVERS_NS = "image-servers"
PV_NAME = "mcp-epoch-image-ledger"
OPERATOR_SA = "mcp-epoch-operator"
START = 120  # image-run pods start in seconds; this bounds a slow, busy machine


M = TypeVar("M", bound=BaseModel)


class ServiceInPod:
    """The epoch service as the operator sees it: its pod IP, the operator's own token."""

    def __init__(self, address: str, token: str) -> None:
        self.url = f"http://{address}:8080"
        self.operator_token = token

    def send(self, call: Call[M]) -> M:
        """One call of the shared client, as the operator."""
        with SyncEpochServiceClient(self.url, self.operator_token) as client:
            return client.send(call)


@pytest.fixture(scope="module")
def image_node(k8s_cluster: Cluster, image: ImageRuntime) -> Iterator[ImageNode]:
    with NodeNetwork() as net, ImageNode(k8s_cluster, image, net) as node:
        yield node


def _placement(component: str) -> list[str]:
    toleration = [{"key": TAINT_KEY, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    escaped = TAINT_KEY.replace(".", "\\.")  # helm --set splits keys at unescaped dots
    return [
        "--set-string",
        f"{component}.nodeSelector.{escaped}=true",
        "--set-json",
        f"{component}.tolerations={json.dumps(toleration)}",
    ]


@pytest.fixture(scope="module")
def release(k8s_cluster: Cluster, cluster_helm: Helm, image_node: ImageNode) -> Iterator[None]:
    make_namespace(k8s_cluster, NS)
    make_namespace(k8s_cluster, SERVERS_NS)
    # The node's claims directory stands for the volume; the path here is never used.
    claim = (NS, f"{RELEASE}-ledger")
    apply(k8s_cluster, ledger_volume(PV_NAME, "/var/lib/mcp-epoch-image-test", claim))
    repository, tag = image_node.image.image.removeprefix("localhost/").split(":")
    cluster_helm.run(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        NS,
        "--set",
        "image.registry=localhost",
        "--set",
        f"image.repository={repository}",
        "--set",
        f"image.tag={tag}",
        "--set",
        "image.pullPolicy=Never",
        *_placement("operator"),
        *_placement("epochService"),
        "--wait",
        "--timeout=120s",
        timeout=180,
    )
    try:
        yield
    finally:
        k8s_cluster.kubectl("delete", "mcpservers", "--all", "-n", SERVERS_NS, check=False)
        cluster_helm.run("uninstall", RELEASE, "--namespace", NS, "--wait", check=False)
        k8s_cluster.kubectl("delete", "pvc", "--all", "-n", NS, "--wait=false", check=False)
        k8s_cluster.kubectl("delete", "pv", PV_NAME, "--wait=false", check=False)
        for ns in (SERVERS_NS, NS):
            k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _release_pod(cluster: Cluster, component: str) -> dict[str, Any] | None:
    items = cluster.kubectl_json(
        "get", "pods", "-n", NS, "-l", f"app.kubernetes.io/component={component}"
    )["items"]
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    return live[0] if len(live) == 1 and live[0]["status"].get("podIP") else None


def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False


def test_the_release_runs_from_the_image_and_mcpserver_pods_get_live_epochs(
    k8s_cluster: Cluster, release: None, image_node: ImageNode
) -> None:
    service_pod = wait_for(lambda: _release_pod(k8s_cluster, "epoch-service"), START, "pod")
    operator_pod = wait_for(lambda: _release_pod(k8s_cluster, "operator"), START, "pod")
    for pod in (service_pod, operator_pod):
        assert pod["spec"]["nodeName"] == image_node.name
        assert pod["spec"]["containers"][0]["image"] == image_node.image.image
    service_ip, operator_ip = service_pod["status"]["podIP"], operator_pod["status"]["podIP"]

    def serving() -> bool:
        with httpx.Client(timeout=2) as client:
            ready = client.get(f"http://{service_ip}:8080/readyz").status_code == 200
        return ready and _accepts(operator_ip, 9443)

    try:
        image_node.wait(serving, START, "the epoch service ready and the webhook listening")
        assert not image_node.errors, image_node.errors
        # The ledger is on the claim, written by the chart's UID 10001.
        ledger = image_node.claims / f"{NS}-{RELEASE}-ledger" / "ledger.db"
        assert ledger.is_file() and ledger.stat().st_uid == 10001

        with k8s_cluster.api() as api:
            token = api.mint_token(NS, OPERATOR_SA, [TOKEN_AUDIENCE])
        service = ServiceInPod(service_ip, token)
        apply(k8s_cluster, mcpserver("echo", SERVERS_NS, replicas=2))
        # The webhook (a container, reached through its Service) injected the epochs, and the
        # operator (a container) made them live in the ledger (a container) for these pods.
        state = wait_for(
            lambda: settled(k8s_cluster, service, SERVERS_NS, "echo", 2),  # type: ignore[arg-type]
            START,
            "2 live epochs",
        )
        in_cluster_url = f"http://{RELEASE}-epoch-service.{NS}.svc:8080"
        for epoch, pod in state["pods"].items():
            assert pod["metadata"]["annotations"][EPOCH_ANNOTATION] == epoch
            env = env_of(pod["spec"]["containers"][0])
            assert env["MCP_EPOCH"] == epoch
            assert env["MCP_EPOCH_SERVICE_URL"] == in_cluster_url

        gone = next(iter(state["pods"]))
        victim = state["pods"][gone]["metadata"]["name"]
        k8s_cluster.kubectl("delete", "pod", victim, "-n", SERVERS_NS, "--wait=false")
        wait_for(
            lambda: ledger_states(service, SERVERS_NS, "echo").get(gone) == "retired",  # type: ignore[arg-type]
            START,
            f"epoch {gone} retired",
        )
        wait_for(
            lambda: settled(k8s_cluster, service, SERVERS_NS, "echo", 2),  # type: ignore[arg-type]
            START,
            "a replacement pod with a live epoch",
        )
        assert not image_node.errors, image_node.errors
    except BaseException:
        print(image_node.pod_output(f"{RELEASE}-"))
        raise
