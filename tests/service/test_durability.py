"""Crash and concurrency: the generation never repeats and acknowledged epochs survive kill -9."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx

from tests.conftest import ServiceFactory
from tests.support.epochsvc_proc import EpochServiceProcess
from tests.support.metrics import sample
from tests.support.postgres import PostgresServer


async def _issue_until_stopped(
    svc: EpochServiceProcess,
    acked: dict[str, dict[str, object]],
    sent: list[str],
    stop: asyncio.Event,
) -> None:
    async with svc.async_client(timeout=5) as c:
        while not stop.is_set():
            uid = str(uuid.uuid4())
            sent.append(uid)
            try:
                r = await c.post(
                    "/v1/epochs", json={"namespace": "ns", "server": "crash", "request_uid": uid}
                )
            except httpx.TransportError:
                return  # the service died under us: this request was never acknowledged
            assert r.status_code == 201, r.text
            acked[uid] = r.json()


async def _crash_run(
    svc: EpochServiceProcess, clients: int
) -> tuple[dict[str, dict[str, object]], list[str]]:
    acked: dict[str, dict[str, object]] = {}
    sent: list[str] = []
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(_issue_until_stopped(svc, acked, sent, stop)) for _ in range(clients)
    ]
    while len(acked) < 200:  # noqa: ASYNC110 - waiting on a count, not an event
        await asyncio.sleep(0.02)
    svc.kill()  # SIGKILL mid-flight: some requests are in the middle of their transaction
    stop.set()
    await asyncio.gather(*tasks)
    return acked, sent


def _check_after_restart(
    svc: EpochServiceProcess, acked: dict[str, dict[str, object]], sent: list[str]
) -> None:
    gens = [int(str(e["generation"])) for e in acked.values()]
    assert len(set(gens)) == len(gens), "a generation was acknowledged twice"
    with svc.client() as c:
        listed = c.get("/v1/servers/ns/crash/epochs").json()["epochs"]
        stored = {e["epoch"]: e for e in listed}
        for e in acked.values():
            assert e["epoch"] in stored, f"acknowledged epoch {e['epoch']} lost in the crash"
        # Retrying any request (acknowledged or cut off) after the crash never yields a
        # generation that belongs to another request.
        owner = {int(str(e["generation"])): uid for uid, e in acked.items()}
        for uid in sent:
            r = c.post(
                "/v1/epochs", json={"namespace": "ns", "server": "crash", "request_uid": uid}
            )
            assert r.status_code in (200, 201), r.text
            gen = r.json()["generation"]
            assert owner.setdefault(gen, uid) == uid, f"generation {gen} issued twice"
            if uid in acked:
                assert r.status_code == 200 and r.json()["epoch"] == acked[uid]["epoch"]
        fresh = c.post(
            "/v1/epochs",
            json={"namespace": "ns", "server": "crash", "request_uid": str(uuid.uuid4())},
        ).json()
        assert fresh["generation"] > max(owner)


def test_kill9_while_issuing_loses_nothing(
    service_factory: ServiceFactory, database_url: str
) -> None:
    svc = service_factory(database_url)
    for _round in range(2):
        acked, sent = asyncio.run(_crash_run(svc, clients=16))
        svc.start()
        _check_after_restart(svc, acked, sent)


async def _issue_many(svc: EpochServiceProcess, prefix: str, n: int) -> list[int]:
    async with svc.async_client(timeout=30) as c:

        async def one(i: int) -> int:
            r = await c.post(
                "/v1/epochs",
                json={"namespace": "ns", "server": "conc", "request_uid": f"{prefix}-{i}"},
            )
            assert r.status_code == 201, r.text
            return int(r.json()["generation"])

        sem = asyncio.Semaphore(32)

        async def bounded(i: int) -> int:
            async with sem:
                return await one(i)

        return list(await asyncio.gather(*(bounded(i) for i in range(n))))


def test_concurrent_issuers_get_distinct_generations(
    service_factory: ServiceFactory, database_url: str
) -> None:
    svc = service_factory(database_url)
    gens = asyncio.run(_issue_many(svc, "c", 300))
    assert sorted(gens) == list(range(1, 301))  # distinct, gap-free, from 1


def test_two_service_processes_on_one_postgres(
    service_factory: ServiceFactory, postgres: PostgresServer
) -> None:
    url = postgres.new_database()
    a, b = service_factory(url), service_factory(url)

    async def both() -> tuple[list[int], list[int]]:
        ra, rb = await asyncio.gather(_issue_many(a, "a", 200), _issue_many(b, "b", 200))
        return ra, rb

    ga, gb = asyncio.run(both())
    assert not set(ga) & set(gb), "two service processes issued the same generation"
    assert sorted(ga + gb) == list(range(1, 401))
    # Both processes serve one ledger.
    with a.client() as ca, b.client() as cb:
        assert ca.get("/readyz").json()["ledger_id"] == cb.get("/readyz").json()["ledger_id"]


async def _waiters(client: httpx.Client) -> float | None:
    """How many long polls the service behind ``client`` holds now."""
    text = (await asyncio.to_thread(client.get, "/metrics")).text
    return sample(text, "epochsvc_longpoll_waiters")


def test_long_poll_sees_changes_from_another_service_process(
    service_factory: ServiceFactory, postgres: PostgresServer
) -> None:
    url = postgres.new_database()
    a = service_factory(url)
    b = service_factory(url)
    b.operator_token, b.replica_token = a.operator_token, a.replica_token
    b.restart()
    with a.client() as ca, b.client() as cb:
        rev = ca.get("/v1/servers/ns/lp/epochs").json()["revision"]

        async def poll_a() -> tuple[float, dict[str, object]]:
            async with a.async_client() as c:
                t = time.monotonic()
                r = await c.get(f"/v1/servers/ns/lp/epochs?since={rev}&wait=20")
                return time.monotonic() - t, r.json()

        async def scenario() -> tuple[float, dict[str, object]]:
            task = asyncio.create_task(poll_a())
            # Written only once A holds the poll: what is tested is a held poll woken by
            # another process's write, not a poll that arrives after it.
            deadline = time.monotonic() + 10
            while await _waiters(ca) != 1.0:
                assert time.monotonic() < deadline, "the long poll was never held"
                await asyncio.sleep(0.02)
            await asyncio.to_thread(
                cb.post,
                "/v1/epochs",
                json={"namespace": "ns", "server": "lp", "request_uid": "via-b"},
            )
            return await task

        took, body = asyncio.run(scenario())
        assert took < 5
        epochs = body["epochs"]
        assert isinstance(epochs, list) and len(epochs) == 1


def test_reads_through_another_service_process_follow_writes(
    service_factory: ServiceFactory, postgres: PostgresServer
) -> None:
    """Each process answers reads from its own copy of the ledger; another process's writes
    reach it by NOTIFY. A new epoch is found at once (a miss goes to the database) and a
    state change shows within the follower's catch-up time."""
    url = postgres.new_database()
    a = service_factory(url)
    b = service_factory(url)
    with a.client() as ca, b.client() as cb:
        r = ca.post("/v1/epochs", json={"namespace": "ns", "server": "rd", "request_uid": "u"})
        epoch = r.json()["epoch"]
        assert cb.get(f"/v1/epochs/{epoch}").json()["state"] == "pending"
        ca.post(f"/v1/epochs/{epoch}/bind", json={"pod_name": "p", "pod_uid": "pu"})
        deadline = time.monotonic() + 3
        while cb.get(f"/v1/epochs/{epoch}").json()["state"] != "live":
            assert time.monotonic() < deadline, "process b never saw the bind made through a"
            time.sleep(0.05)
        listed = cb.get("/v1/servers/ns/rd/epochs").json()
        assert [e["state"] for e in listed["epochs"]] == ["live"]


def test_an_invalid_transaction_after_a_lost_database_is_unavailable_not_a_500() -> None:
    # PostgreSQL dying inside a group commit leaves the next statement of that transaction
    # (the pg_notify) with PendingRollbackError. The fault is constructed here: killing the
    # server at exactly that statement cannot be done on demand.
    from sqlalchemy.exc import PendingRollbackError

    from epochsvc.service.store.base import StoreUnavailable
    from epochsvc.service.store.errors import store_error as _store_error

    mapped = _store_error(
        PendingRollbackError("Can't reconnect until invalid transaction is rolled back")
    )
    assert isinstance(mapped, StoreUnavailable)
