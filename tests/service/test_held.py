"""``HeldResponse`` in a FastAPI app with the service's own error handlers: what a long poll
holds while it waits, and what its client gets when the wait ends in an error."""

import asyncio
import gc
import weakref

import httpx
import pytest
from fastapi import FastAPI

from epochsvc.service.errors import install_error_handlers
from epochsvc.service.held import HeldResponse
from epochsvc.service.store.base import StoreUnavailable

pytestmark = pytest.mark.anyio


class Solved:
    """Something a handler's frame holds (as its solved dependencies are held)."""


def _app(
    frames: list[weakref.ref[Solved]], waiting: asyncio.Event, release: asyncio.Event
) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/held")
    async def held(fail: bool = False) -> HeldResponse:
        solved = Solved()
        frames.append(weakref.ref(solved))

        async def body() -> bytes:
            waiting.set()
            await release.wait()
            if fail:
                raise StoreUnavailable("the ledger database went away")
            return b'{"held":true}'

        return HeldResponse(body, media_type="application/json")

    return app


async def _get(url: str) -> tuple[httpx.Response, bool]:
    """The answer, and whether the handler's frame was still alive during the wait."""
    frames: list[weakref.ref[Solved]] = []
    waiting, release = asyncio.Event(), asyncio.Event()
    transport = httpx.ASGITransport(app=_app(frames, waiting, release))
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
        request = asyncio.create_task(client.get(url))
        await asyncio.wait_for(waiting.wait(), 10)
        gc.collect()
        alive = frames[0]() is not None
        release.set()
        return await request, alive


async def test_the_wait_holds_nothing_of_the_handler() -> None:
    response, alive = await _get("/held")
    assert not alive
    assert response.status_code == 200 and response.json() == {"held": True}
    assert response.headers["content-length"] == str(len(b'{"held":true}'))
    assert response.headers["content-type"] == "application/json"


async def test_an_error_at_the_end_of_the_wait_is_the_apis_error_answer() -> None:
    response, _ = await _get("/held?fail=true")
    assert response.status_code == 503
    assert response.json()["code"] == "store-unavailable"
    assert response.headers["retry-after"] == "1"
