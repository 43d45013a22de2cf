"""Fixtures of the chart's tests (``helm`` itself is shared: tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.charts.support import Helm
from tests.cluster.harness import Cluster


@pytest.fixture(scope="module")
def cluster_helm(k8s_cluster: Cluster, helm: Helm) -> Helm:
    """helm bound to the local control plane."""
    return Helm(helm.binary, k8s_cluster.kubeconfig)
