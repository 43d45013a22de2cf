"""While a process drains, every answer it gives says ``Connection: close``: the app's own
answers (through the guard's send wrapper) and the guard's (a rejection), so no client keeps
an idle connection to a process that is about to close it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mcp_epoch._internal.guard import ResumptionGuard
from mcp_epoch._internal.store import EpochEventStore
from mcp_epoch.contract import PodEpoch, ProcessEpoch

pytestmark = pytest.mark.anyio
EPOCH = ProcessEpoch(PodEpoch("9f2c1a7e", 7), 0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that asks for its connection to be kept."""
    headers = [(b"content-type", b"text/plain"), (b"connection", b"keep-alive")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


async def _get(guard: ResumptionGuard, **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=guard)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.get("/mcp", headers=headers)


@pytest.mark.parametrize("draining", [False, True])
async def test_answers_say_close_exactly_while_draining(draining: bool) -> None:
    guard = ResumptionGuard(app, EpochEventStore(EPOCH))
    guard.draining = draining
    served = await _get(guard)
    assert served.status_code == 200 and served.text == "ok"
    assert served.headers.get_list("connection") == (["close"] if draining else ["keep-alive"])
    rejected = await _get(guard, **{"last-event-id": "not an id"})
    assert rejected.status_code == 400
    assert ("close" in rejected.headers.get_list("connection")) is draining
