"""The webhook's own HTTPS server (``mcp_epoch_operator.admission``), against a real epoch
service: the reviews are posted here the way the API server posts them. The API server is
there for the admission lease only.

What the cluster tests cannot show is here: an answer that does not wait for kopf's loop,
hostile bodies, a rotated serving certificate, and two processes, one of them relaying its
admissions to the other.
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import logging
import shutil
import ssl
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import jsonpatch
import pytest
from mcp_epoch_operator import admission, kube
from mcp_epoch_operator.admission import AdmissionServer, LoopSink
from mcp_epoch_operator.config import OperatorConfig, WebhookServing
from mcp_epoch_operator.metrics import OperatorMetrics
from mcp_epoch_operator.names import ENV_EPOCH, EPOCH_ANNOTATION, SERVER_LABEL, WEBHOOK_PATH
from mcp_epoch_operator.resources import ReplicaDefaults
from mcp_epoch_operator.runtime import Runtime

from tests.cluster import certs
from tests.cluster.harness import Cluster
from tests.operator.support import make_namespace, wait_for
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.ports import free_port

Key = tuple[str, str]
pytestmark = [pytest.mark.cluster]
#: The namespace the webhooks' admission Leases are in (each test's lease is its own).
LEASES = "admission-tests"


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


class Recorder:
    """Stands in for the operator's Runtime, recording what admissions hand over to it (the
    attributes LoopSink calls); the loop it runs on is real."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.events = self

    def mark(self, namespace: str, server: str) -> None:
        self.calls.append(("mark", namespace, server))

    def set_reachable(self, ok: bool, message: str = "") -> None:
        self.calls.append(("reachable", ok))

    def post(self, key: Key, type_: str, reason: str, message: str) -> None:
        self.calls.append(("event", key, type_, reason))

    def issued(self, key: Key, epoch: str, generation: int) -> None:
        self.calls.append(("issued", key, epoch))


