"""The epoch service as a real process, driven over HTTP, on SQLite and on PostgreSQL."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import ServiceFactory
from tests.support.epochsvc_proc import EpochServiceProcess


@pytest.fixture
def svc(service_factory: ServiceFactory, database_url: str) -> EpochServiceProcess:
    return service_factory(database_url)


def issue(c: httpx.Client, server: str = "demo", uid: str | None = None) -> dict[str, object]:
    r = c.post(
        "/v1/epochs",
        json={"namespace": "default", "server": server, "request_uid": uid or str(uuid.uuid4())},
    )
    assert r.status_code == 201, r.text
    body: dict[str, object] = r.json()
    return body


def test_full_lifecycle(svc: EpochServiceProcess) -> None:
    with svc.client() as c:
        e = issue(c)
        epoch = str(e["epoch"])
        assert e["state"] == "pending" and e["generation"] == 1
        ledger = c.get("/readyz").json()["ledger_id"]
        assert epoch == f"{ledger[:8]}-1"

        r = c.post(f"/v1/epochs/{epoch}/bind", json={"pod_name": "demo-0", "pod_uid": "uid-0"})
        assert r.status_code == 200 and r.json()["state"] == "live"
        assert r.json()["pod_name"] == "demo-0" and r.json()["pod_uid"] == "uid-0"

        inc = c.post(f"/v1/epochs/{epoch}/incarnations")
        assert inc.status_code == 201
        assert inc.json()["process_epoch"] == f"{epoch}.0" and inc.json()["incarnation"] == 0
        inc = c.post(f"/v1/epochs/{epoch}/incarnations", json={"pod_uid": "uid-0"})
        assert inc.json()["process_epoch"] == f"{epoch}.1"
        # Another pod's UID is refused, and the answer never tells the bound one.
        wrong = c.post(f"/v1/epochs/{epoch}/incarnations", json={"pod_uid": "uid-x"})
        assert wrong.status_code == 409 and wrong.json()["code"] == "pod-mismatch"
        assert "uid-0" not in wrong.text
        # So is another pod's name (the Downward API gives a process both), and a refused
        # registration takes no incarnation.
        named = c.post(f"/v1/epochs/{epoch}/incarnations", json={"pod_name": "demo-9"})
        assert named.status_code == 409 and named.json()["code"] == "pod-mismatch"
        inc = c.post(f"/v1/epochs/{epoch}/incarnations", json={"pod_name": "demo-0"})
        assert inc.json()["process_epoch"] == f"{epoch}.2"

        # Only the newest incarnation counts as live; an older one was replaced by a restart.
        assert c.get(f"/v1/epochs/{epoch}.2").json()["process_state"] == "live"
        assert c.get(f"/v1/epochs/{epoch}.1").json()["process_state"] == "retired"
        assert c.get(f"/v1/epochs/{epoch}.3").status_code == 404

        assert c.post(f"/v1/epochs/{epoch}/drain").json()["state"] == "draining"
        assert c.post(f"/v1/epochs/{epoch}/retire").json()["state"] == "retired"
        listed = c.get("/v1/servers/default/demo/epochs").json()
        assert [x["state"] for x in listed["epochs"]] == ["retired"]
        assert listed["revision"] >= 6


def test_issue_is_idempotent_and_generations_increase(svc: EpochServiceProcess) -> None:
    with svc.client() as c:
        a = issue(c, uid="req-a")
        again = c.post(
            "/v1/epochs", json={"namespace": "default", "server": "demo", "request_uid": "req-a"}
        )
        assert again.status_code == 200 and again.json()["epoch"] == a["epoch"]
        b = issue(c, uid="req-b")
        assert int(str(b["generation"])) == int(str(a["generation"])) + 1
        clash = c.post(
            "/v1/epochs", json={"namespace": "default", "server": "other", "request_uid": "req-a"}
        )
        assert clash.status_code == 409 and clash.json()["code"] == "request-conflict"


def test_a_batch_issue_is_one_epoch_per_uid_each_idempotent(svc: EpochServiceProcess) -> None:
    """The operator's pool: one call, one epoch per request UID, lowest generation first; a
    repeated UID gets its epoch again, a UID of another server is a conflict, and only the
    operator may ask."""
    body = {"request_uids": ["p-1", "p-2", "p-3"]}
    url = "/v1/servers/default/pooled/epochs"
    with svc.client() as c, svc.client(svc.replica_token) as rep:
        before = issue(c, server="pooled")
        r = c.post(url, json=body)
        assert r.status_code == 200, r.text
        epochs = r.json()["epochs"]
        generations = [e["generation"] for e in epochs]
        assert generations == sorted(generations) and len(set(generations)) == 3
        assert min(generations) > int(str(before["generation"]))
        assert all(e["state"] == "pending" and e["server"] == "pooled" for e in epochs)
        again = c.post(url, json={"request_uids": ["p-2", "p-4"]})
        assert again.status_code == 200
        assert again.json()["epochs"][0]["epoch"] == epochs[1]["epoch"]
        assert again.json()["epochs"][1]["generation"] > max(generations)
        listed = c.get("/v1/servers/default/pooled/epochs").json()["epochs"]
        assert len(listed) == 5
        clash = c.post("/v1/servers/default/other/epochs", json=body)
        assert clash.status_code == 409 and clash.json()["code"] == "request-conflict"
        too_many = c.post(url, json={"request_uids": ["u"] * 65})
        assert too_many.status_code == 422
        assert c.post(url, json={"request_uids": []}).status_code == 422
        assert c.post(url, content=b"{}", headers={"content-type": "text/plain"}).status_code == 415
        assert rep.post(url, json=body).status_code == 403


def test_illegal_transitions_are_409_and_repeats_are_noops(svc: EpochServiceProcess) -> None:
    with svc.client() as c:
        epoch = issue(c)["epoch"]
        r = c.post(f"/v1/epochs/{epoch}/drain")
        assert r.status_code == 409 and r.json()["code"] == "illegal-transition"
        assert "pending" in r.json()["message"]
        bind = {"pod_name": "p", "pod_uid": "u1"}
        first = c.post(f"/v1/epochs/{epoch}/bind", json=bind).json()
        repeat = c.post(f"/v1/epochs/{epoch}/bind", json=bind).json()
        assert repeat["revision"] == first["revision"]  # a no-op does not bump the revision
        other = c.post(f"/v1/epochs/{epoch}/bind", json={"pod_name": "q", "pod_uid": "u2"})
        assert other.status_code == 409 and other.json()["code"] == "pod-mismatch"
        # A second epoch cannot take a pod that already has one.
        e2 = issue(c)["epoch"]
        taken = c.post(f"/v1/epochs/{e2}/bind", json=bind)
        assert taken.status_code == 409 and taken.json()["code"] == "pod-already-bound"
        c.post(f"/v1/epochs/{epoch}/retire").raise_for_status()
        assert c.post(f"/v1/epochs/{epoch}/retire").status_code == 200
        late = c.post(f"/v1/epochs/{epoch}/incarnations")
        assert late.status_code == 409 and late.json()["code"] == "illegal-transition"


def test_a_bind_records_the_pods_address_once_known(svc: EpochServiceProcess) -> None:
    with svc.client() as c:
        epoch = issue(c)["epoch"]
        bind = {"pod_name": "p", "pod_uid": "u1"}
        first = c.post(f"/v1/epochs/{epoch}/bind", json=bind).json()
        assert first["address"] is None
        for bad in ("10.0.0.1", "10.0.0.1:0", "10.0.0.1:65536", "h st:80", "a:80/x", 8080):
            r = c.post(f"/v1/epochs/{epoch}/bind", json={**bind, "address": bad})
            assert r.status_code == 422, bad
        ip = c.post(f"/v1/epochs/{epoch}/bind", json={**bind, "address": "10.0.0.7:8080"})
        assert ip.json()["address"] == "10.0.0.7:8080"
        assert ip.json()["revision"] > first["revision"]  # followers learn it
        v6 = c.post(f"/v1/epochs/{epoch}/bind", json={**bind, "address": "[fd00::7]:8080"})
        assert v6.json()["address"] == "[fd00::7]:8080"
        # Only the bound pod may say where the epoch serves.
        other = c.post(
            f"/v1/epochs/{epoch}/bind",
            json={"pod_name": "q", "pod_uid": "u2", "address": "10.0.0.9:8080"},
        )
        assert other.status_code == 409 and other.json()["code"] == "pod-mismatch"
        listed = c.get("/v1/servers/default/demo/epochs").json()["epochs"]
        assert [e["address"] for e in listed if e["epoch"] == epoch] == ["[fd00::7]:8080"]


def test_auth(svc: EpochServiceProcess) -> None:
    body = {"namespace": "default", "server": "demo", "request_uid": "x"}
    with httpx.Client(base_url=svc.url) as anon:
        r = anon.post("/v1/epochs", json=body)
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
        assert anon.get("/v1/servers/default/demo/epochs").status_code == 401
        assert anon.get("/healthz").status_code == 200
    with svc.client("not-a-token") as bad:
        r = bad.post("/v1/epochs", json=body)
        assert r.status_code == 403 and r.json()["code"] == "forbidden"
    with svc.client() as op, svc.client(svc.replica_token) as rep:
        epoch = issue(op)["epoch"]
        # Replicas read and register incarnations, nothing else.
        assert rep.post("/v1/epochs", json=body).status_code == 403
        assert rep.post(f"/v1/epochs/{epoch}/retire").status_code == 403
        assert rep.get(f"/v1/epochs/{epoch}").status_code == 200


def test_the_shared_replica_token_cannot_take_over_an_epoch(svc: EpochServiceProcess) -> None:
    """The attack of the first release: one POST with no body made a victim's live process
    count as superseded. With the static token, a registration must name the bound pod's UID,
    and nothing a replica gets back reveals one."""
    victim_uid = "7f0c1e2a-1111-4c4c-9d9d-000000000001"
    with svc.client() as op, svc.client(svc.replica_token) as rep:
        epoch = issue(op)["epoch"]
        pending = rep.post(f"/v1/epochs/{epoch}/incarnations", json={"pod_uid": victim_uid})
        assert pending.status_code == 409 and pending.json()["code"] == "not-bound"
        assert pending.headers["retry-after"] == "1"
        bind = {"pod_name": "victim-0", "pod_uid": victim_uid}
        op.post(f"/v1/epochs/{epoch}/bind", json=bind).raise_for_status()
        own = rep.post(f"/v1/epochs/{epoch}/incarnations", json={"pod_uid": victim_uid})
        assert own.status_code == 201, own.text
        assert own.json()["process_epoch"] == f"{epoch}.0"

        no_body = rep.post(f"/v1/epochs/{epoch}/incarnations")
        assert no_body.status_code == 422 and no_body.json()["code"] == "pod-uid-required"
        guess = rep.post(f"/v1/epochs/{epoch}/incarnations", json={"pod_uid": "guess"})
        assert guess.status_code == 403 and guess.json()["code"] == "not-your-epoch"
        for answer in (no_body, guess, rep.get(f"/v1/epochs/{epoch}")):
            assert victim_uid not in answer.text
        # The operator's list at this very revision (rendered once and shared by callers of
        # the same view) shows the UID; the replica's at the same revision never does.
        by_operator = op.get("/v1/servers/default/demo/epochs").json()
        assert victim_uid in {e["pod_uid"] for e in by_operator["epochs"]}
        replica_view = rep.get("/v1/servers/default/demo/epochs").json()
        assert replica_view["revision"] == by_operator["revision"]
        listed = replica_view["epochs"]
        assert listed and all(e["pod_uid"] is None for e in listed)
        # The victim's process is still the newest incarnation: nobody superseded it.
        seen = op.get(f"/v1/epochs/{epoch}").json()
        assert seen["process_epoch"] == f"{epoch}.0" and seen["pod_uid"] == victim_uid


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("GET", "/v1/epochs/not-an-epoch", None, 422, "malformed-epoch"),
        ("GET", "/v1/epochs/0123abcd-01", None, 422, "malformed-epoch"),
        ("GET", "/v1/epochs/0123abcd-1", None, 404, "unknown-epoch"),  # another ledger's
        ("POST", "/v1/epochs/0123abcd-1/retire", None, 404, "unknown-epoch"),
        (
            "POST",
            "/v1/epochs",
            {"namespace": "Bad_NS", "server": "s", "request_uid": "u"},
            422,
            "invalid-request",
        ),
        (
            "POST",
            "/v1/epochs",
            {"namespace": "ns", "server": 5, "request_uid": "u"},
            422,
            "invalid-request",
        ),
        ("POST", "/v1/epochs", {"namespace": "ns", "server": "s"}, 422, "invalid-request"),
        (
            "POST",
            "/v1/epochs",
            {"namespace": "ns", "server": "s", "request_uid": "u", "x": 1},
            422,
            "invalid-request",
        ),
        ("POST", "/v1/epochs", [1, 2], 422, "invalid-request"),
        ("GET", "/v1/servers/UPPER/demo/epochs", None, 422, "invalid-request"),
        ("GET", "/v1/servers/default/demo/epochs?state=zombie", None, 422, "invalid-request"),
        ("GET", "/v1/servers/default/demo/epochs?since=-1", None, 422, "invalid-request"),
        ("GET", "/v1/nothing", None, 404, "not-found"),
    ],
)
def test_malformed_input_gets_clear_errors(
    epoch_service: EpochServiceProcess,
    method: str,
    path: str,
    body: object,
    status: int,
    code: str,
) -> None:
    with epoch_service.client() as c:
        r = c.request(method, path, json=body)
        assert r.status_code == status, r.text
        assert r.json()["code"] == code
        assert r.json()["message"]


def test_oversized_and_non_json_bodies(epoch_service: EpochServiceProcess) -> None:
    with epoch_service.client() as c:
        big = {"namespace": "ns", "server": "s", "request_uid": "u", "pad": "x" * 100_000}
        r = c.post("/v1/epochs", json=big)
        assert r.status_code == 413 and r.json()["code"] == "body-too-large"

        def chunks():  # no Content-Length: the limit must hold while streaming too
            for _ in range(100):
                yield b"x" * 1000

        r = c.post("/v1/epochs", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        r = c.post("/v1/epochs", content=b"namespace=ns")
        assert r.status_code == 415 and r.json()["code"] == "unsupported-media-type"
        # Truncated JSON and a body that is not UTF-8 are the same fault, with one answer.
        for raw in (b"{not json", b'{"namespace": "\xff\xfe"}', b"\x80"):
            r = c.post("/v1/epochs", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 422 and r.json()["code"] == "invalid-request", (raw, r.text)
        # Nothing was issued by any of the refused requests.
        assert c.get("/v1/servers/ns/s/epochs").json()["epochs"] == []


def test_long_poll_wakes_on_change_and_times_out(svc: EpochServiceProcess) -> None:
    with svc.client() as c:
        rev = c.get("/v1/servers/default/demo/epochs").json()["revision"]
        # Nothing changes: the wait ends cleanly with the same revision.
        t0 = time.monotonic()
        r = c.get(f"/v1/servers/default/demo/epochs?since={rev}&wait=1")
        assert r.status_code == 200 and r.json()["revision"] == rev
        assert 0.9 <= time.monotonic() - t0 < 5

        got: dict[str, object] = {}

        def poll() -> None:
            with svc.client() as p:
                t = time.monotonic()
                got["body"] = p.get(f"/v1/servers/default/demo/epochs?since={rev}&wait=20").json()
                got["took"] = time.monotonic() - t

        waiter = threading.Thread(target=poll)
        waiter.start()
        deadline = time.monotonic() + 10
        while "epochsvc_longpoll_waiters 1.0" not in c.get("/metrics").text:
            assert time.monotonic() < deadline, "the long poll was never held"
        issue(c, server="other")  # another server's change does not wake this one...
        waiter.join(0.5)  # (a window for a wrong wake to show, not a synchronisation)
        assert waiter.is_alive()
        assert "epochsvc_longpoll_waiters 1.0" in c.get("/metrics").text
        epoch = issue(c)["epoch"]  # ...this one does
        waiter.join(10)
        assert not waiter.is_alive()
        body = got["body"]
        assert isinstance(body, dict)
        assert [e["epoch"] for e in body["epochs"]] == [epoch]
        assert body["revision"] > rev
        assert isinstance(got["took"], float) and got["took"] < 5


def test_state_filter_and_metrics(svc: EpochServiceProcess) -> None:
    with svc.client() as c:
        a, b = issue(c)["epoch"], issue(c)["epoch"]
        c.post(f"/v1/epochs/{a}/bind", json={"pod_name": "a", "pod_uid": "ua"}).raise_for_status()
        live = c.get("/v1/servers/default/demo/epochs?state=live").json()["epochs"]
        assert [e["epoch"] for e in live] == [a]
        both = c.get("/v1/servers/default/demo/epochs?state=live&state=pending").json()["epochs"]
        assert {e["epoch"] for e in both} == {a, b}
        text = c.get("/metrics").text
        assert 'epochsvc_epochs_issued_total{namespace="default",server="demo"} 2.0' in text
        assert 'epochsvc_epochs{namespace="default",server="demo",state="live"} 1.0' in text
        assert "epochsvc_request_duration_seconds_bucket" in text


def test_pending_epochs_are_abandoned_and_tombstones_compacted(
    service_factory: ServiceFactory, sqlite_url: str
) -> None:
    svc = service_factory(
        sqlite_url,
        EPOCHSVC_PENDING_TIMEOUT_SECONDS="0.5",
        EPOCHSVC_TOMBSTONE_TTL_SECONDS="1.5",
        EPOCHSVC_SWEEP_INTERVAL_SECONDS="0.2",
    )
    with svc.client() as c:
        never_seen = issue(c)
        seen = issue(c)["epoch"]
        c.post(f"/v1/epochs/{seen}/bind", json={"pod_name": "p", "pod_uid": "u"})
        time.sleep(1.2)
        assert c.get(f"/v1/epochs/{never_seen['epoch']}").json()["state"] == "abandoned"
        assert c.get(f"/v1/epochs/{seen}").json()["state"] == "live"
        bind = c.post(
            f"/v1/epochs/{never_seen['epoch']}/bind", json={"pod_name": "x", "pod_uid": "y"}
        )
        assert bind.status_code == 409
        time.sleep(2.0)
        assert c.get(f"/v1/epochs/{never_seen['epoch']}").status_code == 404
        # Compaction never lowers the generation counter.
        assert int(str(issue(c)["generation"])) == 3


def test_ledger_identity_survives_restart(service_factory: ServiceFactory, sqlite_url: str) -> None:
    svc = service_factory(sqlite_url)
    with svc.client() as c:
        first = issue(c)
    svc.restart()
    with svc.client() as c:
        second = issue(c)
    assert str(second["epoch"]).split("-")[0] == str(first["epoch"]).split("-")[0]
    assert int(str(second["generation"])) == int(str(first["generation"])) + 1


def test_store_down_is_503_not_500(service_factory: ServiceFactory, postgres: object) -> None:
    from tests.support.postgres import PostgresServer

    pg = PostgresServer().start()
    try:
        svc = service_factory(pg.new_database())
        with svc.client() as c:
            issue(c)
            pg.stop()
            r = c.post(
                "/v1/epochs", json={"namespace": "default", "server": "demo", "request_uid": "z"}
            )
            assert r.status_code == 503 and r.json()["code"] == "store-unavailable"
            assert c.get("/readyz").status_code == 503
            assert c.get("/healthz").status_code == 200
    finally:
        pg.stop()


def test_second_process_on_one_sqlite_ledger_is_refused(
    service_factory: ServiceFactory, sqlite_url: str
) -> None:
    service_factory(sqlite_url)
    with pytest.raises(RuntimeError, match="another epoch service process is using the ledger"):
        service_factory(sqlite_url)


def test_openapi_documents_the_repeat_and_the_epoch_pattern(svc: EpochServiceProcess) -> None:
    import re

    with svc.client() as c:
        spec = c.get("/openapi.json").json()
    issue = spec["paths"]["/v1/epochs"]["post"]["responses"]
    assert {"200", "201", "422"} <= set(issue)
    (param,) = spec["paths"]["/v1/epochs/{epoch}"]["get"]["parameters"]
    pattern = re.compile(param["schema"]["pattern"])
    assert pattern.match("9f2c1a7e-42") and pattern.match("9f2c1a7e-42.0")
    assert not pattern.match("9f2c1a7e-042") and not pattern.match("x-1")
    # Incarnations as exact as generations: what the pattern admits, the service parses.
    for bad in ("9f2c1a7e-42.01", "9f2c1a7e-42." + "1" * 20, f"9f2c1a7e-42.{2**63}"):
        assert not pattern.match(bad), bad
    assert pattern.match(f"9f2c1a7e-42.{2**63 - 1}")
    metrics = spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain; version=0.0.4; charset=utf-8"]


def _wait_for_log(path: Path, text: str, within: float = 30.0) -> None:
    """Until the service's log says ``text`` (what the test waits for is that line)."""
    deadline = time.monotonic() + within
    while text not in path.read_text():
        assert time.monotonic() < deadline, f"the log never said {text!r}:\n{path.read_text()}"
        time.sleep(0.05)


