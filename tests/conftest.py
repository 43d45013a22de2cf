"""Shared fixtures: real epoch service processes on SQLite files and on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.charts.support import Helm
from tests.cluster import build
from tests.image.runtime import ImageMissing, ImageRuntime, image_runtime
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.postgres import PostgresServer

# The loopback Kubernetes control plane (k8s_cluster fixture, `cluster` marker).
pytest_plugins = ["tests.cluster.fixtures"]


@pytest.fixture
def anyio_backend() -> str:
    """``pytest.mark.anyio`` tests run on asyncio, the loop every part of the product uses."""
    return "asyncio"


@pytest.fixture(scope="session")
def helm() -> Helm:
    """The pinned helm (built from Go modules by tests/cluster, like the control plane) for
    offline work (lint, template); only helm is built if it is missing."""
    try:
        paths = build.ensure_built(["helm"], log=lambda _message: None)
    except build.BuildError as exc:
        pytest.fail(f"helm could not be built:\n{exc}", pytrace=False)
    return Helm(paths["helm"])


@pytest.fixture(scope="session")
def image() -> Iterator[ImageRuntime]:
    """The image ``make image`` built, loaded into a podman storage of this run."""
    try:
        with image_runtime() as runtime:
            yield runtime
    except ImageMissing as exc:
        pytest.fail(str(exc), pytrace=False)


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
