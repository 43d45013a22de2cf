"""``mcp-epoch status``, without a cluster: the pure builder and both renderings, fed what the
API server and the epoch service answer (the ledger and the ring are built with the API's own
models, so their shapes are the wire's), and where the command finds the service and the
operator's credential in the chart's own operator Deployment (rendered by the pinned helm).

The command against a real control plane, operator and service: tests/e2e/test_status_cluster.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from typing import Any

import pytest
from mcp_epoch_operator.status_cmd import locate, model, render
from mcp_epoch_operator.status_cmd.gather import parse_metrics

from mcp_epoch import api
from mcp_epoch._internal.health import Health
from tests.charts.support import Helm

NS = "shop"
SERVER = "echo"
LEDGER = "9f2c1a7e"
NOW = 1_790_000_000.0
URL = "http://r-mcp-epoch-epoch-service.mcp-epoch-system.svc:8080"
STAMP = "2026-09-21T12:00:00Z"


def pod(
    name: str, uid: str, epoch: str | None, ip: str, *, ready: bool = True, deleting: bool = False
) -> dict[str, Any]:
    """A pod of the McpServer's Deployment as the API server returns it (the fields read)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": uid,
        "creationTimestamp": f"2026-09-21T11:5{name[-1]}:00Z",
        "labels": {"mcp.epochs.dev/server": SERVER, "pod-template-hash": "6c7bf5bbcf"},
        "annotations": {"mcp.epochs.dev/epoch": epoch} if epoch else {},
    }
    if deleting:
        meta["deletionTimestamp"] = STAMP
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "containers": [{"name": "mcp", "ports": [{"name": "mcp", "containerPort": 8080}]}]
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [
                {"type": "Ready", "status": "True" if ready else "False"},
                {"type": "ContainersReady", "status": "True" if ready else "False"},
            ],
        },
    }


def epoch(
    gen: int, pod_name: str | None, uid: str | None, state: str = "live", **more: Any
) -> dict[str, Any]:
    """A ledger entry, through the API's model (the JSON the service sends)."""
    entry = api.Epoch(
        epoch=f"{LEDGER}-{gen}",
        generation=gen,
        namespace=NS,
        server=SERVER,
        state=state,  # type: ignore[arg-type]
        pod_name=pod_name,
        pod_uid=uid,
        incarnation=0 if uid else None,
        process_epoch=f"{LEDGER}-{gen}.0" if uid else None,
        revision=gen * 3,
        address=more.pop("address", f"198.18.0.{gen}:8080" if uid else None),
        created_at=NOW - 600,
        updated_at=more.pop("updated_at", NOW - 300),
        **more,
    )
    return entry.model_dump(mode="json")


def ledger(*epochs: dict[str, Any]) -> dict[str, Any]:
    return api.EpochList(
        ledger_id=LEDGER + "bade4c178ceb603533092bf0", revision=42, epochs=list(epochs)
    ).model_dump(mode="json")


def ring(phase: str = "steady", behind: tuple[str, ...] = (), **more: Any) -> dict[str, Any]:
    holders = [
        api.RingHolder(pod=p, revision=2 if p in behind else 3) for p in ("echo-a", "echo-b")
    ]
    return api.RingStatus(
        namespace=NS,
        server=SERVER,
        revision=3,
        phase=phase,
        ttl_seconds=900,
        updated_at=more.pop("updated_at", NOW - 5),
        started_at=more.pop("started_at", None),
        switched_at=None,
        drop_due=None,
        holders=holders,
        behind=list(behind),
        waiting=more.pop("waiting", None),
    ).model_dump(mode="json")


def mcpserver(**status: Any) -> dict[str, Any]:
    conditions = [
        {"type": t, "status": s, "reason": r, "message": m, "lastTransitionTime": STAMP}
        for t, s, r, m in (
            ("Ready", "True", "AllReplicasReady", "2 of 2 replicas are ready"),
            ("EpochServiceReachable", "True", "Reachable", f"epoch service at {URL} answers"),
        )
    ]
    return {
        "apiVersion": "mcp.epochs.dev/v1alpha1",
        "kind": "McpServer",
        "metadata": {"name": SERVER, "namespace": NS, "generation": 4, "uid": "u-mcps"},
        "spec": {"image": "ghcr.io/example/echo:1", "replicas": 2},
        "status": {"observedGeneration": 4, "conditions": conditions, **status},
    }