def test_a_postgres_crash_is_two_log_lines_and_a_prompt_recovery(
    service_factory: ServiceFactory, postgres: object
) -> None:
    """PostgreSQL killed with SIGKILL, then back: the follower says once that it lost the
    database and once that it is back, with no traceback, and the service issues again."""
    from tests.support.postgres import PostgresServer

    pg = PostgresServer().start()
    try:
        svc = service_factory(pg.new_database())
        with svc.client() as c:
            issue(c)
            pg.kill()
            for n in range(20):  # an outage under load: one line for all of its 503s
                r = c.post(
                    "/v1/epochs",
                    json={"namespace": "default", "server": "demo", "request_uid": f"k{n}"},
                )
                assert r.status_code == 503 and r.json()["code"] == "store-unavailable"
            _wait_for_log(svc.log_path, "ledger follower lost the database")
            pg.launch()
            _wait_for_log(svc.log_path, "ledger follower is back on the database")
            again = issue(c)
            assert again["state"] == "pending"
        log = svc.log_path.read_text()
        assert log.count("ledger follower lost the database") == 1, log
        assert log.count("ledger follower is back on the database") == 1, log
        assert "Traceback" not in log and "Exception during reset" not in log, log
        assert log.count("store unavailable") == 1, log
    finally:
        pg.stop()
