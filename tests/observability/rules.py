"""The chart's alerting rules (``charts/mcp-epoch/files/prometheus-rules.yaml``, Prometheus's
rule-file format) and what "fires" means in these tests.

An alert fires here when its expression returns a non-empty vector at the evaluation time.
The ``for:`` duration is Prometheus's timer on top of that (the alert is pending until the
expression has stayed non-empty that long): it is not what these tests check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

from tests.observability.promql import Element, Evaluator

RULES_FILE = Path(__file__).resolve().parents[2] / "charts/mcp-epoch/files/prometheus-rules.yaml"

#: The scrape jobs the rule file's expressions name: what the chart's monitors produce for
#: the release ``mcp-epoch`` in ``mcp-epoch-system`` (the ServiceMonitor's job is the epoch
#: service's Service name, the operator PodMonitor's ``<namespace>/<name>``); the chart's
#: template rewrites both per release.
SERVICE_JOB = "mcp-epoch-epoch-service"
OPERATOR_JOB = "mcp-epoch-system/mcp-epoch-operator"


@dataclass(frozen=True)
class AlertRule:
    group: str
    alert: str
    expr: str
    for_: str


def load_alerts(path: Path = RULES_FILE) -> dict[str, AlertRule]:
    """Every alerting rule of the file by name (recording rules would need an evaluation
    order this module does not implement: the file has none, and loading one is an error)."""
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    alerts: dict[str, AlertRule] = {}
    for group in document["groups"]:
        for rule in group["rules"]:
            if "alert" not in rule:
                raise NotImplementedError(f"recording rule {rule.get('record')!r} in {path}")
            alerts[rule["alert"]] = AlertRule(
                group["name"], rule["alert"], rule["expr"], str(rule.get("for", "0s"))
            )
    return alerts


def firing(evaluator: Evaluator, rule: AlertRule, at: float) -> list[Element]:
    """The alerts ``rule`` would have pending or firing at ``at``: its expression's result."""
    return evaluator.vector(rule.expr, at)
