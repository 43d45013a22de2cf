"""Fast checks that the committed wrapper modules still match versions.py.

A version bump that forgets ``python -m tests.cluster gomod`` would otherwise
only show up as a confusing build failure minutes into CI.
"""

from __future__ import annotations

import re

import pytest

from tests.cluster import build, versions


def test_staging_version_maps_minor_and_patch() -> None:
    assert versions.staging_version("v1.37.2") == "v0.37.2"
    with pytest.raises(ValueError):
        versions.staging_version("v2.0.0")


@pytest.mark.parametrize("comp", build.components(), ids=lambda c: c.name)
def test_wrapper_module_pins_match_versions(comp: build.Component) -> None:
    gomod = (comp.module_dir / "go.mod").read_text(encoding="utf-8")
    for path, version in comp.requires.items():
        assert f"\t{path} {version}" in gomod
    for path, version in comp.replaces.items():
        assert f"\t{path} => {path} {version}" in gomod
    tools = set(re.findall(r"^tool (\S+)$", gomod, re.M))
    block = re.search(r"^tool \(\n(.*?)^\)", gomod, re.M | re.S)
    if block:
        tools |= set(block.group(1).split())
    assert set(comp.binaries.values()) <= tools
    assert (comp.module_dir / "go.sum").stat().st_size > 0


def test_every_required_staging_module_is_replaced() -> None:
    """k8s.io/kubernetes requires its staging modules at v0.0.0, which
    does not exist on the proxy: each one needs a replace."""
    gomod = (build.component("kubernetes").module_dir / "go.mod").read_text(encoding="utf-8")
    required = {
        line.split()[0]
        for line in gomod.splitlines()
        if line.startswith("\tk8s.io/") and line.split()[1:2] == ["v0.0.0"]
    }
    replaced = set(build.component("kubernetes").replaces)
    assert required <= replaced, required - replaced
