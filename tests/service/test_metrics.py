"""What the epoch service's ``/metrics`` say about its store and about the drains of MCP
server processes: the series the alerts McpEpochLedgerStoreUnavailable and
McpEpochDrainsHitDeadline read, against real service processes (a real PostgreSQL stopped for
the outage)."""

from __future__ import annotations

import time

import httpx

from mcp_epoch import api
from tests.conftest import ServiceFactory
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.metrics import sample
from tests.support.postgres import PostgresServer


def scrape(c: httpx.Client) -> str:
    r = c.get("/metrics")
    assert r.status_code == 200, r.text
    return r.text


def test_a_down_store_is_scraped_as_down_and_its_503s_are_counted(
    service_factory: ServiceFactory, postgres: PostgresServer
) -> None:
    """With its database gone, ``/metrics`` still answers (the outage must not read as the
    service being down) and says ``epochsvc_store_up 0``; each 503 it answers is counted; the
    store back, the gauge is 1 again."""
    pg = PostgresServer().start()
    try:
        svc = service_factory(pg.new_database())
        with svc.client() as c:
            c.post("/v1/epochs", json={"namespace": "ns", "server": "s", "request_uid": "a"})
            text = scrape(c)
            assert sample(text, "epochsvc_store_up") == 1.0
            assert sample(text, "epochsvc_store_unavailable_total") == 0.0
            assert sample(text, "epochsvc_epochs", state="pending") == 1.0
            pg.kill()
            text = scrape(c)
            assert sample(text, "epochsvc_store_up") == 0.0
            assert sample(text, "epochsvc_epochs", state="pending") is None  # unknown now
            for uid in ("b", "c"):
                r = c.post(
                    "/v1/epochs", json={"namespace": "ns", "server": "s", "request_uid": uid}
                )
                assert r.status_code == 503
            assert c.get("/readyz").status_code == 503
            assert sample(scrape(c), "epochsvc_store_unavailable_total") == 3.0
            pg.launch()
            deadline = time.monotonic() + 30
            while c.get("/readyz").status_code != 200:  # the pool reconnects on its own time
                assert time.monotonic() < deadline, svc.tail()
                time.sleep(0.1)
            assert sample(scrape(c), "epochsvc_store_up") == 1.0
    finally:
        pg.stop()


def _process(svc: EpochServiceProcess, server: str, uid: str) -> tuple[str, str]:
    """A bound pod epoch with one registered process: (process epoch, pod UID)."""
    epoch = svc.live("team", server, uid)
    started = svc.send(api.register_incarnation(epoch, f"pod-{uid}", f"uid-{uid}"))
    return started.process_epoch, f"uid-{uid}"


def _report(deadline: bool, pod_uid: str | None) -> dict[str, object]:
    body = api.DrainReport(
        deadline=deadline,
        in_flight=3,
        abandoned=1 if deadline else 0,
        handed=2,
        kept=0,
        seconds=1.5,
        pod_uid=pod_uid,
    )
    return body.model_dump(mode="json", exclude_none=True)


def test_drain_reports_are_counted_by_server_and_outcome_and_only_for_the_own_pod(
    epoch_service: EpochServiceProcess,
) -> None:
    svc = epoch_service
    process, uid = _process(svc, "echo", "1")
    _other, other_uid = _process(svc, "echo", "2")
    path = f"/v1/epochs/{process}/drain-report"
    with svc.client(svc.replica_token) as c:
        r = c.post(path, json=_report(True, uid))
        assert r.status_code == 200, r.text
        assert r.json() == {"namespace": "team", "server": "echo", "outcome": "deadline"}
        assert c.post(path, json=_report(False, uid)).status_code == 200
        # Another pod's UID, no UID with the shared token, a pod epoch, an unknown epoch.
        refused = c.post(path, json=_report(True, other_uid))
        assert (refused.status_code, refused.json()["code"]) == (403, "not-your-epoch")
        assert c.post(path, json=_report(True, None)).status_code == 422
        pod_epoch = process.rsplit(".", 1)[0]
        assert (
            c.post(f"/v1/epochs/{pod_epoch}/drain-report", json=_report(True, uid)).status_code
            == 422
        )
        unknown = process.split("-")[0] + "-999.0"
        assert (
            c.post(f"/v1/epochs/{unknown}/drain-report", json=_report(True, uid)).status_code == 404
        )
    with svc.client() as c:
        text = scrape(c)
    deadline = {"namespace": "team", "server": "echo", "outcome": "deadline"}
    assert sample(text, "epochsvc_drains_total", **deadline) == 1.0
    assert sample(text, "epochsvc_drains_total", **{**deadline, "outcome": "clean"}) == 1.0