class OperatorLoop:
    """A real event loop on a thread of its own, as kopf's is, that a test can block."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def block(self) -> threading.Event:
        """Stall the loop until the returned event is set."""
        release, stalled = threading.Event(), threading.Event()

        def stall() -> None:
            stalled.set()
            release.wait(30)

        self.loop.call_soon_threadsafe(stall)
        assert stalled.wait(10)
        return release

    def drain(self) -> None:
        """Return once kopf's loop has collected everything handed over before this call:
        a timer two of the sink's periods out fires after at least one collection that began
        after this call (the loop runs its timers in order)."""
        done = threading.Event()
        self.loop.call_soon_threadsafe(self.loop.call_later, 2 * admission.SINK_PERIOD, done.set)
        assert done.wait(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Webhook:
    def __init__(self, server: AdmissionServer, ca: Path, port: int) -> None:
        self.server = server
        self.url = f"https://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, verify=trusting(ca), timeout=10)

    def post(self, body: Any, path: str = WEBHOOK_PATH) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.http.post(path, content=content, headers={"Content-Type": "application/json"})

    def review(self, request: dict[str, Any]) -> dict[str, Any]:
        response = self.post(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert body["apiVersion"] == "admission.k8s.io/v1"
        assert body["kind"] == "AdmissionReview"
        assert body["response"]["uid"] == request["uid"]
        return cast(dict[str, Any], body["response"])


def pod_request(
    server: str | None = "calc",
    *,
    uid: str | None = None,
    operation: str = "CREATE",
    dry_run: bool = False,
) -> dict[str, Any]:
    labels = {SERVER_LABEL: server} if server is not None else {"app": "other"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "calc-", "namespace": "team-a", "labels": labels},
        "spec": {"containers": [{"name": "mcp", "image": "registry.invalid/calc:1"}]},
    }
    return {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": operation,
        "object": pod,
        "oldObject": None,
        "dryRun": dry_run,
    }


def patched(request: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    out: dict[str, Any] = jsonpatch.apply_patch(request["object"], ops)
    return out


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    return certs.generate(tmp_path_factory.mktemp("admission-pki"), "10.96.0.1")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EpochServiceProcess]:
    work = tmp_path_factory.mktemp("admission-epochsvc")
    with EpochServiceProcess(f"sqlite:///{work}/ledger.db", work / "epochsvc.log") as svc:
        yield svc


@pytest.fixture
def operator_loop() -> Iterator[OperatorLoop]:
    loop = OperatorLoop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def kubeconfig(k8s_cluster: Cluster) -> Iterator[None]:
    """The webhooks log in as the operator does: with the kubeconfig in the environment."""
    make_namespace(k8s_cluster, LEASES)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KUBECONFIG", str(k8s_cluster.kubeconfig))
        yield


def start_webhook(
    service: EpochServiceProcess,
    cert: Path,
    key: Path,
    ca: Path,
    loop: OperatorLoop,
    recorder: Recorder,
    metrics: OperatorMetrics,
    lease: str | None = None,
) -> Webhook:
    port = free_port()
    serving = WebhookServing(listen="127.0.0.1", port=port, cert=cert, key=key)
    config = OperatorConfig(
        namespaces=None,
        epoch_service_url=service.url,
        operator_token=service.operator_token,
        replica=ReplicaDefaults("http://epochs:8080"),
        operator_namespace=LEASES,
        webhook=serving,
        admission_lease=lease or f"admission-{uuid.uuid4().hex[:8]}",
    )
    server = AdmissionServer(
        serving, config, metrics, LoopSink(cast(Runtime, recorder), loop.loop), kube.login
    )
    server.start()
    return Webhook(server, ca, port)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def metrics() -> OperatorMetrics:
    return OperatorMetrics()


@pytest.fixture
def webhook(
    kubeconfig: None,
    pki: certs.Pki,
    service: EpochServiceProcess,
    operator_loop: OperatorLoop,
    recorder: Recorder,
    metrics: OperatorMetrics,
) -> Iterator[Webhook]:
    hook = start_webhook(
        service, pki.webhook_cert, pki.webhook_key, pki.ca_cert, operator_loop, recorder, metrics
    )
    yield hook
    hook.http.close()
    hook.server.stop()


def epoch_of(pod: dict[str, Any]) -> str:
    epoch: str = pod["metadata"]["annotations"][EPOCH_ANNOTATION]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env[ENV_EPOCH] == epoch
    return epoch


def test_a_labelled_pod_gets_its_epoch_and_a_retry_the_same_one(
    webhook: Webhook, operator_loop: OperatorLoop, recorder: Recorder, metrics: OperatorMetrics
) -> None:
    request = pod_request()
    first = webhook.review(request)
    assert first["allowed"] is True
    epoch = epoch_of(patched(request, first))
    # The API server re-sends a review it got no answer for: same UID, same epoch.
    again = webhook.review(request)
    assert epoch_of(patched(request, again)) == epoch
    other = pod_request()
    assert epoch_of(patched(other, webhook.review(other))) != epoch

    operator_loop.drain()
    assert ("mark", "team-a", "calc") in recorder.calls
    assert ("reachable", True) in recorder.calls
    assert ("issued", ("team-a", "calc"), epoch) in recorder.calls
    count = metrics.registry.get_sample_value(
        "mcp_epoch_operator_webhook_seconds_count", {"outcome": "issued"}
    )
    assert count == 3
    # The epochs came from the pool: one batch issue of 8 ahead, counted as a call to the
    # service, and the pool holds the 6 not yet handed out.
    calls = metrics.registry.get_sample_value(
        "mcp_epoch_operator_epoch_service_calls_total", {"call": "issue_batch", "outcome": "ok"}
    )
    assert calls == 1
    assert metrics.registry.get_sample_value("mcp_epoch_operator_epoch_pool_epochs") == 6
    assert metrics.registry.get_sample_value("mcp_epoch_operator_admission_lease_held") == 1


def test_the_answer_does_not_wait_for_the_operators_loop(
    webhook: Webhook, operator_loop: OperatorLoop, recorder: Recorder
) -> None:
    release = operator_loop.block()
    try:
        request = pod_request()
        response = webhook.review(request)  # answered while kopf's loop cannot run anything
        epoch_of(patched(request, response))
        assert recorder.calls == []  # what it handed over waits for the loop
    finally:
        release.set()
    operator_loop.drain()
    assert ("mark", "team-a", "calc") in recorder.calls


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param(pod_request(None), id="unlabelled"),
        pytest.param(pod_request(operation="UPDATE"), id="update"),
        pytest.param(
            {**pod_request(), "kind": {"group": "", "version": "v1", "kind": "Service"}},
            id="not-a-pod",
        ),
    ],
)
def test_pods_that_need_no_epoch_are_admitted_unchanged(
    webhook: Webhook, request_: dict[str, Any], operator_loop: OperatorLoop, recorder: Recorder
) -> None:
    response = webhook.review(request_)
    assert response == {"uid": request_["uid"], "allowed": True}
    operator_loop.drain()
    assert recorder.calls == []  # no server to reconcile, no Event, no service call


def test_a_dry_run_issues_nothing(
    webhook: Webhook, operator_loop: OperatorLoop, recorder: Recorder, metrics: OperatorMetrics
) -> None:
    response = webhook.review(pod_request(dry_run=True))
    assert response["allowed"] is True
    assert "patch" not in response
    assert "dry run" in response["warnings"][0]
    operator_loop.drain()
    assert recorder.calls == []
    calls = metrics.registry.get_sample_value(
        "mcp_epoch_operator_epoch_service_calls_total", {"call": "issue_batch", "outcome": "ok"}
    )
    assert calls is None  # the epoch service was never asked


def test_a_label_the_ledger_cannot_take_is_refused_with_why(webhook: Webhook) -> None:
    response = webhook.review(pod_request("Not_A_Label"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "DNS-1123" in response["status"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        pytest.param(b"{not json", 400, "not JSON", id="not-json"),
        pytest.param(b"\xff\xfe", 400, "not JSON", id="not-utf8"),
        pytest.param(b"[1, 2]", 400, "not an AdmissionReview", id="a-list"),
        pytest.param({"request": "x"}, 400, "not an AdmissionReview", id="request-not-object"),
        pytest.param({"request": {"uid": 7}}, 400, "no uid", id="uid-not-string"),
        pytest.param(
            b"{" + b" " * (admission.MAX_REVIEW_BYTES + 1) + b"}", 413, "", id="oversized"
        ),
    ],
)
def test_bodies_that_are_not_reviews_get_a_clear_error(
    webhook: Webhook, body: Any, status: int, says: str
) -> None:
    response = webhook.post(body)
    assert response.status_code == status
    assert says in response.text
    # ... and the server still answers the next review.
    assert webhook.review(pod_request(None))["allowed"] is True


def test_other_paths_and_methods_are_not_served(webhook: Webhook) -> None:
    assert webhook.post(pod_request(), path="/mutate").status_code == 404
    assert webhook.http.get(WEBHOOK_PATH).status_code == 405


def test_a_port_in_use_fails_start_with_the_reason(
    pki: certs.Pki,
    service: EpochServiceProcess,
    operator_loop: OperatorLoop,
    recorder: Recorder,
    metrics: OperatorMetrics,
    webhook: Webhook,
) -> None:
    port = int(webhook.url.rsplit(":", 1)[1])
    serving = WebhookServing("127.0.0.1", port, pki.webhook_cert, pki.webhook_key)
    config = OperatorConfig(
        None,
        service.url,
        service.operator_token,
        ReplicaDefaults("http://epochs:8080"),
        "mcp-epoch",
        webhook=serving,
    )
    server = AdmissionServer(
        serving, config, metrics, LoopSink(cast(Runtime, recorder), operator_loop.loop), kube.login
    )
    with pytest.raises(OSError) as info:
        server.start()
    assert info.value.errno == errno.EADDRINUSE


def _served_certificate_verifies(url: str, ca: Path) -> bool:
    """Whether a fresh TLS connection to ``url`` verifies against ``ca``."""
    try:
        with httpx.Client(verify=trusting(ca), timeout=5) as client:
            client.post(url + WEBHOOK_PATH, content=b"{}")
    except httpx.ConnectError:
        return False
    return True


def test_a_rotated_certificate_is_served_and_a_broken_one_is_not(
    kubeconfig: None,
    tmp_path: Path,
    pki: certs.Pki,
    service: EpochServiceProcess,
    operator_loop: OperatorLoop,
    recorder: Recorder,
    metrics: OperatorMetrics,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(admission, "CERT_CHECK_SECONDS", 0.05)
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.webhook_cert, cert)
    shutil.copy(pki.webhook_key, key)
    hook = start_webhook(service, cert, key, pki.ca_cert, operator_loop, recorder, metrics)
    try:
        rotated = certs.generate(tmp_path / "rotated", "10.96.0.1")
        # Half a rotation: the new certificate beside the old key. It must not be loaded.
        with caplog.at_level(logging.ERROR, logger="mcp_epoch_operator.admission"):
            shutil.copy(rotated.webhook_cert, cert)
            wait_for(lambda: "cannot be loaded" in caplog.text, 10, "the refused rotation")
        assert _served_certificate_verifies(hook.url, pki.ca_cert)  # the old pair still serves
        assert not _served_certificate_verifies(hook.url, rotated.ca_cert)
        # The rotation completes: new connections get the new certificate.
        shutil.copy(rotated.webhook_key, key)
        wait_for(
            lambda: _served_certificate_verifies(hook.url, rotated.ca_cert),
            10,
            "the rotated certificate to be served",
            interval=0.05,
        )
        assert not _served_certificate_verifies(hook.url, pki.ca_cert)
        assert webhook_answers(hook, rotated.ca_cert)
    finally:
        hook.http.close()
        hook.server.stop()


def webhook_answers(hook: Webhook, ca: Path) -> bool:
    with httpx.Client(base_url=hook.url, verify=trusting(ca), timeout=10) as client:
        request = pod_request(None)
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        return bool(client.post(WEBHOOK_PATH, json=body).json()["response"]["allowed"])


def test_two_processes_hand_out_from_one_pool_and_the_survivor_takes_over(
    kubeconfig: None,
    pki: certs.Pki,
    service: EpochServiceProcess,
    operator_loop: OperatorLoop,
    recorder: Recorder,
) -> None:
    """Admissions posted to either process get epochs from the lease holder's pool, in the
    order they completed; the holder stops (releasing the lease) and the other one goes on,
    above everything handed out before."""
    lease = f"admission-{uuid.uuid4().hex[:8]}"
    metrics = (OperatorMetrics(), OperatorMetrics())
    hooks = [
        start_webhook(
            service,
            pki.webhook_cert,
            pki.webhook_key,
            pki.ca_cert,
            operator_loop,
            recorder,
            m,
            lease,
        )
        for m in metrics
    ]
    try:
        generations = []
        for i in range(6):
            request = pod_request()
            epoch = epoch_of(patched(request, hooks[i % 2].review(request)))
            generations.append(int(epoch.rsplit("-", 1)[1]))
        assert generations == sorted(generations) and len(set(generations)) == 6
        held = [
            m.registry.get_sample_value("mcp_epoch_operator_admission_lease_held") for m in metrics
        ]
        assert sorted(held) == [0, 1], held
        holder = held.index(1)
        relayed = metrics[1 - holder].registry.get_sample_value(
            "mcp_epoch_operator_admissions_forwarded_total", {"outcome": "relayed"}
        )
        assert relayed == 3
        # A dry run needs no epoch: answered where it arrived, relayed nowhere.
        dry = pod_request(dry_run=True)
        assert hooks[1 - holder].review(dry)["allowed"] is True
        assert relayed == metrics[1 - holder].registry.get_sample_value(
            "mcp_epoch_operator_admissions_forwarded_total", {"outcome": "relayed"}
        )

        hooks[holder].http.close()
        hooks[holder].server.stop()  # releases the lease
        survivor = hooks[1 - holder]
        request = pod_request()
        after = epoch_of(patched(request, survivor.review(request)))
        assert int(after.rsplit("-", 1)[1]) > max(generations)
        assert (
            metrics[1 - holder].registry.get_sample_value("mcp_epoch_operator_admission_lease_held")
            == 1
        )
    finally:
        for hook in hooks:
            hook.http.close()
            hook.server.stop()
