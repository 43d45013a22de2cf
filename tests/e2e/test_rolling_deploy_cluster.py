"""The rolling-deploy proof end to end on the loopback control plane.

Every fleet runs the demo's scenario (clients, balancer, random drops, checker, verdict:
:mod:`epochsvc.demo.scenario` and :mod:`epochsvc.demo.report`) with replicas that are pods of
an ``McpServer``: the operator and its webhook give every pod an epoch from a real epoch
service, the pod runner starts a local process per Running pod with that pod's environment,
and the rolling deploy is ``kubectl rollout restart`` of the operator's Deployment.

Every fleet goes through Kubernetes: the naive fleet is the same ``McpServer`` with ``--kind
naive`` (its replicas ignore ``MCP_EPOCH``), and the mcp-epoch servers run twice, once with
``EpochClient`` and once with the plain SDK client. So the rollout, the pod timing and the
balancer are identical and the figures differ only by what mcp-epoch adds. Pods are stopped as
a kubelet stops them (preStop, SIGTERM, SIGKILL at the end of the grace period) while the
EndpointSlice controller takes them out of the balancer, concurrently; requests of a session
whose owner is still alive reach it at its pod IP, which the operator wrote to the ledger.

Where the figures are: the table is printed (``-rA``/``-s``, and in the report of a failure),
written by tests/e2e/conftest.py in a terminal-summary section at the end of every run, kept
as ``summary.json`` in the test's tmp dir and as the ``figures`` property (JUnit XML).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest

from epochsvc.demo import report
from epochsvc.demo.scenario import FLEETS, FleetName, FleetResult, ScenarioConfig, run_fleet
from mcp_epoch import api
from tests.e2e.kube_fleet import DuringDeploy, KubeFleets, KubernetesFleet
from tests.e2e.podrunner import KubeAccess, PodProcess
from tests.operator.support import OperatorProcess, ledger_states, wait_for
from tests.support.epochsvc_proc import EpochServiceProcess

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.filterwarnings("ignore:.*removed as of 2026-07-28"),
]

#: Small enough for two cores in about a minute per fleet, sharp enough that the naive fleet
#: fails every run: 16 clients, 3 replicas, a rollout paced at 2 s per pod mid-traffic.
CONFIG = ScenarioConfig(
    clients=16,
    replicas=3,
    duration=14.0,
    seed=11,
    drop_every=8.0,
    warm=4.0,
    cool=3.0,
    deploy_pause=2.0,
)


FLEET_NAMES: tuple[FleetName, ...] = ("naive", "plain", "epoch")


def _generation(epoch: str) -> int:
    return int(epoch.split(".", 1)[0].rsplit("-", 1)[1])


def _deploy_lines(fleets: KubeFleets, results: list[FleetResult]) -> list[str]:
    """How each rollout went, which pods ran with which epoch, why resumptions were refused."""
    lines = []
    for result, fleet in zip(results, fleets.fleets, strict=True):
        lines.append(
            f"{result.kind} fleet: McpServer {fleet.namespace}/{fleet.name}; kubectl rollout "
            f"restart took {fleet.deploy_seconds or 0:.1f}s, fewest replicas serving during "
            f"it: {fleet.min_serving_during_deploy}; rejection reasons: "
            f"{result.reasons or '-'}"
        )
        for p in fleet.pods():
            epoch = p.process_epoch or f"counter ids; pod epoch {p.env_epoch} ignored"
            lines.append(f"  pod {p.pod}: {epoch}")
    return lines


def _check_kubernetes_path(
    fleet: KubernetesFleet, service: EpochServiceProcess, replicas: int
) -> None:
    """The replicas really were the cluster's pods, with the epochs the cluster gave them."""
    pods = fleet.pods()
    # The first replicas, then one new pod per old one from the rollout; nothing failed to start.
    assert len(pods) == 2 * replicas, [p.pod for p in pods]
    assert not fleet.runner.errors, fleet.runner.errors
    for p in pods:
        assert p.annotated_epoch, f"{p.pod}: the webhook did not annotate it"
        assert p.env_epoch == p.annotated_epoch, (p.pod, p.env_epoch, p.annotated_epoch)
        assert p.stopped_at is not None, f"{p.pod}: never stopped"
    first, second = pods[:replicas], pods[replicas:]
    assert min(_generation(p.env_epoch) for p in second) > max(
        _generation(p.env_epoch) for p in first
    )
    assert {p.uid for p in first}.isdisjoint(p.uid for p in second)
    # Replaced one at a time with no capacity lost (maxUnavailable 0): an old pod is stopped
    # only once its replacement's readiness probe passed, which is after it serves.
    assert fleet.min_serving_during_deploy is not None
    assert fleet.min_serving_during_deploy >= replicas
    if fleet.kind == "naive":
        assert all(p.process_epoch == "" for p in pods)  # counter ids: MCP_EPOCH ignored
        return
    for p in pods:
        # The process registered an incarnation of its pod's epoch (not a fallback epoch).
        assert p.process_epoch.startswith(p.env_epoch + "."), (p.pod, p.process_epoch)
        assert service.send(api.get_epoch(p.process_epoch)).pod_uid == p.uid, p.process_epoch
    # The operator retired the epochs of the pods the rollout replaced.
    old = {p.env_epoch for p in first}
    wait_for(
        lambda: all(
            ledger_states(service, fleet.namespace, fleet.name).get(e) == "retired" for e in old
        ),
        30,
        "the replaced pods' epochs to be retired",
    )