def deployment(ready: int = 2, updated: int = 2, replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": SERVER, "namespace": NS, "generation": 7},
        "spec": {
            "replicas": 2,
            "template": {"metadata": {"labels": {"mcp.epochs.dev/server": SERVER}}},
        },
        "status": {
            "observedGeneration": 7,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
        },
    }


def metrics(handed: int = 0, adopted: int = 0, registered: bool = True) -> model.PodMetrics:
    """A pod's /metrics: the replica library's own exposition, parsed as status parses it."""
    text = Health(True, False, None, 0, registered, handed=handed, adopted=adopted).metrics()
    return model.PodMetrics(parse_metrics(text.decode()))


def healthy() -> model.Gathered:
    return model.Gathered(
        namespace=NS,
        server=SERVER,
        kind="McpServer",
        mcpserver=mcpserver(),
        deployment=deployment(),
        pods=[
            pod("echo-a", "uid-a", f"{LEDGER}-1", "198.18.0.1"),
            pod("echo-b", "uid-b", f"{LEDGER}-2", "198.18.0.2"),
        ],
        service=model.ServiceRead(
            URL,
            url_source="Deployment mcp-epoch-system/r-mcp-epoch-operator",
            token_source="Secret mcp-epoch-system/r-mcp-epoch-operator-token key token",
            ledger=ledger(
                epoch(1, "echo-a", "uid-a"),
                epoch(2, "echo-b", "uid-b"),
                epoch(
                    0 + 3,
                    "echo-old",
                    "uid-old",
                    "retired",
                    successor=f"{LEDGER}-2.0",
                    successor_of=0,
                ),
            ),
            ring=ring(),
        ),
        now=NOW,
        metrics={"echo-a": metrics(adopted=3), "echo-b": metrics()},
        operator="mcp-epoch-system/r-mcp-epoch-operator",
    )


def errors(status: dict[str, Any]) -> list[str]:
    return [p["reason"] for p in status["problems"] if p["severity"] == "error"]


# ----------------------------------------------------------------------------- the builder


def test_a_healthy_server_lists_each_pod_with_its_ledger_epoch_and_nothing_to_do() -> None:
    status = model.build(healthy())
    assert status["healthy"] is True and status["problems"] == []
    rows = {r["name"]: r for r in status["pods"]}
    a = rows["echo-a"]
    assert (a["epoch"], a["epochState"], a["processEpoch"], a["incarnation"]) == (
        f"{LEDGER}-1",
        "live",
        f"{LEDGER}-1.0",
        0,
    )
    assert (a["address"], a["ringRevision"], a["sessionsAdopted"], a["registered"]) == (
        "198.18.0.1:8080",
        3,
        3,
        True,
    )
    assert status["ledger"]["revision"] == 42
    assert status["ledger"]["epochs"] == {
        "pending": 0,
        "live": 2,
        "draining": 0,
        "retired": 1,
        "abandoned": 0,
    }
    rs = status["requestState"]
    assert (rs["revision"], rs["phase"], rs["podsAtRevision"], rs["behind"], rs["stalled"]) == (
        3,
        "steady",
        2,
        [],
        False,
    )
    assert status["handoffs"]["sessionsAdopted"] == 3
    assert status["handoffs"]["recorded"] == [{"from": f"{LEDGER}-3.0", "to": f"{LEDGER}-2.0"}]
    by_type = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert by_type == {
        "Ready": ("True", "AllReplicasReady"),
        "Progressing": ("False", "Complete"),
        "EpochServiceReachable": ("True", "Reachable"),
        "RequestStateRing": ("True", "Steady"),
    }
    # The operator's condition keeps its transition time when this command agrees with it.
    assert (
        next(c for c in status["conditions"] if c["type"] == "Ready")["lastTransitionTime"] == STAMP
    )


