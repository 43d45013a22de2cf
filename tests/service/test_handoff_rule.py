"""The ledger's handoff rule (``PUT /v1/epochs/{process epoch}/successor``), over HTTP on
SQLite and PostgreSQL: who may record one, to whom, and that it is recorded once."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ServiceFactory
from tests.support.epochsvc_proc import EpochServiceProcess


@pytest.fixture
def svc(service_factory: ServiceFactory, database_url: str) -> EpochServiceProcess:
    return service_factory(database_url)


def _process(svc: EpochServiceProcess, c: httpx.Client, server: str, uid: str) -> str:
    """A live pod epoch of ``server`` with one registered process; its process epoch."""
    epoch = svc.live("default", server, uid)
    r = c.post(f"/v1/epochs/{epoch}/incarnations", json={"pod_uid": f"uid-{uid}"})
    assert r.status_code == 201, r.text
    return str(r.json()["process_epoch"])


def test_a_process_hands_its_sessions_to_a_live_peer_once(svc: EpochServiceProcess) -> None:
    with svc.client() as op, svc.client(svc.replica_token) as replica:
        old = _process(svc, op, "echo", "a")
        new = _process(svc, op, "echo", "b")
        pod = old.rsplit(".", 1)[0]
        before = op.get("/v1/servers/default/echo/epochs").json()["revision"]

        # The shared replica token stands for every replica: it must name the bound pod.
        anonymous = replica.put(f"/v1/epochs/{old}/successor", json={"successor": new})
        assert anonymous.status_code == 422 and anonymous.json()["code"] == "pod-uid-required"
        foreign = replica.put(
            f"/v1/epochs/{old}/successor", json={"successor": new, "pod_uid": "uid-b"}
        )
        assert foreign.status_code == 403 and foreign.json()["code"] == "not-your-epoch"

        body = {"successor": new, "pod_uid": "uid-a"}
        r = replica.put(f"/v1/epochs/{old}/successor", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["successor"] == new and r.json()["successor_of"] == 0
        assert r.json()["pod_uid"] is None  # a replica is never shown pod UIDs
        listed = op.get("/v1/servers/default/echo/epochs").json()
        assert listed["revision"] > before
        (rec,) = [e for e in listed["epochs"] if e["epoch"] == pod]
        assert (rec["successor"], rec["successor_of"]) == (new, 0)

        # The same rule again changes nothing; another one is refused.
        again = replica.put(f"/v1/epochs/{old}/successor", json=body)
        assert again.status_code == 200
        assert again.json()["revision"] == r.json()["revision"]
        third = _process(svc, op, "echo", "c")
        other = replica.put(
            f"/v1/epochs/{old}/successor", json={"successor": third, "pod_uid": "uid-a"}
        )
        assert other.status_code == 409 and other.json()["code"] == "handoff-recorded"


def test_sessions_go_only_to_a_live_process_of_the_same_server(svc: EpochServiceProcess) -> None:
    with svc.client() as op:
        old = _process(svc, op, "echo", "a")
        elsewhere = _process(svc, op, "other", "x")
        r = op.put(f"/v1/epochs/{old}/successor", json={"successor": elsewhere})
        assert r.status_code == 403 and r.json()["code"] == "illegal-handoff"

        itself = old.rsplit(".", 1)[0] + ".7"
        r = op.put(f"/v1/epochs/{old}/successor", json={"successor": itself})
        assert r.status_code == 409 and r.json()["code"] == "illegal-handoff"

        gone = _process(svc, op, "echo", "g")
        op.post(f"/v1/epochs/{gone.rsplit('.', 1)[0]}/retire").raise_for_status()
        r = op.put(f"/v1/epochs/{old}/successor", json={"successor": gone})
        assert r.status_code == 409 and r.json()["code"] == "illegal-handoff"

        peer = _process(svc, op, "echo", "b")
        restarted = op.post(
            f"/v1/epochs/{peer.rsplit('.', 1)[0]}/incarnations", json={"pod_uid": "uid-b"}
        )
        assert restarted.status_code == 201  # the peer's process was replaced by a restart
        r = op.put(f"/v1/epochs/{old}/successor", json={"successor": peer})
        assert r.status_code == 409 and r.json()["code"] == "illegal-handoff"

        ledger8 = old[:8]
        unknown = ("0" if ledger8[0] != "0" else "1") + ledger8[1:] + "-1.0"
        r = op.put(f"/v1/epochs/{old}/successor", json={"successor": unknown})
        assert r.status_code == 409 and r.json()["code"] == "illegal-handoff"


def test_only_the_newest_live_or_draining_process_hands_on(svc: EpochServiceProcess) -> None:
    with svc.client() as op:
        old = _process(svc, op, "echo", "a")
        peer = _process(svc, op, "echo", "b")
        pod = old.rsplit(".", 1)[0]
        assert op.post(f"/v1/epochs/{pod}/incarnations", json={"pod_uid": "uid-a"}).is_success
        stale = op.put(f"/v1/epochs/{old}/successor", json={"successor": peer})
        assert stale.status_code == 409 and stale.json()["code"] == "stale-incarnation"

        op.post(f"/v1/epochs/{pod}/drain").raise_for_status()
        newest = f"{pod}.1"
        ok = op.put(f"/v1/epochs/{newest}/successor", json={"successor": peer})
        assert ok.status_code == 200 and ok.json()["state"] == "draining"

        gone = _process(svc, op, "echo", "c")
        gone_pod = gone.rsplit(".", 1)[0]
        op.post(f"/v1/epochs/{gone_pod}/retire").raise_for_status()
        late = op.put(f"/v1/epochs/{gone}/successor", json={"successor": peer})
        assert late.status_code == 409 and late.json()["code"] == "illegal-transition"


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("{pod}/successor", {"successor": "{peer}"}, "malformed-epoch"),
        ("{old}/successor", {"successor": "not-an-epoch"}, "invalid-request"),
        ("{old}/successor", {"successor": 7}, "invalid-request"),
        ("{old}/successor", {"successor": "{peer}", "extra": 1}, "invalid-request"),
    ],
)
def test_malformed_handoffs_get_422(
    svc: EpochServiceProcess, path: str, body: dict[str, object], code: str
) -> None:
    with svc.client() as op:
        old = _process(svc, op, "echo", "a")
        peer = _process(svc, op, "echo", "b")
        names = {"old": old, "pod": old.rsplit(".", 1)[0], "peer": peer}
        sent = {k: v.format(**names) if isinstance(v, str) else v for k, v in body.items()}
        r = op.put(f"/v1/epochs/{path.format(**names)}", json=sent)
        assert r.status_code == 422 and r.json()["code"] == code, r.text
