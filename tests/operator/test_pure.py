"""Unit tests of the operator's pure modules: no cluster, no network."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp_epoch_operator.lifecycle import (
    Stage,
    address_of,
    calls_for,
    epoch_of,
    pod_event_calls,
    wanted_stage,
)
from mcp_epoch_operator.resources import (
    BUFFER_CAP,
    BUFFER_FLOOR,
    ReplicaDefaults,
    TokenSecretRef,
    buffer_events,
    build_deployment,
    build_service,
)
from mcp_epoch_operator.resync import plan_resync
from mcp_epoch_operator.status import Reachability, build_status
from mcp_epoch_operator.webhook import (
    Refusal,
    inject,
    injected,
    refusal_message,
    target_of,
    webhook_configuration,
)

DEFAULTS = ReplicaDefaults("http://epochs:8080", TokenSecretRef("rel-replica-token", "token"))
LABEL = "mcp.epochs.dev/server"
ANN = "mcp.epochs.dev/epoch"


def mcps(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mcp.epochs.dev/v1alpha1",
        "kind": "McpServer",
        "metadata": {"name": "echo", "namespace": "ns", "uid": "u-1", "generation": 3},
        "spec": {"image": "img:1"} | spec,
    }


def env_map(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# ------------------------------------------------------------------------------ resources


def test_buffer_is_window_times_rate_with_floor_and_cap() -> None:
    assert buffer_events(30, 100) == 3000
    assert buffer_events(1, 1) == BUFFER_FLOOR
    assert buffer_events(86400, 1_000_000) == BUFFER_CAP
    assert buffer_events(None, None) == 3000
    assert buffer_events(2.5, 101) == BUFFER_FLOOR  # 252.5 rounds up to 253, below the floor
    assert buffer_events(2.5, 1001) == 2503


@given(st.integers(1, 86400), st.integers(1, 10**6))
def test_buffer_always_within_bounds(window: int, rate: int) -> None:
    size = buffer_events(window, rate)
    assert BUFFER_FLOOR <= size <= BUFFER_CAP
    assert size >= min(window * rate, BUFFER_CAP)


def test_deployment_shape() -> None:
    dep = build_deployment(
        mcps(
            replicas=4,
            port=9000,
            args=["--x"],
            env=[{"name": "A", "value": "1"}],
            podLabels={"team": "t"},
            podAnnotations={"a": "b"},
            resumption={"reconnectWindowSeconds": 10, "eventsPerSecond": 50},
            rollingUpdate={"maxSurge": "50%"},
        ),
        DEFAULTS,
    )
    assert dep["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert dep["metadata"]["ownerReferences"][0]["controller"] is True
    assert dep["spec"]["replicas"] == 4
    assert dep["spec"]["selector"] == {"matchLabels": {LABEL: "echo"}}
    template = dep["spec"]["template"]
    assert template["metadata"]["labels"] == {"team": "t", LABEL: "echo"}
    assert template["metadata"]["annotations"] == {"a": "b"}
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": "50%", "maxUnavailable": 0}
    container = template["spec"]["containers"][0]
    assert container["args"] == ["--x"]
    assert container["ports"][0]["containerPort"] == 9000
    env = env_map(container)
    assert env["A"] == "1"
    assert env["MCP_SERVER_NAME"] == "echo"
    assert env["MCP_RESUME_BUFFER_EVENTS"] == "500"  # 10 s x 50/s
    assert env["MCP_EPOCH_SERVICE_URL"] == "http://epochs:8080"
    assert env["MCP_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["MCP_POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["MCP_SERVER_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["MCP_EPOCH_SERVICE_TOKEN"] == {
        "secretKeyRef": {"name": "rel-replica-token", "key": "token"}
    }
    assert "MCP_EPOCH" not in env  # the webhook's job, per pod
    # The drain defaults: preStop sleep, drain deadline, a grace period covering both.
    assert container["lifecycle"] == {"preStop": {"sleep": {"seconds": 3}}}
    assert env["MCP_EPOCH_DRAIN_SECONDS"] == "25"
    assert env["MCP_EPOCH_HANDOFF"] == "on"  # sessions outlive their process by default
    assert template["spec"]["terminationGracePeriodSeconds"] == 3 + 25 + 5
    assert dep["spec"]["minReadySeconds"] == 3


def test_drain_comes_from_the_spec_and_an_explicit_grace_period_wins() -> None:
    dep = build_deployment(
        mcps(drain={"seconds": 40, "preStopSeconds": 0, "minReadySeconds": 10}), DEFAULTS
    )
    container = dep["spec"]["template"]["spec"]["containers"][0]
    assert "lifecycle" not in container  # no preStop wait asked for
    assert env_map(container)["MCP_EPOCH_DRAIN_SECONDS"] == "40"
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    assert dep["spec"]["minReadySeconds"] == 10
    explicit = build_deployment(mcps(terminationGracePeriodSeconds=7), DEFAULTS)
    pod_spec = explicit["spec"]["template"]["spec"]
    assert pod_spec["terminationGracePeriodSeconds"] == 7
    # The API server wants the preStop sleep shorter than the grace period; the drain fits.
    assert pod_spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"] == 3
    assert env_map(pod_spec["containers"][0])["MCP_EPOCH_DRAIN_SECONDS"] == "3"
    tiny = build_deployment(mcps(terminationGracePeriodSeconds=1), DEFAULTS)
    container = tiny["spec"]["template"]["spec"]["containers"][0]
    assert "lifecycle" not in container
    assert env_map(container)["MCP_EPOCH_DRAIN_SECONDS"] == "0"


def test_a_server_opts_out_of_the_handoff_in_its_spec() -> None:
    dep = build_deployment(mcps(drain={"handoff": False}), DEFAULTS)
    assert env_map(dep["spec"]["template"]["spec"]["containers"][0])["MCP_EPOCH_HANDOFF"] == "off"
    # An explicit grace period shortens the drain but keeps the choice.
    short = build_deployment(
        mcps(drain={"handoff": False}, terminationGracePeriodSeconds=7), DEFAULTS
    )
    assert env_map(short["spec"]["template"]["spec"]["containers"][0])["MCP_EPOCH_HANDOFF"] == "off"


def test_readiness_probe_is_the_library_readyz_unless_the_spec_gives_one() -> None:
    container = build_deployment(mcps(), DEFAULTS)["spec"]["template"]["spec"]["containers"][0]
    probe = container["readinessProbe"]
    # The named port, so a spec.port change moves the probe with it.
    assert probe["httpGet"] == {"path": "/readyz", "port": "mcp"}
    assert container["ports"][0]["name"] == "mcp"
    own = {"httpGet": {"path": "/app/readyz", "port": 9000}, "periodSeconds": 5}
    container = build_deployment(mcps(readinessProbe=own), DEFAULTS)["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert container["readinessProbe"] == own


def test_token_secret_from_the_spec_wins_and_none_means_no_token() -> None:
    spec = {"epochService": {"tokenSecretRef": {"name": "mine", "key": "k"}}}
    env = env_map(
        build_deployment(mcps(**spec), DEFAULTS)["spec"]["template"]["spec"]["containers"][0]
    )
    assert env["MCP_EPOCH_SERVICE_TOKEN"] == {"secretKeyRef": {"name": "mine", "key": "k"}}
    bare = ReplicaDefaults("http://e")
    env = env_map(build_deployment(mcps(), bare)["spec"]["template"]["spec"]["containers"][0])
    assert "MCP_EPOCH_SERVICE_TOKEN" not in env


def test_pod_labels_cannot_take_over_the_server_label() -> None:
    dep = build_deployment(mcps(podLabels={LABEL: "other"}), DEFAULTS)
    assert dep["spec"]["template"]["metadata"]["labels"][LABEL] == "echo"


def test_service_shape() -> None:
    svc = build_service(mcps(port=9000, path="/rpc"))
    assert svc["spec"]["selector"] == {LABEL: "echo"}
    assert svc["spec"]["ports"] == [
        {"name": "mcp", "port": 9000, "targetPort": "mcp", "protocol": "TCP"}
    ]
    assert svc["metadata"]["annotations"]["mcp.epochs.dev/path"] == "/rpc"


# ------------------------------------------------------------------------------ webhook


def admission(labels: dict[str, str] | None, uid: str = "req-1", ns: str = "ns") -> dict[str, Any]:
    return {
        "uid": uid,
        "namespace": ns,
        "object": {
            "metadata": {"generateName": "echo-abc-", "labels": labels or {}},
            "spec": {
                "initContainers": [{"name": "init", "image": "i"}],
                "containers": [
                    {
                        "name": "a",
                        "image": "a",
                        "env": [{"name": "MCP_EPOCH", "value": "copied-1"}],
                    },
                    {"name": "b", "image": "b", "env": [{"name": "MCP_SERVER_NAME", "value": "x"}]},
                ],
            },
        },
    }


def test_target_of_labelled_and_unlabelled_pods() -> None:
    target = target_of(admission({LABEL: "echo"}))
    assert target is not None
    assert (target.namespace, target.server, target.request_uid) == ("ns", "echo", "req-1")
    assert target_of(admission({"app": "x"})) is None


@pytest.mark.parametrize("value", ["Echo", "a_b", "x" * 64, "-a", ""])
def test_server_label_must_be_a_dns_label(value: str) -> None:
    with pytest.raises(Refusal, match="DNS-1123 label"):
        target_of(admission({LABEL: value}))


def test_inject_sets_epoch_everywhere_and_keeps_the_original() -> None:
    pod = admission({LABEL: "echo"})["object"]
    original = copy.deepcopy(pod)
    out = injected(pod, "0123abcd-7", "echo", DEFAULTS)
    assert pod == original
    assert out["metadata"]["annotations"] == {ANN: "0123abcd-7"}
    for container in out["spec"]["initContainers"] + out["spec"]["containers"]:
        env = env_map(container)
        assert env["MCP_EPOCH"] == "0123abcd-7"
        assert [e["name"] for e in container["env"]].count("MCP_EPOCH") == 1
        assert env["MCP_RESUME_BUFFER_EVENTS"] == "3000"
        assert env["MCP_EPOCH_SERVICE_URL"] == "http://epochs:8080"
    # A variable the manifest sets is kept (except MCP_EPOCH, which is always this pod's).
    assert env_map(out["spec"]["containers"][1])["MCP_SERVER_NAME"] == "x"
    assert env_map(out["spec"]["containers"][0])["MCP_SERVER_NAME"] == "echo"


def test_inject_is_idempotent_and_overwrites_an_old_annotation() -> None:
    pod = admission({LABEL: "echo"})["object"]
    pod["metadata"]["annotations"] = {ANN: "0123abcd-1", "keep": "me"}
    once = injected(pod, "0123abcd-9", "echo", DEFAULTS)
    twice = injected(once, "0123abcd-9", "echo", DEFAULTS)
    assert once == twice
    assert once["metadata"]["annotations"] == {ANN: "0123abcd-9", "keep": "me"}


PROJECTED = ReplicaDefaults("http://epochs:8080")  # the default: a projected token per pod


def test_inject_mounts_the_pods_own_token_for_the_epoch_service() -> None:
    pod = admission({LABEL: "echo"})["object"]
    pod["spec"]["containers"][1]["env"] = [
        {"name": "MCP_EPOCH_SERVICE_TOKEN", "value": "static"}  # an explicit static token
    ]
    pod["spec"]["volumes"] = [{"name": "mcp-epoch-token", "emptyDir": {}}]  # a copied pod's
    once = injected(pod, "0123abcd-3", "echo", PROJECTED)
    assert injected(once, "0123abcd-3", "echo", PROJECTED) == once
    (volume,) = [v for v in once["spec"]["volumes"] if v["name"] == "mcp-epoch-token"]
    (source,) = volume["projected"]["sources"]
    assert source["serviceAccountToken"] == {
        "audience": "mcp-epoch",
        "expirationSeconds": 3600,
        "path": "token",
    }
    main = once["spec"]["containers"][0]
    assert env_map(main)["MCP_EPOCH_SERVICE_TOKEN_FILE"] == "/var/run/secrets/mcp.epochs.dev/token"
    assert "MCP_EPOCH_SERVICE_TOKEN" not in env_map(main)
    assert main["volumeMounts"] == [
        {
            "name": "mcp-epoch-token",
            "mountPath": "/var/run/secrets/mcp.epochs.dev",
            "readOnly": True,
        }
    ]
    static = once["spec"]["containers"][1]
    assert "MCP_EPOCH_SERVICE_TOKEN_FILE" not in env_map(static)
    assert "volumeMounts" not in static
    # Static tokens by Secret: no projected token at all.
    plain = injected(pod, "0123abcd-3", "echo", DEFAULTS)
    assert all(v.get("projected") is None for v in plain["spec"].get("volumes", []))


def test_plain_pods_size_the_buffer_from_annotations() -> None:
    pod = admission({LABEL: "echo"})["object"]
    pod["metadata"]["annotations"] = {
        "mcp.epochs.dev/reconnect-window-seconds": "120",
        "mcp.epochs.dev/events-per-second": "bogus",
    }
    inject(pod, "0123abcd-2", "echo", DEFAULTS)
    assert env_map(pod["spec"]["containers"][0])["MCP_RESUME_BUFFER_EVENTS"] == "12000"


def test_plain_pods_opt_out_of_the_handoff_by_annotation() -> None:
    pod = admission({LABEL: "echo"})["object"]
    inject(pod, "0123abcd-2", "echo", DEFAULTS)
    assert env_map(pod["spec"]["containers"][0])["MCP_EPOCH_HANDOFF"] == "on"
    pod = admission({LABEL: "echo"})["object"]
    pod["metadata"]["annotations"] = {"mcp.epochs.dev/handoff": "Off"}
    inject(pod, "0123abcd-2", "echo", DEFAULTS)
    assert env_map(pod["spec"]["containers"][0])["MCP_EPOCH_HANDOFF"] == "off"
    # A container that sets it itself keeps its own value.
    pod = admission({LABEL: "echo"})["object"]
    pod["spec"]["containers"][0]["env"] = [{"name": "MCP_EPOCH_HANDOFF", "value": "off"}]
    inject(pod, "0123abcd-2", "echo", DEFAULTS)
    assert env_map(pod["spec"]["containers"][0])["MCP_EPOCH_HANDOFF"] == "off"


def test_refusal_message_says_what_why_and_what_to_do() -> None:
    target = target_of(admission({LABEL: "echo"}))
    assert target is not None
    text = refusal_message(target, "http://epochs:8080", "ConnectError")
    assert "ns/echo" in text and "http://epochs:8080" in text and "ConnectError" in text
    assert "refused" in text and "--epoch-service-url" in text


def test_webhook_configuration_contract() -> None:
    cfg = webhook_configuration(
        "mcp-epoch", url="https://127.0.0.1:9443", ca_bundle=b"PEM", excluded_namespaces=["ops"]
    )
    hook = cfg["webhooks"][0]
    assert hook["clientConfig"] == {
        "url": "https://127.0.0.1:9443/inject-epoch",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    assert hook["objectSelector"] == {"matchExpressions": [{"key": LABEL, "operator": "Exists"}]}
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["ops"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["timeoutSeconds"] == 5
    assert hook["rules"][0]["operations"] == ["CREATE"]
    scoped = webhook_configuration(
        "x", url="https://h", ca_bundle=b"", excluded_namespaces=["s"], included_namespaces=["a"]
    )
    rules = scoped["webhooks"][0]["namespaceSelector"]["matchExpressions"]
    assert [(r["operator"], r["values"]) for r in rules] == [("NotIn", ["s"]), ("In", ["a"])]
    svc = webhook_configuration(
        "x",
        service={"name": "op", "namespace": "sys", "port": 443},
        ca_bundle=b"",
        excluded_namespaces=[],
    )
    assert svc["webhooks"][0]["clientConfig"]["service"]["path"] == "/inject-epoch"


# ------------------------------------------------------------------------------ lifecycle


def pod(
    name: str,
    uid: str,
    epoch: str | None,
    *,
    deleting: bool = False,
    phase: str = "Running",
    ready: bool = True,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid, "labels": {LABEL: "echo"}}
    if epoch:
        meta["annotations"] = {ANN: epoch}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": meta, "status": {"phase": phase, "conditions": conditions}}


def test_epoch_of_ignores_pods_without_or_with_bad_annotations() -> None:
    assert epoch_of(pod("p", "u", None)) is None
    assert epoch_of(pod("p", "u", "not-an-epoch")) is None
    ref = epoch_of(pod("p", "u", "0123abcd-5"))
    assert ref is not None and (ref.epoch, ref.pod_uid, ref.server) == ("0123abcd-5", "u", "echo")


def test_stages() -> None:
    assert wanted_stage(pod("p", "u", "0123abcd-1"), deleted=False) is Stage.BOUND
    assert wanted_stage(pod("p", "u", "0123abcd-1", deleting=True), deleted=False) is Stage.DRAINING
    assert wanted_stage(pod("p", "u", "0123abcd-1", phase="Failed"), deleted=False) is Stage.RETIRED
    assert wanted_stage(pod("p", "u", "0123abcd-1"), deleted=True) is Stage.RETIRED


def test_every_step_is_preceded_by_a_bind_and_done_steps_are_skipped() -> None:
    p = pod("p", "u", "0123abcd-1", deleting=True)
    _, stage, calls = pod_event_calls("MODIFIED", p)
    assert stage is Stage.DRAINING
    assert [c.verb for c in calls] == ["bind", "drain"]
    assert pod_event_calls("MODIFIED", p, done=Stage.DRAINING)[2] == []
    _, _, calls = pod_event_calls("DELETED", p, done=Stage.DRAINING)
    assert [c.verb for c in calls] == ["bind", "retire"]
    ref = epoch_of(p)
    assert ref is not None
    assert calls_for(ref, Stage.BOUND, done=Stage.RETIRED) == []


def test_the_address_is_the_pod_ip_and_its_mcp_port() -> None:
    p = pod("p", "u", "0123abcd-1")
    assert address_of(p) is None  # no IP yet
    p["status"]["podIP"] = "10.1.2.3"
    assert address_of(p) is None  # and no port
    p["spec"] = {
        "containers": [{"ports": [{"containerPort": 9090}, {"name": "mcp", "containerPort": 8080}]}]
    }
    assert address_of(p) == "10.1.2.3:8080"  # the port named mcp
    del p["spec"]["containers"][0]["ports"][1]
    assert address_of(p) == "10.1.2.3:9090"  # else the first
    p["metadata"]["annotations"]["mcp.epochs.dev/port"] = "7000"
    assert address_of(p) == "10.1.2.3:7000"  # the annotation wins
    p["status"]["podIP"] = "fd00::3"
    assert address_of(p) == "[fd00::3]:7000"


def test_a_live_pod_is_bound_again_once_its_address_is_known() -> None:
    p = pod("p", "u", "0123abcd-1")
    p["spec"] = {"containers": [{"ports": [{"name": "mcp", "containerPort": 8080}]}]}
    _, _, calls = pod_event_calls("ADDED", p)
    assert [(c.verb, c.address) for c in calls] == [("bind", None)]
    assert pod_event_calls("MODIFIED", p, done=Stage.BOUND)[2] == []
    p["status"]["podIP"] = "10.0.0.9"
    _, _, calls = pod_event_calls("MODIFIED", p, done=Stage.BOUND)
    assert [(c.verb, c.address) for c in calls] == [("bind", "10.0.0.9:8080")]
    again = pod_event_calls("MODIFIED", p, done=Stage.BOUND, bound_address="10.0.0.9:8080")
    assert again[2] == []


# ------------------------------------------------------------------------------ resync


def entry(gen: int, state: str, uid: str | None = None) -> dict[str, Any]:
    return {
        "epoch": f"0123abcd-{gen}",
        "generation": gen,
        "state": state,
        "pod_name": f"pod-{uid}" if uid else None,
        "pod_uid": uid,
    }


def test_resync_retires_epochs_of_vanished_pods_and_binds_unseen_ones() -> None:
    ledger = [
        entry(1, "live", "gone"),
        entry(2, "draining", "gone-too"),
        entry(3, "pending"),
        entry(4, "pending"),
        entry(5, "live", "here"),
        entry(6, "retired", "old"),
    ]
    pods = [pod("here", "here", "0123abcd-5"), pod("new", "new", "0123abcd-3")]
    plan = plan_resync(ledger, pods)
    assert [(c.verb, c.epoch) for c in plan.calls] == [
        ("retire", "0123abcd-1"),
        ("retire", "0123abcd-2"),
        ("bind", "0123abcd-3"),
    ]
    assert plan.pending_without_pod == ["0123abcd-4"]
    assert plan.retired == ["0123abcd-1", "0123abcd-2"]


def test_resync_drains_deleting_pods_and_reports_unknown_epochs() -> None:
    ledger = [entry(1, "live", "a"), entry(2, "draining", "b")]
    pods = [
        pod("a", "a", "0123abcd-1", deleting=True),
        pod("b", "b", "0123abcd-2", deleting=True),
        pod("c", "c", "ffffffff-9"),
    ]
    plan = plan_resync(ledger, pods)
    assert [(c.verb, c.epoch) for c in plan.calls] == [("drain", "0123abcd-1")]
    assert plan.unknown_pod_epochs == ["ffffffff-9"]


def test_resync_never_retires_a_pod_that_exists() -> None:
    ledger = [entry(1, "live", "a")]
    plan = plan_resync(ledger, [pod("a", "a", "0123abcd-1")])
    assert plan.calls == []


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["pending", "live", "draining", "retired", "abandoned"]), st.booleans()
        ),
        max_size=12,
    )
)
def test_resync_retires_exactly_the_bound_epochs_whose_pod_is_gone(
    rows: list[tuple[str, bool]],
) -> None:
    ledger, pods = [], []
    for gen, (state, exists) in enumerate(rows, start=1):
        uid = None if state == "pending" else f"u{gen}"
        ledger.append(entry(gen, state, uid))
        if exists:
            pods.append(pod(f"p{gen}", uid or f"u{gen}", f"0123abcd-{gen}"))
    plan = plan_resync(ledger, pods)
    retired = {c.epoch for c in plan.calls if c.verb == "retire"}
    expected = {
        f"0123abcd-{gen}"
        for gen, (state, exists) in enumerate(rows, start=1)
        if state in ("live", "draining") and not exists
    }
    assert retired == expected
    for call in plan.calls:
        if call.verb == "bind":
            # binds only happen for pending epochs whose pod exists
            gen = int(call.epoch.rsplit("-", 1)[1])
            assert rows[gen - 1] == ("pending", True)


# ------------------------------------------------------------------------------ status


def test_status_lists_live_epochs_and_reports_conditions() -> None:
    server = mcps(replicas=2)
    deployment = {
        "metadata": {"name": "echo", "generation": 2},
        "status": {
            "observedGeneration": 2,
            "replicas": 2,
            "readyReplicas": 2,
            "updatedReplicas": 2,
        },
    }
    ledger = [entry(1, "retired", "x"), entry(2, "live", "a"), entry(3, "live", "b")]
    pods = [pod("a", "a", "0123abcd-2"), pod("b", "b", "0123abcd-3")]
    status = build_status(
        server, deployment, ledger, pods, Reachability(True, "http://e"), now="T0"
    )
    assert status["newestGeneration"] == 3
    assert [e["epoch"] for e in status["epochs"]] == ["0123abcd-3", "0123abcd-2"]
    assert status["selector"] == f"{LABEL}=echo"
    assert status["observedGeneration"] == 3
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "True"
    assert conds["Progressing"]["status"] == "False"
    assert conds["EpochServiceReachable"]["status"] == "True"

    # Unreachable: the condition flips with a message naming the URL; the epochs stay listed.
    server["status"] = status
    later = build_status(
        server, deployment, None, pods, Reachability(False, "http://e", "ConnectError"), now="T1"
    )
    conds = {c["type"]: c for c in later["conditions"]}
    assert conds["EpochServiceReachable"]["status"] == "False"
    assert "http://e" in conds["EpochServiceReachable"]["message"]
    assert conds["EpochServiceReachable"]["lastTransitionTime"] == "T1"
    assert conds["Ready"]["lastTransitionTime"] == "T0"  # unchanged status keeps its time
    assert later["epochs"] == status["epochs"]


def test_status_not_ready_when_a_ready_pod_has_no_live_epoch() -> None:
    deployment = {
        "metadata": {"name": "echo", "generation": 1},
        "status": {
            "observedGeneration": 1,
            "replicas": 1,
            "readyReplicas": 1,
            "updatedReplicas": 1,
        },
    }
    status = build_status(
        mcps(replicas=1),
        deployment,
        [entry(1, "pending")],
        [pod("a", "a", "0123abcd-1")],
        Reachability(True, "http://e"),
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (
        ready["status"] == "False"
        and ready["reason"] == "EpochsNotLive"
        and "a" in ready["message"]
    )