def test_the_json_keys_are_stable_whatever_was_read() -> None:
    full = model.build(healthy())
    g = healthy()
    bare = model.build(
        replace(
            g,
            service=model.ServiceRead(URL, unreachable="ConnectError: refused"),
            metrics={},
        )
    )
    assert (
        list(full)
        == list(bare)
        == [
            "namespace",
            "server",
            "kind",
            "operator",
            "replicas",
            "epochService",
            "ledger",
            "pods",
            "epochsWithoutPod",
            "requestState",
            "handoffs",
            "conditions",
            "operatorConditions",
            "problems",
            "healthy",
        ]
    )
    assert [list(r) for r in full["pods"]] == [list(r) for r in bare["pods"]]
    assert json.loads(render.as_json(full)) == full


def test_a_stalled_rotation_is_an_error_naming_the_pods_behind() -> None:
    g = healthy()
    stalled = ring("adding", behind=("echo-b",), updated_at=NOW - 120, started_at=NOW - 130)
    status = model.build(replace(g, service=replace(g.service, ring=stalled)))
    assert status["healthy"] is False
    assert errors(status) == ["RotationStalled"]
    problem = status["problems"][0]
    assert "echo-b" in problem["message"] and "kubectl -n shop delete pod" in problem["action"]
    assert status["requestState"]["stalled"] is True
    assert status["requestState"]["behind"] == ["echo-b"]
    ring_condition = next(c for c in status["conditions"] if c["type"] == "RequestStateRing")
    assert (ring_condition["status"], ring_condition["reason"]) == ("False", "RotationStalled")
    text = render.as_text(status)
    assert "revision 3, adding: 1 of 2 pods at revision (STALLED)" in text
    assert "behind: echo-b" in text


def test_a_rotation_under_way_for_a_few_seconds_is_not_a_problem() -> None:
    g = healthy()
    moving = ring("adding", behind=("echo-b",), updated_at=NOW - 3, waiting="echo-b to load it")
    status = model.build(replace(g, service=replace(g.service, ring=moving)))
    assert status["healthy"] is True and status["problems"] == []
    assert "waiting for: echo-b to load it" in render.as_text(status)


def test_an_unreachable_service_still_shows_the_cluster_and_says_how_to_reach_it() -> None:
    g = healthy()
    why = "ConnectError: [Errno -2] Name or service not known"
    hint = locate.port_forward_hint(URL)
    status = model.build(
        replace(g, service=model.ServiceRead(URL, unreachable=why, hint=hint), metrics={})
    )
    assert errors(status) == ["EpochServiceUnreachable"]
    assert status["ledger"] is None and status["requestState"] is None
    assert [r["epoch"] for r in status["pods"]] == [f"{LEDGER}-1", f"{LEDGER}-2"]
    assert status["epochService"]["reachable"] is False
    text = render.as_text(status, width=1000)
    line = next(ln for ln in text.splitlines() if "unreachable at" in ln)
    assert line.strip() == (
        f"ERROR   epoch service unreachable at {URL}: {why}; from outside the cluster, run "
        "`kubectl -n mcp-epoch-system port-forward svc/r-mcp-epoch-epoch-service 8080:8080` "
        "and pass --epoch-service-url http://127.0.0.1:8080, or run status in the operator's "
        "pod (`kubectl exec`), where that name resolves; until it answers, new pods of this "
        "server are refused admission"
    )
    assert "Ledger              not read" in text


def test_a_refused_credential_says_where_to_get_the_operators() -> None:
    g = healthy()
    refused = "403 forbidden: this call is the operator's"
    status = model.build(replace(g, service=model.ServiceRead(URL, refused=refused)))
    assert errors(status) == ["EpochServiceRefused"]
    assert "--token-file" in status["problems"][0]["action"]


