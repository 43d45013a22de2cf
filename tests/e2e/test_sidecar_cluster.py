"""The sidecar on the control plane: a rolling deploy of an ``McpServer`` whose pods run the
TypeScript SDK server (no event store, no mcp-epoch in it) with the sidecar the webhook injects.

The operator's webhook gives each pod its epoch and a native sidecar (``mcp-epoch proxy``)
serving the pod's MCP port in front of the server, and a preStop on the server's container that
waits for the sidecar's drain. The pod runner runs both containers in the kubelet's order
(sidecar first; on deletion the server's preStop to its end, then the server's SIGTERM, then the
sidecar's). The scenario, clients, balancer and verdict are the demo's, with ``EpochClient``:
the sidecar fleet is held to the library fleet's targets.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from epochsvc.demo import report
from epochsvc.demo.scenario import run_fleet
from mcp_epoch.contract import SIDECAR_CONTAINER
from tests.e2e.podrunner import KubeAccess
from tests.e2e.test_rolling_deploy_cluster import (
    CONFIG,
    _check_kubernetes_path,
    _kube_fleets,
    _log,
)
from tests.operator.support import OperatorProcess
from tests.support.epochsvc_proc import EpochServiceProcess

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.filterwarnings("ignore:.*removed as of 2026-07-28"),
]


def test_a_rolling_deploy_of_typescript_servers_behind_the_injected_sidecar(
    e2e_operator: OperatorProcess,
    e2e_service: EpochServiceProcess,
    kube_access: KubeAccess,
    demo_namespace: str,
    keep_figures: list[tuple[str, str]],
    tmp_path: Path,
) -> None:
    fleets = _kube_fleets(kube_access, demo_namespace, tmp_path, e2e_service)
    _log("[sidecar, TS servers on Kubernetes]")
    result = asyncio.run(run_fleet("sidecar", CONFIG, fleets, _log, tmp_path / "calls.jsonl"))
    figures = report.table([result]) + f"\n(calls and per-pod logs: {tmp_path})"
    print("\n" + figures)
    keep_figures.append(("rolling deploy of TypeScript servers behind the sidecar", figures))
    (fleet,) = fleets.fleets
    _check_kubernetes_path(fleet, e2e_service, CONFIG.replicas)
    pods = fleet.pods()
    # Every pod ran the webhook's sidecar in front of the server, in the kubelet's order.
    assert all(p.sidecars == (SIDECAR_CONTAINER,) for p in pods), [p.sidecars for p in pods]
    replaced = pods[: CONFIG.replicas]
    for p in replaced:
        assert p.hook_done_at is not None and p.main_exited_at is not None, p.pod
        assert p.sidecars_exited_at is not None
        assert p.hook_done_at <= p.main_exited_at <= p.sidecars_exited_at, p.pod
        # The sidecar drained before the server was signalled. A drain ends clean, or at its
        # deadline held by calls it names: as with the library, a call whose client left while
        # its tool waits for an elicitation answer nobody will send never ends.
        assert p.drain, p.pod
        if p.drain["deadline"]:
            assert p.drain["held_by"], p.drain
        else:
            assert p.drain["abandoned"] == 0, p.drain
    assert sum(p.drain["in_flight"] for p in replaced) > 0  # calls in flight finished
    assert sum(p.drain["handed"] for p in replaced) > 0  # sessions outlived their pods

    figures_of = result.as_dict()
    # The library fleet's targets.
    assert figures_of["corrupted_sessions"] == 0 and figures_of["hung"] == 0, figures
    assert figures_of["completion_of_reachable_pct"] >= report.TARGET_COMPLETION_PCT, figures
    assert figures_of["cross_process_resumed"] == 0, figures
    assert figures_of["same_process_lossy"] == 0, figures
    assert figures_of["forwarded_requests"] > 0, figures
    assert figures_of["sessions_handed_off"] > 0, figures
    assert figures_of["failure_causes"]["refused_before_they_ran"] == 0, figures
    assert not report.verdict([result]), report.verdict([result])
