"""Held long polls on the real service (uvicorn on loopback, SQLite): checked by the route as
every request, held outside the framework, woken by one change with one read of the list for
all of them, and timed in the same latency histogram as every other request."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from epochsvc.service.app import create_app
from epochsvc.service.settings import Settings
from tests.support.served import served

TOKEN = "o" * 32
ROUTE = "/v1/servers/{namespace}/{server}/epochs"
WAITERS = 40


@contextmanager
def _served(tmp_path: Path) -> Iterator[tuple[FastAPI, str]]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        auth="static",
        operator_token=TOKEN,
        replica_token="r" * 32,
    )
    app = create_app(settings)
    with served(app) as url:
        yield app, url


def _count(metrics: str, status: str) -> float:
    pattern = (
        rf'epochsvc_request_duration_seconds_count\{{method="GET",route="{re.escape(ROUTE)}",'
        rf'status="{status}"\}} (\S+)'
    )
    match = re.search(pattern, metrics)
    return float(match.group(1)) if match else 0.0


def test_one_change_answers_every_held_poll_from_one_read(tmp_path: Path) -> None:
    with _served(tmp_path) as (app, url):
        store = app.state.store
        reads = {"list_server": 0}
        real = store.list_server

        async def counted(*args: Any, **kwargs: Any) -> Any:
            reads["list_server"] += 1
            return await real(*args, **kwargs)

        store.list_server = counted  # instrumentation of the real store: it still answers
        asyncio.run(_scenario(url, reads))
        assert app.state.lists.shared_reads == 1


async def _scenario(url: str, reads: dict[str, int]) -> None:
    headers = {"authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=WAITERS + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits) as c:
        rev = (await c.get("/v1/servers/ns/s/epochs")).json()["revision"]
        before = _count((await c.get("/metrics")).text, "200")
        polls = [
            asyncio.create_task(c.get(f"/v1/servers/ns/s/epochs?since={rev}&wait=60"))
            for _ in range(WAITERS)
        ]
        # Checked like any request: a refused or malformed poll is answered, never held.
        refused = await c.get(
            f"/v1/servers/ns/s/epochs?since={rev}&wait=60", headers={"authorization": "Bearer x"}
        )
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
        bad = await c.get("/v1/servers/ns/s/epochs?since=-1&wait=60")
        assert bad.status_code == 422 and bad.json()["code"] == "invalid-request"
        while f"epochsvc_longpoll_waiters {WAITERS}.0" not in (await c.get("/metrics")).text:
            pass  # each look is a request to the service: held polls are what it reports
        reads["list_server"] = 0
        issued = await c.post(
            "/v1/epochs",
            json={"namespace": "ns", "server": "s", "request_uid": str(uuid.uuid4())},
        )
        assert issued.status_code == 201
        answers = await asyncio.wait_for(asyncio.gather(*polls), 30)
        assert {a.status_code for a in answers} == {200}
        bodies = [a.json() for a in answers]
        assert {b["revision"] for b in bodies} == {issued.json()["revision"]}
        assert all([e["epoch"] for e in b["epochs"]] == [issued.json()["epoch"]] for b in bodies)
        assert all(a.headers["content-length"] == str(len(a.content)) for a in answers)
        assert reads["list_server"] == 1  # one read served all of them
        after = _count((await c.get("/metrics")).text, "200")
        assert after - before == WAITERS  # each held poll timed under its route, as any GET