def test_pods_and_ledger_epochs_that_disagree_are_each_named() -> None:
    g = healthy()
    pods = [
        pod("echo-a", "uid-a", f"{LEDGER}-1", "198.18.0.1"),
        pod("echo-c", "uid-c", None, "198.18.0.3"),  # admitted without the webhook
        pod("echo-d", "uid-d", "0badc0de-9", "198.18.0.4"),  # another ledger's epoch
        pod("echo-e", "uid-e", f"{LEDGER}-6", "198.18.0.5"),  # running, its epoch not bound
    ]
    entries = ledger(
        epoch(1, "echo-a", "uid-a"),
        epoch(2, "echo-b", "uid-b"),  # its pod is gone
        epoch(5, None, None, "pending"),  # issued ahead (the admission pool): not a problem
        epoch(6, None, None, "pending"),
    )
    status = model.build(replace(g, pods=pods, service=replace(g.service, ledger=entries)))
    assert sorted(errors(status)) == ["EpochWithoutPod", "PodWithoutEpoch", "UnknownEpoch"]
    assert [p["reason"] for p in status["problems"] if p["severity"] == "warning"] == [
        "EpochNotBound"
    ]
    assert status["epochsWithoutPod"] == [
        {
            "epoch": f"{LEDGER}-2",
            "state": "live",
            "pod": "echo-b",
            "podUID": "uid-b",
            "processEpoch": f"{LEDGER}-2.0",
            "address": "198.18.0.2:8080",
        }
    ]
    by_reason = {p["reason"]: p for p in status["problems"]}
    assert "kubectl -n shop delete pod echo-c" in by_reason["PodWithoutEpoch"]["action"]
    # Errors come first, so the screen's last line is never the one that matters most.
    assert status["problems"][-1]["severity"] == "warning"
    text = render.as_text(status)
    assert "Epochs in the ledger without a pod:" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("echo-d"))
    assert "0badc0de-9" in row and "unknown" in row


def test_a_replica_on_a_fallback_epoch_is_an_error() -> None:
    g = healthy()
    status = model.build(replace(g, metrics={**g.metrics, "echo-b": metrics(registered=False)}))
    assert errors(status) == ["FallbackEpoch"]
    assert "echo-b" in status["problems"][0]["message"]


def test_a_pod_not_ready_during_a_rollout_is_a_warning_and_outside_one_an_error() -> None:
    g = healthy()
    rolling = replace(
        g,
        deployment=deployment(ready=2, updated=1, replicas=3),
        pods=[*g.pods, pod("echo-x", "uid-x", f"{LEDGER}-4", "198.18.0.9", ready=False)],
        service=replace(
            g.service,
            ledger=ledger(
                epoch(1, "echo-a", "uid-a"),
                epoch(2, "echo-b", "uid-b"),
                epoch(4, "echo-x", "uid-x"),
            ),
        ),
    )
    status = model.build(rolling)
    # 2 ready of 2 desired: Ready; the surge pod not ready yet is part of the rollout.
    assert status["healthy"] is True and errors(status) == []
    # Outside a rollout (every pod on the current template), a pod not ready needs a look.
    not_ready = pod("echo-b", "uid-b", f"{LEDGER}-2", "198.18.0.2", ready=False)
    stuck = replace(g, deployment=deployment(ready=1), pods=[g.pods[0], not_ready])
    status = model.build(stuck)
    assert errors(status) == ["ReplicasNotReady"]
    problem = status["problems"][0]
    assert "not ready: echo-b" in problem["message"]
    assert "kubectl -n shop describe pod echo-b" in problem["action"]


def test_what_the_operator_recorded_and_this_command_cannot_see_is_shown() -> None:
    g = healthy()
    mcps = mcpserver()
    mcps["metadata"]["generation"] = 5  # the spec changed since the operator last wrote
    mcps["status"]["conditions"][1] |= {
        "status": "False",
        "reason": "Unreachable",
        "message": f"epoch service at {URL} does not answer: timeout",
    }
    status = model.build(replace(g, mcpserver=mcps))
    assert errors(status) == ["OperatorCannotReachEpochService"]
    assert [p["reason"] for p in status["problems"] if p["severity"] == "warning"] == [
        "OperatorBehind"
    ]


