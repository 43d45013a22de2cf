"""``HeldResponse`` in a FastAPI app with the service's own error handlers, behind
``HeldPolls`` as the service runs it and alone: what a long poll holds while it waits, and
what its client gets when the wait ends in an error."""

import asyncio
import contextlib
import functools
import gc
import inspect
import weakref

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from epochsvc.service.errors import install_error_handlers
from epochsvc.service.held import HeldPolls, HeldResponse
from epochsvc.service.longpoll import ChangeNotifier
from epochsvc.service.store.base import StoreUnavailable

pytestmark = pytest.mark.anyio


class Solved:
    """Something a handler's frame holds (as its solved dependencies are held)."""


class Framed:
    """Something a middleware's frame holds (as each layer's send wrapper is held)."""


class Layer:
    """A pure ASGI middleware, as every one of the service's is."""

    def __init__(self, app: ASGIApp, layers: list[weakref.ref[Framed]]) -> None:
        self.app, self.layers = app, layers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        framed = Framed()
        self.layers.append(weakref.ref(framed))

        async def wrapped(message: Message) -> None:
            assert framed is not None
            await send(message)

        await self.app(scope, receive, wrapped)


def _app(
    frames: list[weakref.ref[Solved]],
    layers: list[weakref.ref[Framed]],
    waiting: asyncio.Event,
    release: asyncio.Event,
) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    app.add_middleware(Layer, layers=layers)

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


async def _get(
    url: str, front: bool = True, observed: list[int] | None = None
) -> tuple[httpx.Response, bool, bool]:
    """The answer, and whether the handler's frame, and a middleware's, were still alive
    during the wait; the statuses the front observed go to ``observed``."""
    frames: list[weakref.ref[Solved]] = []
    layers: list[weakref.ref[Framed]] = []
    waiting, release = asyncio.Event(), asyncio.Event()
    app = _app(frames, layers, waiting, release)
    seen = observed if observed is not None else []
    asgi = (
        HeldPolls(app, app.exception_handlers, lambda _, status, __: seen.append(status))
        if front
        else app
    )
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
        request = asyncio.create_task(client.get(url))
        await asyncio.wait_for(waiting.wait(), 10)
        gc.collect()
        handler_alive, layer_alive = frames[0]() is not None, layers[0]() is not None
        release.set()
        return await request, handler_alive, layer_alive


async def test_the_wait_holds_nothing_of_the_handler_nor_of_the_middleware() -> None:
    response, handler_alive, layer_alive = await _get("/held")
    assert not handler_alive and not layer_alive
    assert response.status_code == 200 and response.json() == {"held": True}
    assert response.headers["content-length"] == str(len(b'{"held":true}'))
    assert response.headers["content-type"] == "application/json"


@pytest.mark.parametrize("front", [True, False], ids=["held by the front", "alone"])
async def test_an_error_at_the_end_of_the_wait_is_the_apis_error_answer(front: bool) -> None:
    response, _, _ = await _get("/held?fail=true", front)
    assert response.status_code == 503
    assert response.json()["code"] == "store-unavailable"
    assert response.headers["retry-after"] == "1"


async def test_without_the_front_it_waits_inside_the_middleware_as_any_response() -> None:
    response, handler_alive, layer_alive = await _get("/held", front=False)
    assert not handler_alive and layer_alive  # what the front is for
    assert response.json() == {"held": True}


@pytest.mark.parametrize(("url", "status"), [("/held", 200), ("/held?fail=true", 503)])
async def test_the_front_observes_a_held_poll_once_with_the_status_it_answered(
    url: str, status: int
) -> None:
    observed: list[int] = []
    response, _, _ = await _get(url, observed=observed)
    assert response.status_code == status and observed == [status]


class _Ledger:
    """``server_revision`` of one server, as the notifier reads it; ``looked`` is set at the
    ``polls``-th read (a waiter's look goes on to wait without yielding once it is read)."""

    def __init__(self, polls: int) -> None:
        self.revision, self.reads, self.polls = 0, 0, polls
        self.looked = asyncio.Event()

    async def server_revision(self, namespace: str, server: str) -> tuple[int, int]:
        self.reads += 1
        if self.reads == self.polls:
            self.looked.set()
        return self.revision, self.revision


def _awaited_by_the_front(task: asyncio.Task[httpx.Response]) -> object:
    """What the front's own call of ``task``'s request awaits right now."""
    coro: object = task.get_coro()
    while coro is not None:
        code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
        awaiting = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if code is HeldPolls.__call__.__code__:
            return awaiting
        coro = awaiting
    raise AssertionError("the request is not in the front")


async def test_a_poll_the_front_holds_waits_on_its_own_future_and_its_wake_counts_it_out() -> None:
    """Held by the front, a poll keeps no frame of the notifier's while it waits: the front
    awaits the waiter's future itself, so a wake resumes one frame of ours per poll. The wake
    that hands the answer over counts its waiters out; one cancelled while held counts
    itself out."""
    ledger, notifier, made = _Ledger(polls=3), ChangeNotifier(), []

    async def answer(woken_by: int | None) -> bytes:
        made.append(woken_by)
        return b'{"revision":%d}' % ledger.revision

    app = FastAPI()
    install_error_handlers(app)

    @app.get("/poll")
    async def poll(since: int) -> HeldResponse:
        begin = functools.partial(notifier.begin, ledger, "ns", "a", since, 60, answer, "list")
        return HeldResponse(begin, media_type="application/json")  # type: ignore[arg-type]

    transport = httpx.ASGITransport(app=HeldPolls(app, app.exception_handlers))
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as client:
        polls = [asyncio.create_task(client.get("/poll?since=0")) for _ in range(3)]
        await asyncio.wait_for(ledger.looked.wait(), 5)
        assert notifier.waiters == 3
        # The future's own iterator: no coroutine, so no frame of ours, below the front.
        awaited = [_awaited_by_the_front(p) for p in polls]
        assert all(a is not None and not inspect.iscoroutine(a) for a in awaited), awaited
        gone = polls.pop()
        gone.cancel()  # its client went away while it was held
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        assert notifier.waiters == 2
        assert notifier._waiting == {("ns", "a"): 2}
        ledger.revision = 1
        notifier.notify_server("ns", "a", 1)
        answers = await asyncio.wait_for(asyncio.gather(*polls), 5)
    assert [a.json() for a in answers] == [{"revision": 1}] * 2 and made == [1]
    assert notifier.waiters == 0 and not notifier._waiting and not notifier._events
