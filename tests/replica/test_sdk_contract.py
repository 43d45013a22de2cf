"""What mcp-epoch assumes about the MCP Python SDK, each assumption checked on its own.

``pyproject.toml`` pins ``mcp`` to the releases these pass on. A new SDK release that changes
one of them fails here, by name, instead of corrupting streams in production.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import ClientMessageMetadata
from mcp_types import (
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    JSONRPCMessage,
    JSONRPCNotification,
    JSONRPCResponse,
)

from mcp_epoch._internal.sessions import SessionTag, current_session
from mcp_epoch._internal.store import EpochEventStore
from tests.replica.inprocess import EPOCH, Session, running

pytestmark = pytest.mark.anyio


class Recording(EpochEventStore):
    """The real store, noting what the SDK hands it and from which session context."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored: list[tuple[str, JSONRPCMessage | None, SessionTag | None, str]] = []
        self.replays: list[tuple[str, SessionTag | None]] = []

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        event_id = await super().store_event(stream_id, message)
        self.stored.append((stream_id, message, current_session.get(), event_id))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: Any) -> str | None:
        self.replays.append((last_event_id, current_session.get()))
        return await super().replay_events_after(last_event_id, send_callback)


def test_a_request_stream_is_named_by_its_request_id_and_primed_before_dispatch() -> None:
    with running(store_cls=Recording) as server:
        store = server.store
        assert isinstance(store, Recording)
        s = Session(server.url)
        server.gates["a"].allow(3)
        events = s.call("a", 2, rid=41).read(3)
        streams = [(sid, msg) for sid, msg, _, _ in store.stored if sid == "41"]
        # 2025-11-25: a priming event (no message) first, then progress, then the response.
        assert streams[0][1] is None
        assert isinstance(streams[1][1], JSONRPCNotification)
        assert isinstance(streams[-1][1], JSONRPCResponse)
        # Every event the client received was minted by the store, in the order stored.
        minted = [eid for sid, msg, _, eid in store.stored if sid == "41" and msg is not None]
        assert [e.id for e in events] == minted


def test_the_session_router_runs_in_the_context_of_the_request_that_opened_it() -> None:
    with running(store_cls=Recording) as server:
        store = server.store
        assert isinstance(store, Recording)
        a, b = Session(server.url), Session(server.url)
        server.gates["a"].allow(3)
        a.call("a", 2, rid=1).read(3)
        server.gates["b"].allow(3)
        b.call("b", 2, rid=1).read(3)
        owners = {tag.session_id for _, _, tag, _ in store.stored if tag is not None}
        # One tag per session, named by the SDK's own id; clients see it behind the owner.
        assert {f"{server.store.epoch}_{o}" for o in owners} == {a.sid, b.sid}
        assert all(tag is not None for _, _, tag, _ in store.stored)


def test_a_last_event_id_get_reaches_the_store_verbatim_in_the_session_context() -> None:
    with running(store_cls=Recording) as server:
        store = server.store
        assert isinstance(store, Recording)
        s = Session(server.url)
        server.gates["a"].allow(1)
        post = s.call("a", 2, rid=3)
        cursor = post.read(1)[-1].id or ""
        post.close()
        resumed = s.resume(cursor)
        server.gates["a"].allow(3)
        resumed.read(2)
        ((seen, tag),) = store.replays
        assert seen == cursor and tag is not None and s.sid == f"{store.epoch}_{tag.session_id}"


async def test_an_explicit_resumption_get_runs_in_a_copy_of_the_callers_context() -> None:
    # EpochClient marks its explicit resumptions with a context variable that its HTTP
    # transport reads; that needs the SDK to send the GET from the caller's context.
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="")
    seen: list[str] = []

    async def on_request(request: httpx2.Request) -> None:
        if request.method == "GET" and "last-event-id" in request.headers:
            seen.append(marker.get())

    with running(store_cls=Recording) as server:
        server.gates["a"].allow(10)
        http = httpx2.AsyncClient(event_hooks={"request": [on_request]})
        cursor = f"{EPOCH}:999999"  # never issued: the server answers 404, and the SDK's
        request = CallToolRequest(  # transport then fails as a whole (also an SDK behaviour)
            params=CallToolRequestParams(name="gated", arguments={"name": "a", "steps": 1})
        )
        with anyio.move_on_after(10), contextlib.suppress(Exception):
            async with (
                http,
                Client(streamable_http_client(server.url, http_client=http), mode="legacy") as c,
            ):
                marker.set("explicit")
                await c.session.send_request(
                    request, CallToolResult, metadata=ClientMessageMetadata(resumption_token=cursor)
                )
    assert seen == ["explicit"]


async def test_the_sdk_keeps_a_callers_progress_token_when_it_registers_no_callback() -> None:
    # EpochClient puts its own token in _meta and routes progress itself.
    with running(store_cls=Recording) as server:
        store = server.store
        assert isinstance(store, Recording)
        server.gates["a"].allow(10)
        async with Client(server.url, mode="legacy") as client:
            params = CallToolRequestParams(
                name="gated", arguments={"name": "a", "steps": 1}, _meta={"progressToken": "own"}
            )
            await client.session.send_request(CallToolRequest(params=params), CallToolResult)
        progress = [m for _, m, _, _ in store.stored if isinstance(m, JSONRPCNotification)]
        assert progress and all(m.params and m.params["progressToken"] == "own" for m in progress)


def test_the_standalone_stream_has_the_id_the_guard_expects() -> None:
    # The guard tells a call's stream from the standalone GET stream by this ID, without
    # importing the SDK; a renamed constant would make every replay look like a call's.
    from mcp.server.streamable_http import GET_STREAM_KEY

    from mcp_epoch._internal.guard import STANDALONE_STREAM

    assert GET_STREAM_KEY == STANDALONE_STREAM