def test_a_plain_labelled_deployment_is_judged_like_an_mcpserver() -> None:
    g = healthy()
    status = model.build(replace(g, kind="Deployment", mcpserver=None))
    assert status["healthy"] is True and status["kind"] == "Deployment"
    assert status["replicas"]["desired"] == 2
    assert {c["type"] for c in status["conditions"]} == {"Ready", "Progressing", "RequestStateRing"}
    assert render.as_text(status).startswith("Deployment shop/echo: 2 of 2 ready")


def test_the_text_screen_has_one_row_per_pod_and_the_handoffs() -> None:
    text = render.as_text(model.build(healthy()))
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.startswith("POD "))
    assert header.split() == [
        "POD", "READY", "EPOCH", "STATE", "INC", "ADDRESS", "RING", "HANDED-OFF", "ADOPTED",
    ]  # fmt: skip
    row = next(ln for ln in lines if ln.startswith("echo-a"))
    assert row.split() == [
        "echo-a",
        "yes",
        f"{LEDGER}-1",
        "live",
        "0",
        "198.18.0.1:8080",
        "3",
        "0",
        "3",
    ]
    assert "0 handed off, 3 adopted by the 2 pods running now; 1 handoff rule in the ledger" in text
    assert f"{LEDGER}-3.0 -> {LEDGER}-2.0" in text
    assert lines[-1] == "Problems: none"


def test_parse_metrics_reads_the_replica_librarys_exposition() -> None:
    text = Health(True, False, None, 7, True, handed=2, adopted=5).metrics().decode()
    values = parse_metrics(text)
    assert values[model.HANDED_OFF] == 2 and values[model.ADOPTED] == 5
    assert values[model.REGISTERED] == 1 and values["mcp_epoch_forwarded_total"] == 7


# ----------------------------------------------------------------------------- locate


@pytest.mark.parametrize(
    ("mode", "behind"),
    [
        (
            "static",
            locate.SecretToken("mcp-epoch-system", "r-mcp-epoch-operator-token", "token"),
        ),
        (
            "kubernetes",
            locate.AccountToken("mcp-epoch-system", "r-mcp-epoch-operator", "mcp-epoch"),
        ),
    ],
)
def test_the_chart_operator_deployment_says_where_the_service_and_its_token_are(
    helm: Helm, mode: str, behind: locate.TokenSource
) -> None:
    rendered = helm.template(sets=[f"auth.mode={mode}"])
    (operator,) = [
        m
        for m in rendered
        if m["kind"] == "Deployment"
        and m["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    labels = operator["metadata"]["labels"]
    assert all(
        labels[k] == v for k, v in (p.split("=") for p in locate.OPERATOR_SELECTOR.split(","))
    )
    setup = locate.read_operator(operator)
    assert setup is not None
    assert setup.url == URL
    assert setup.tokens == (
        locate.FileToken("/var/run/secrets/mcp-epoch/operator-token/token"),
        behind,
    )


def test_a_cluster_internal_url_gets_a_port_forward_and_others_none() -> None:
    hint = locate.port_forward_hint(URL)
    assert hint is not None
    assert (
        "kubectl -n mcp-epoch-system port-forward svc/r-mcp-epoch-epoch-service 8080:8080" in hint
    )
    assert locate.port_forward_hint("http://127.0.0.1:8080") is None
    assert locate.port_forward_hint("https://epochs.example.com") is None


# ----------------------------------------------------------------------------- the command


def test_without_the_operator_extra_status_says_what_to_install() -> None:
    """The operator extra's modules made unimportable in a child interpreter (``None`` in
    ``sys.modules`` is what the import system reads as "not installed"): a stand-in for a
    venv with only the base install, which tests/test_wheel.py builds for the mcp extra."""
    code = (
        "import sys\n"
        "sys.modules.update(kopf=None, kubernetes_asyncio=None)  # as if not installed\n"
        "from epochsvc.cli import main\n"
        "sys.exit(main(['status', 'echo']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "mcp-epoch status: needs the operator extra (missing: kubernetes_asyncio, kopf): "
        "pip install 'mcp-epoch[operator]'"
    )
