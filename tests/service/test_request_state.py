"""Request-state key rings through the real service process, on SQLite and on PostgreSQL:
made on first load, served to replicas and never to the operator, rotated only as fast as
every live pod reports, and the old key dropped only one TTL after they all sealed anew."""

from __future__ import annotations

import base64
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from mcp_epoch import api
from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch._internal.keyring import RingCodec, RingFollower
from mcp_epoch.api_client import EpochServiceError
from mcp_epoch.contract import ENV_RING_REFRESH, ProcessEpoch
from tests.cluster.harness import wait_until
from tests.conftest import ServiceFactory
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.metrics import sample
from tests.support.postgres import PostgresServer

NS, SERVER = "default", "echo"
TTL = 0.5


@pytest.fixture
def svc(service_factory: ServiceFactory, database_url: str) -> EpochServiceProcess:
    return service_factory(database_url, EPOCHSVC_REQUEST_STATE_TTL_SECONDS=str(TTL))


def start_pod(svc: EpochServiceProcess, uid: str) -> str:
    """A live pod with one process; its process epoch."""
    epoch = svc.live(NS, SERVER, uid)
    return svc.send(api.register_incarnation(epoch)).process_epoch


def load(svc: EpochServiceProcess) -> api.RequestStateRing:
    return svc.api(svc.replica_token).send(api.request_state_ring(NS, SERVER))


def test_the_ring_is_made_once_and_only_the_servers_pods_get_its_keys(
    svc: EpochServiceProcess,
) -> None:
    first = load(svc)
    assert (first.revision, first.phase, first.ttl_seconds) == (1, "steady", TTL)
    assert len(first.keys) == 1 and len(base64.b64decode(first.keys[0])) == 32
    assert load(svc).keys == first.keys  # the same ring, not a new one per load
    assert first.keys[0] not in repr(first)
    # The operator drives rotations without ever reading a key.
    with pytest.raises(EpochServiceError) as refused:
        svc.send(api.request_state_ring(NS, SERVER))
    assert refused.value.status == 403
    status = svc.send(api.ring_status(NS, SERVER))
    assert first.keys[0] not in status.model_dump_json()
    # A replica cannot read the status or rotate.
    with pytest.raises(EpochServiceError) as forbidden:
        svc.api(svc.replica_token).send(api.rotate_ring(NS, SERVER))
    assert forbidden.value.status == 403


def test_a_rotation_advances_only_as_every_pod_reports_and_keeps_the_old_key_a_ttl(
    svc: EpochServiceProcess,
) -> None:
    p0, p1 = start_pod(svc, "uid-0"), start_pod(svc, "uid-1")
    replica = svc.api(svc.replica_token)
    old = load(svc).keys[0]
    for process in (p0, p1):
        replica.send(api.report_ring(process, 1))

    rotating = svc.send(api.rotate_ring(NS, SERVER))
    assert (rotating.phase, rotating.revision) == ("adding", 2)
    with pytest.raises(EpochServiceError) as again:
        svc.send(api.rotate_ring(NS, SERVER))
    assert again.value.status == 409 and again.value.code == "rotation-in-progress"
    adding = load(svc)
    assert adding.keys[0] == old and len(adding.keys) == 2
    new = adding.keys[1]

    # One pod behind: no step, and the status says which.
    replica.send(api.report_ring(p0, 2))
    held = svc.send(api.advance_ring(NS, SERVER))
    assert not held.advanced and held.phase == "adding" and held.behind == ["pod-uid-1"]
    assert held.waiting and "1 of 2 pods" in held.waiting

    # The last pod's report takes the step there and then, and tells that pod the ring moved
    # on; nobody has to ask for it.
    last = replica.send(api.report_ring(p1, 2))
    assert (last.revision, last.current_revision) == (2, 3)
    switched = svc.send(api.ring_status(NS, SERVER))
    assert (switched.phase, switched.revision) == ("switching", 3)
    assert not svc.send(api.advance_ring(NS, SERVER)).advanced  # nothing left to step
    assert load(svc).keys == [new, old]  # the new key seals, the old one still opens

    for process in (p0, p1):
        replica.send(api.report_ring(process, 3))
    # The last report at revision 3 was the observation that every pod seals anew.
    observed = svc.send(api.ring_status(NS, SERVER))
    assert observed.switched_at is not None and observed.drop_due == observed.switched_at + TTL
    # Until one TTL has passed since every pod sealed with the new key, the old key stays.
    while True:
        step = svc.send(api.advance_ring(NS, SERVER))
        if step.phase == "steady":
            break
        assert load(svc).keys == [new, old]
        assert time.time() < observed.drop_due + 10, step
    assert time.time() >= observed.drop_due
    assert (step.revision, load(svc).keys) == (4, [new])


def test_the_last_pods_follower_moves_on_at_its_own_report(svc: EpochServiceProcess) -> None:
    """The library's follower (the real one, against the real service): the pod whose report
    takes a step loads and reports the next revision in the same look, without waiting for
    its next refresh."""
    pods = [svc.live(NS, SERVER, uid) for uid in ("uid-0", "uid-1")]
    followers = []
    for pod in pods:
        process = ProcessEpoch.parse(svc.send(api.register_incarnation(pod)).process_epoch)
        follower = RingFollower(
            ReplicaConfig.from_env(svc.replica_env(pod, NS, SERVER)), RingCodec()
        )
        follower.attach(process, registered=True)
        followers.append(follower)
    with svc.api(svc.replica_token) as replica:
        for follower in followers:
            follower.sync_once(replica)
        svc.send(api.rotate_ring(NS, SERVER))
        followers[0].sync_once(replica)
        assert followers[0].codec.revision == 2  # not the last: the step waits for uid-1
        followers[1].sync_once(replica)
    # uid-1's report took the step to revision 3, and it switched to 3 and said so.
    assert (followers[1].codec.revision, followers[1].reported) == (3, 3)
    status = svc.send(api.ring_status(NS, SERVER))
    assert (status.phase, status.revision, status.behind) == ("switching", 3, ["pod-uid-0"])


