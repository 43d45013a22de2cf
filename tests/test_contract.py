"""The CRD and the chart agree with ``mcp_epoch.contract``, the one source of shared names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from mcp_epoch import contract

ROOT = Path(__file__).resolve().parents[1]
CRD = ROOT / "crds" / "mcpservers.mcp.epochs.dev.yaml"
CHART = ROOT / "charts" / "mcp-epoch"


def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(CRD.read_text())
    return doc


def spec_schema() -> dict[str, Any]:
    (version,) = crd()["spec"]["versions"]
    props: dict[str, Any] = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return props["properties"]


def test_crd_names_are_the_contracts() -> None:
    spec = crd()["spec"]
    assert crd()["metadata"]["name"] == f"{contract.PLURAL}.{contract.GROUP}"
    assert spec["group"] == contract.GROUP
    assert spec["names"]["kind"] == contract.KIND
    assert spec["names"]["plural"] == contract.PLURAL
    assert spec["names"]["shortNames"] == [contract.SHORT_NAME]
    assert [v["name"] for v in spec["versions"]] == [contract.VERSION]


def test_crd_defaults_and_limits_are_the_contracts() -> None:
    resumption = spec_schema()["resumption"]
    props = resumption["properties"]
    assert props["reconnectWindowSeconds"]["default"] == contract.DEFAULT_RECONNECT_WINDOW_SECONDS
    assert props["eventsPerSecond"]["default"] == contract.DEFAULT_EVENTS_PER_SECOND
    (rule,) = resumption["x-kubernetes-validations"]
    assert f"<= {contract.MAX_OPERATOR_BUFFER_EVENTS}" in rule["rule"]


def test_crd_reserves_exactly_the_injected_environment() -> None:
    (rule,) = spec_schema()["env"]["x-kubernetes-validations"]
    reserved = re.findall(r"'([A-Z_]+)'", rule["rule"])
    assert sorted(reserved) == sorted(contract.INJECTED_ENV)


def test_chart_ships_the_crd_unchanged() -> None:
    assert (CHART / "crds" / CRD.name).read_text() == CRD.read_text()


def test_chart_selects_pods_by_the_contracts_label() -> None:
    templates = ("webhook-mutatingwebhookconfiguration.yaml", "epoch-service-networkpolicy.yaml")
    for template in templates:
        text = (CHART / "templates" / template).read_text()
        keys = set(re.findall(r"key: (\S+)", text))
        assert contract.SERVER_LABEL in keys, template
        assert keys <= {contract.SERVER_LABEL, "kubernetes.io/metadata.name"}, (template, keys)


def test_the_services_lifecycle_states_are_the_contracts() -> None:
    from epochsvc.service.lifecycle import State

    assert tuple(s.value for s in State) == contract.STATES


def test_the_epoch_patterns_accept_exactly_what_the_ledger_can_hold() -> None:
    """The OpenAPI document's path pattern and the parsers agree: no leading zeros, at most
    2**63 - 1, for the generation and the incarnation alike."""
    import re

    from mcp_epoch.contract import ANY_EPOCH_PATTERN, MAX_GENERATION, parse_epoch

    pattern = re.compile(rf"\A{ANY_EPOCH_PATTERN}\Z")
    cases = ["0", "7", "10", str(MAX_GENERATION - 1), str(MAX_GENERATION)]
    cases += ["00", "01", str(MAX_GENERATION + 1), "9" * 19, "1" + "0" * 19, "-1", ""]
    for gen in cases:
        for raw in (f"9f2c1a7e-{gen}", f"9f2c1a7e-42.{gen}"):
            try:
                parse_epoch(raw)
                parses = True
            except ValueError:
                parses = False
            assert bool(pattern.match(raw)) == parses, raw
            legal = gen.isdigit() and not (gen.startswith("0") and gen != "0")
            assert parses == (legal and int(gen) <= MAX_GENERATION), raw
