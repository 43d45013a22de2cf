"""pytest plugin: one real control plane per test session.

Register it from ``tests/conftest.py`` with::

    pytest_plugins = ["tests.cluster.fixtures"]

Tests that need the cluster are marked ``@pytest.mark.cluster`` and take the
``k8s_cluster`` fixture.  If the binaries cannot be built or the control
plane does not come up, those tests *fail* with the build or start-up error:
a missing cluster must never look like a green run.  When a cluster test
fails, the tail of every component's log is attached to its report.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from tests.cluster import build, harness

_CLUSTER_KEY = pytest.StashKey[harness.Cluster]()
_BUILD_ERROR_KEY = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker so ``--strict-markers`` accepts it."""
    config.addinivalue_line(
        "markers",
        "cluster: needs the real loopback Kubernetes control plane (k8s_cluster fixture)",
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build missing binaries once collection shows cluster tests will run.

    Building here, not in the fixture, keeps a cold build (minutes) outside
    any per-test timeout; the error is kept and reported by the fixture.
    """
    if not any(item.get_closest_marker("cluster") for item in session.items):
        return
    cached = all(build.is_built(comp) for comp in build.components())
    log = _quiet if cached else _terminal_log(session.config)
    try:
        build.ensure_built(log=log)
    except build.BuildError as exc:
        session.config.stash[_BUILD_ERROR_KEY] = str(exc)


def _quiet(message: str) -> None:
    """Nothing to report when every binary is already in the cache."""


def _terminal_log(config: pytest.Config) -> Callable[[str], None]:
    """Progress written past pytest's output capture: a cold build takes
    minutes and a silent pytest looks hung."""
    capman = config.pluginmanager.getplugin("capturemanager")

    def log(message: str) -> None:
        if capman is None:
            print(message, file=sys.stderr, flush=True)
            return
        with capman.global_and_fixture_disabled():
            print(message, file=sys.stderr, flush=True)

    return log


def _captured_log(message: str) -> None:
    """Start-up progress (seconds) stays in the captured output of the first test."""
    print(message, file=sys.stderr, flush=True)


def _start(cluster: harness.Cluster) -> str | None:
    """Build and start; returns the error text instead of raising, so the
    test report shows the build or start-up error once, without a chained
    traceback."""
    try:
        cluster.start()  # builds whatever is missing first
    except build.BuildError as exc:
        return f"control-plane binaries could not be built:\n{exc}"
    except harness.ClusterError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session")
def k8s_cluster(request: pytest.FixtureRequest) -> Iterator[harness.Cluster]:
    """A started ``harness.Cluster`` shared by the whole session.

    It offers ``kubeconfig``, ``server``, ``kubectl(*args)``,
    ``kubectl_json(*args)``, ``api()`` (the official client as the admin),
    ``binary(name)`` (e.g. ``helm``), ``ca_cert``, ``webhook_cert`` and
    ``webhook_key``.
    """
    failure = request.config.stash.get(_BUILD_ERROR_KEY, None)
    if failure:
        pytest.fail(f"control-plane binaries could not be built:\n{failure}", pytrace=False)
    cluster = harness.Cluster(log=_captured_log, die_with_parent=True)
    failure = _start(cluster)
    if failure:
        pytest.fail(failure, pytrace=False)
    request.config.stash[_CLUSTER_KEY] = cluster
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, Any, None]:
    """Attach component log tails to the report of a failed cluster test."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or item.get_closest_marker("cluster") is None:
        return
    cluster = item.config.stash.get(_CLUSTER_KEY, None)
    if cluster is None or cluster.run_dir is None:
        return
    report.sections.append(("control-plane logs (tail)", cluster.logs_tail(lines=30)))
