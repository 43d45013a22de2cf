"""The stages file a cluster's kwok runs with, composed from kwok's own defaults (the
pinned kwok's are composed by every cluster the suite starts)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.cluster.kwok_stages import (
    DEFAULT_READY_STAGE,
    PROBED_STAGE,
    PROBER_LABEL,
    PROBER_VALUE,
    compose,
)

SELECTED = f'.metadata.labels["{PROBER_LABEL}"]'

DEFAULTS = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: node-initialize}
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  next: {statusTemplate: "phase: Running"}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata: {name: pod-ready}
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - {key: .status.phase, operator: In, values: [Pending]}
  next: {statusTemplate: "phase: Running"}
"""


def _stages(text: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(text)}


def test_labelled_pods_leave_kwoks_ready_stage_for_the_unready_one() -> None:
    stages = _stages(compose(DEFAULTS))
    assert list(stages) == ["node-initialize", DEFAULT_READY_STAGE, PROBED_STAGE]
    ready = stages[DEFAULT_READY_STAGE]["spec"]["selector"]["matchExpressions"]
    probed = stages[PROBED_STAGE]["spec"]["selector"]["matchExpressions"]
    pending = {"key": ".status.phase", "operator": "In", "values": ["Pending"]}
    # Same pods otherwise, split by the label, so exactly one of the two matches any pod.
    assert ready == [pending, {"key": SELECTED, "operator": "NotIn", "values": [PROBER_VALUE]}]
    assert probed == [pending, {"key": SELECTED, "operator": "In", "values": [PROBER_VALUE]}]
    template = stages[PROBED_STAGE]["spec"]["next"]["statusTemplate"]
    assert "ready: false" in template and "ready: true" not in template
    assert "phase: Running" in template and "podIP:" in template


def test_defaults_without_a_ready_stage_are_refused() -> None:
    with pytest.raises(ValueError, match="pod-ready"):
        compose(DEFAULTS.split("---")[0])