def _held_load(svc: EpochServiceProcess, since: int, wait: float) -> Future[api.RequestStateRing]:
    """A long poll on the ring, on a thread of its own (the caller goes on meanwhile)."""

    def load() -> api.RequestStateRing:
        with svc.api(svc.replica_token) as replica:
            return replica.send(api.request_state_ring(NS, SERVER, since, wait))

    return ThreadPoolExecutor(1).submit(load)


def _until_held(svc: EpochServiceProcess) -> None:
    """Until the service counts the poll as held (its first look found nothing newer)."""

    def held() -> bool:
        with svc.client() as c:
            return sample(c.get("/metrics").text, "epochsvc_longpoll_waiters") == 1

    wait_until(held, 10, "the ring poll held")


def test_a_held_load_of_the_ring_answers_at_the_step_not_at_its_wait(
    service_factory: ServiceFactory, database_url: str
) -> None:
    """Replicas hold a long poll on the ring, so they learn of a step when it is taken (by
    the operator's rotate, or by the last pod's report), not on a timer."""
    svc = service_factory(database_url)
    first = load(svc)
    assert first.revision == 1
    # Nothing newer than ``since``: held until the wait ends, then the ring as it is.
    began = time.monotonic()
    unchanged = _held_load(svc, 1, 0.5).result(timeout=30)
    assert unchanged.revision == 1 and time.monotonic() - began >= 0.5
    # A caller behind is answered at once; a rotation wakes a caller that is up to date.
    assert _held_load(svc, 0, 30).result(timeout=10).revision == 1
    held = _held_load(svc, 1, 30)
    _until_held(svc)
    svc.send(api.rotate_ring(NS, SERVER))
    woken = held.result(timeout=10)  # long before its 30 s wait
    assert (woken.revision, woken.phase, len(woken.keys)) == (2, "adding", 2)
    # The same parameters, checked as strictly as the epochs' long poll.
    with svc.client(svc.replica_token) as raw:
        path = f"/v1/servers/{NS}/{SERVER}/request-state/ring"
        assert raw.get(path, params={"since": -1, "wait": 1}).status_code == 422
        assert raw.get(path, params={"since": 1, "wait": 3601}).status_code == 422


def test_a_step_another_service_process_takes_wakes_a_held_load(
    service_factory: ServiceFactory, postgres: PostgresServer
) -> None:
    """Two service processes on one PostgreSQL: a rotation begun through one answers a ring
    poll held by the other within its catch-up interval."""
    url = postgres.new_database()
    a = service_factory(url, EPOCHSVC_POLL_INTERVAL_SECONDS="0.2")
    b = service_factory(url)
    assert load(a).revision == 1
    held = _held_load(a, 1, 30)
    _until_held(a)
    b.send(api.rotate_ring(NS, SERVER))
    assert held.result(timeout=10).revision == 2


def test_a_following_replica_learns_of_a_rotation_without_a_timer(
    svc: EpochServiceProcess,
) -> None:
    """The library's follower thread holds a poll on the ring: with its refresh interval at an
    hour, a rotation still reaches it, and its report steps the rotation on."""
    pod = svc.live(NS, SERVER, "uid-0")
    process = ProcessEpoch.parse(svc.send(api.register_incarnation(pod)).process_epoch)
    env = {**svc.replica_env(pod, NS, SERVER), ENV_RING_REFRESH: "3600"}
    follower = RingFollower(ReplicaConfig.from_env(env), RingCodec())
    follower.start(process, registered=True)
    try:
        assert follower.wait_loaded(10) and follower.codec.revision == 1
        wait_until(lambda: follower.reported == 1, 10, "the first report")
        _until_held(svc)
        svc.send(api.rotate_ring(NS, SERVER))
        # adding (2) -> its report steps to switching (3) -> its report records switched_at.
        wait_until(lambda: follower.reported == 3, 10, "the follower at revision 3")
        # Its poll is held again now; stopping (as a drain does) does not wait it out.
        _until_held(svc)
        began = time.monotonic()
    finally:
        follower.stop()
    assert time.monotonic() - began < 5, "stopping waited for the held poll"
    status = svc.send(api.ring_status(NS, SERVER))
    assert (status.phase, status.revision, status.behind) == ("switching", 3, [])
    assert status.switched_at is not None


def test_reports_are_checked_against_the_process_and_the_ring(svc: EpochServiceProcess) -> None:
    process = start_pod(svc, "uid-0")
    replica = svc.api(svc.replica_token)
    load(svc)
    for call, status, code in (
        (api.report_ring(process, 2), 409, "unknown-ring-revision"),
        (api.report_ring(process.rsplit(".", 1)[0], 1), 422, "malformed-epoch"),
    ):
        with pytest.raises(EpochServiceError) as refused:
            replica.send(call)
        assert (refused.value.status, refused.value.code) == (status, code)
    svc.send(api.register_incarnation(process.rsplit(".", 1)[0]))  # a restart
    with pytest.raises(EpochServiceError) as stale:
        replica.send(api.report_ring(process, 1))
    assert stale.value.code == "stale-incarnation"
    # A process that restarted and has not reported yet counts as behind.
    svc.send(api.rotate_ring(NS, SERVER))
    assert svc.send(api.advance_ring(NS, SERVER)).behind == ["pod-uid-0"]
