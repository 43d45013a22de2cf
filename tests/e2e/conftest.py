"""Fixtures of the end-to-end proof on the loopback control plane, and where its figures go.

Everything here is package-scoped and built from the operator tests' support classes (not
their fixtures, which belong to tests/operator): one epoch service, the McpServer CRD, one
``mcp-epoch operator`` process with its webhook registered, and a namespace for the fleets.
The operator's MutatingWebhookConfiguration is deleted when this package ends, because other
packages register their own under the same name.

The fleets' table is printed by the test (shown with ``-rA``/``-s`` or when it fails) and also
stashed here and written by :func:`pytest_terminal_summary` in a section of its own at the end
of every run, so CI logs (``pytest -ra``) always carry both fleets' figures.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.harness import POD_CIDR, Cluster, pod_addresses_local
from tests.e2e.podrunner import KubeAccess
from tests.operator.support import (
    OperatorProcess,
    install_crd,
    make_namespace,
    operator_running,
)
from tests.support.epochsvc_proc import EpochServiceProcess

FIGURES = pytest.StashKey[list[tuple[str, str]]]()
DEMO_NAMESPACE = "e2e-rolling-deploy"
RING_TTL_SECONDS = 3.0


@pytest.fixture(scope="package")
def e2e_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EpochServiceProcess]:
    """The epoch service (SQLite) the operator issues epochs from and the replicas register
    their incarnations with. Its request-state TTL is short, so that a full key rotation (it
    keeps the old key one TTL) fits a test."""
    work = tmp_path_factory.mktemp("e2e-epochsvc")
    ledger = f"sqlite:///{work}/ledger.db"
    ttl = {"EPOCHSVC_REQUEST_STATE_TTL_SECONDS": str(RING_TTL_SECONDS)}
    with EpochServiceProcess(ledger, work / "epochsvc.log", **ttl) as service:
        yield service


@pytest.fixture(scope="package")
def e2e_operator(
    k8s_cluster: Cluster,
    e2e_service: EpochServiceProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    install_crd(k8s_cluster)
    log = tmp_path_factory.mktemp("e2e-operator") / "operator.log"
    with operator_running(k8s_cluster, e2e_service, log) as proc:
        yield proc


@pytest.fixture(scope="package")
def demo_namespace(k8s_cluster: Cluster, e2e_operator: OperatorProcess) -> Iterator[str]:
    """A namespace for the fleets' McpServers; deleted (without waiting) afterwards."""
    ns = make_namespace(k8s_cluster, DEMO_NAMESPACE)
    yield ns
    k8s_cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false")


@pytest.fixture(scope="package")
def pod_network() -> None:
    """Pod IPs reach the pod runner's processes (forwarding to an owner goes to its pod IP)."""
    why = pod_addresses_local()
    if why is not None:
        pytest.fail(
            f"the end-to-end proof needs the pod range {POD_CIDR} local to this machine and "
            f"could not make it so ({why}); run it as root with iproute2 installed"
        )


@pytest.fixture(scope="package")
def kube_access(k8s_cluster: Cluster, pod_network: None) -> KubeAccess:
    """The admin identity of the loopback control plane, as the demo's fleet driver takes it."""
    return KubeAccess(
        kubeconfig=k8s_cluster.kubeconfig,
        kubectl=k8s_cluster.binary("kubectl"),
    )


@pytest.fixture
def keep_figures(request: pytest.FixtureRequest) -> list[tuple[str, str]]:
    """Append ``(title, text)`` here to have it written in the run's terminal summary."""
    return request.config.stash.setdefault(FIGURES, [])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Both fleets' figures in every run's output, whatever the capture and -r options."""
    for title, text in terminalreporter.config.stash.get(FIGURES, []):
        terminalreporter.write_sep("=", title)
        for line in text.splitlines():
            terminalreporter.write_line(line)
