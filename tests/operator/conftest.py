"""Fixtures for the operator's tests: one epoch service and one operator process per session,
against the loopback control plane of ``tests.cluster``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.operator.support import (
    CRD_FILE,
    OPERATOR_NAMESPACE,
    OperatorProcess,
    make_namespace,
    wait_for,
)
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.ports import free_port


# Package scope: the operator and its webhook registration end with tests/operator, so other
# packages (tests/charts runs its own operator) never meet a leftover webhook.
@pytest.fixture(scope="package")
def op_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EpochServiceProcess]:
    """The epoch service the operator talks to (SQLite; its port survives restarts)."""
    work = tmp_path_factory.mktemp("operator-epochsvc")
    service = EpochServiceProcess(f"sqlite:///{work}/ledger.db", work / "epochsvc.log")
    service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="session")
def crd(k8s_cluster: Cluster) -> Path:
    """The McpServer CRD, applied from crds/ exactly as the chart ships it."""
    k8s_cluster.kubectl("apply", "-f", str(CRD_FILE))
    k8s_cluster.kubectl(
        "wait", "--for=condition=Established", "crd/mcpservers.mcp.epochs.dev", "--timeout=60s"
    )
    wait_for(
        lambda: k8s_cluster.kubectl("get", "mcps", "-A", check=False).returncode == 0,
        30,
        "mcpservers to be served",
    )
    make_namespace(k8s_cluster, OPERATOR_NAMESPACE)
    return CRD_FILE


@pytest.fixture(scope="package")
def operator(
    k8s_cluster: Cluster,
    crd: Path,
    op_service: EpochServiceProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    """``mcp-epoch operator`` as a real process, serving and registering its webhook."""
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    proc = OperatorProcess(k8s_cluster, op_service, free_port(), log)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        k8s_cluster.kubectl(
            "delete", "mutatingwebhookconfiguration", "mcp-epoch-operator", "--ignore-not-found"
        )


@pytest.fixture
def running_operator(
    operator: OperatorProcess, op_service: EpochServiceProcess, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    """The operator, guaranteed running with a running service at the start of each test;
    its log tail is attached to a failing test's report."""
    if op_service.proc is None:
        op_service.start()
    if operator.proc is None:
        operator.start()
    yield operator
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"----- operator log (tail) -----\n{operator.tail(80)}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
