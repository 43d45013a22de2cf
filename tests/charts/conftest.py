"""Fixtures of the chart's tests: the pinned helm binary (built from Go modules by
tests/cluster, like the control plane)."""

from __future__ import annotations

import pytest

from tests.charts.support import Helm
from tests.cluster import build


@pytest.fixture(scope="session")
def helm() -> Helm:
    """helm for offline work (lint, template); only helm is built if it is missing, never
    the whole control plane."""
    try:
        paths = build.ensure_built(["helm"], log=lambda _message: None)
    except build.BuildError as exc:
        pytest.fail(f"helm could not be built:\n{exc}", pytrace=False)
    return Helm(paths["helm"])
