"""Fixtures for the operator's tests: one epoch service and one operator process per session,
against the loopback control plane of ``tests.cluster``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.harness import Cluster
from tests.operator.support import (
    OperatorProcess,
    install_crd,
    operator_running,
)
from tests.support.epochsvc_proc import EpochServiceProcess


# Package scope: the operator and its webhook registration end with tests/operator, so other
# packages (tests/charts runs its own operator) never meet a leftover webhook.
@pytest.fixture(scope="package")
def op_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EpochServiceProcess]:
    """The epoch service the operator talks to (SQLite; its port survives restarts)."""
    work = tmp_path_factory.mktemp("operator-epochsvc")
    with EpochServiceProcess(f"sqlite:///{work}/ledger.db", work / "epochsvc.log") as service:
        yield service


@pytest.fixture(scope="session")
def crd(k8s_cluster: Cluster) -> Path:
    return install_crd(k8s_cluster)


@pytest.fixture(scope="package")
def operator(
    k8s_cluster: Cluster,
    crd: Path,
    op_service: EpochServiceProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with operator_running(k8s_cluster, op_service, log) as proc:
        yield proc


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
