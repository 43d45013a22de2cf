"""Shared fixtures: real epoch service processes on SQLite files and on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.postgres import PostgresServer

# The loopback Kubernetes control plane (k8s_cluster fixture, `cluster` marker).
pytest_plugins = ["tests.cluster.fixtures"]


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty ledger database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/ledger.db"
    pg: PostgresServer = request.getfixturevalue("postgres")
    return pg.new_database()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/ledger.db"


ServiceFactory = Callable[..., EpochServiceProcess]


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[ServiceFactory]:
    """Start epoch service processes; all are stopped at the end of the test."""
    started: list[EpochServiceProcess] = []

    def make(database_url: str, **env: str) -> EpochServiceProcess:
        svc = EpochServiceProcess(database_url, tmp_path / f"epochsvc-{len(started)}.log", **env)
        started.append(svc)
        return svc.start()

    yield make
    for svc in started:
        svc.stop()


@pytest.fixture
def epoch_service(service_factory: ServiceFactory, sqlite_url: str) -> EpochServiceProcess:
    """One epoch service process on a fresh SQLite ledger."""
    return service_factory(sqlite_url)