def _log(line: str) -> None:
    print(line, flush=True)


def _kube_fleets(
    access: KubeAccess,
    namespace: str,
    workdir: Path,
    service: EpochServiceProcess,
    during_deploy: DuringDeploy | None = None,
) -> KubeFleets:
    """The scenario's fleets as McpServers of this package's operator (the SDK's and the
    service's own logging quieted: the figures are the output)."""
    for noisy in ("mcp", "epochsvc", "httpx"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    return KubeFleets(
        access,
        namespace,
        workdir,
        replica_token=service.replica_token,
        buffer_events=CONFIG.buffer_events,
        min_ready=math.ceil(CONFIG.deploy_pause),
        log=_log,
        during_deploy=during_deploy,
    )


def test_rolling_deploy_on_kubernetes_naive_fails_mcp_epoch_holds(
    e2e_operator: OperatorProcess,
    e2e_service: EpochServiceProcess,
    kube_access: KubeAccess,
    demo_namespace: str,
    keep_figures: list[tuple[str, str]],
    record_property: Callable[[str, object], None],
    tmp_path: Path,
) -> None:
    fleets = _kube_fleets(kube_access, demo_namespace, tmp_path, e2e_service)
    results: list[FleetResult] = []
    for kind in FLEET_NAMES:
        _log(f"[{FLEETS[kind].title} on Kubernetes]")
        dump = tmp_path / f"calls-{kind}.jsonl"
        results.append(asyncio.run(run_fleet(kind, CONFIG, fleets, _log, dump)))

    failed = report.verdict(results)
    figures = "\n".join(
        [
            report.table(results),
            "",
            *_deploy_lines(fleets, results),
            "",
            *(f"FAILED: {line}" for line in failed),
            *(["OK: naive fleet failed as expected; mcp-epoch fleets held."] if not failed else []),
            f"(calls and per-pod logs: {tmp_path})",
        ]
    )
    print("\n" + figures)
    keep_figures.append(("rolling deploy on Kubernetes: naive vs mcp-epoch fleets", figures))
    summary = report.summary(results, {**asdict(CONFIG), "fleets": list(FLEET_NAMES)}, failed)
    (tmp_path / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    record_property("figures", json.dumps(summary["fleets"]))

    for fleet in fleets.fleets:
        _check_kubernetes_path(fleet, e2e_service, CONFIG.replicas)

    naive, plain, epoch = (r.as_dict() for r in results)
    # The naive fleet shows the failure, or the scenario proves nothing.
    assert naive["corrupted_sessions"] > 0 and naive["hung"] > 0, figures
    # EpochClient: the targets of a seamless deploy.
    assert epoch["corrupted_sessions"] == 0 and epoch["hung"] == 0, figures
    assert epoch["completion_of_reachable_pct"] >= report.TARGET_COMPLETION_PCT, figures
    assert epoch["cross_process_resumed"] == 0 and epoch["same_process_lossy"] == 0, figures
    assert epoch["forwarded_requests"] > 0, figures  # owners alive elsewhere were reached
    # Plain SDK clients: nothing foreign, missing or hung; no rejection for a live owner.
    assert plain["foreign"] == 0 and plain["missing"] == 0 and plain["hung"] == 0, figures
    # Sessions outlive their process: the drained pods handed their sessions on, and no call
    # of a plain SDK client was refused before it ran (the 404 real clients handle badly).
    for figures_of in (plain, epoch):
        assert figures_of["sessions_handed_off"] > 0, figures
        assert figures_of["failure_causes"]["refused_before_they_ran"] == 0, figures
    for figures_of in (plain, epoch):
        reasons = figures_of["rejection_reasons"]
        assert not any(reasons.get(r) for r in report.AVOIDABLE), figures
    assert not failed, figures


async def _kill_a_draining_pod(fleet: KubernetesFleet) -> None:
    """SIGKILL the process of the first pod the rollout deletes, as its drain begins (as the
    OOM killer or a lost node would): it hands nothing more on, and whatever it still held is
    gone for real. The kill follows the runner's SIGTERM, not a clock: a drain can end within
    half a second, and a kill timed after the preStop hook once found the process gone."""

    def draining() -> list[PodProcess]:
        return [
            p
            for p in fleet.pods()
            if p.deleted and p.alive is not None and p.alive.returncode is None
        ]

    await fleet.runner.wait_until(lambda: bool(draining()), 60, "a pod of the rollout draining")
    victim = draining()[0]
    await victim.sigterm_sent.wait()  # past its preStop: its drain has begun
    if victim.alive is not None and victim.alive.returncode is None:
        os.killpg(victim.alive.pid, signal.SIGKILL)
        fleet.killed.append(victim.pod)
        print(f"  killed pod {victim.pod}'s process (SIGKILL) as its drain began")


def test_a_pod_killed_mid_rollout_loses_only_what_it_held(
    e2e_operator: OperatorProcess,
    e2e_service: EpochServiceProcess,
    kube_access: KubeAccess,
    demo_namespace: str,
    keep_figures: list[tuple[str, str]],
    tmp_path: Path,
) -> None:
    """The same rolling deploy with a data-plane fault in it: one draining pod's process is
    killed. EpochClient: nothing corrupted or hung, and every call that failed says why;
    plain SDK clients: nothing foreign or missing."""
    fleets = _kube_fleets(
        kube_access, demo_namespace, tmp_path, e2e_service, during_deploy=_kill_a_draining_pod
    )
    results: list[FleetResult] = []
    for kind in ("plain", "epoch"):
        dump = tmp_path / f"calls-{kind}.jsonl"
        results.append(asyncio.run(run_fleet(kind, CONFIG, fleets, _log, dump)))
    figures = report.table(results) + f"\n(calls and per-pod logs: {tmp_path})"
    print("\n" + figures)
    keep_figures.append(("rolling deploy with a pod killed mid-drain", figures))
    for fleet in fleets.fleets:
        assert fleet.killed, f"{fleet.name}: no pod was killed; the fault never happened"
    plain, epoch = (r.as_dict() for r in results)
    assert epoch["corrupted_sessions"] == 0 and epoch["hung"] == 0, figures
    assert plain["foreign"] == 0 and plain["missing"] == 0 and plain["hung"] == 0, figures
    # Every call that did not complete was told why: an error, a refusal, a drop, or its
    # resumption rejected (404: the killed process's cursors are gone, as a crash's are).
    for kind in ("plain", "epoch"):
        for line in (tmp_path / f"calls-{kind}.jsonl").read_text().splitlines():
            call = json.loads(line)
            if call.get("outcome") in (None, "completed"):
                continue
            rejected = bool(call["reconnects"]) and call["reconnects"][-1]["status"] == 404
            rejected = rejected or bool(call["session_refused"])
            told = call["error"] or call["refused"] or call["dropped_early"] or rejected
            assert told, (kind, call)
