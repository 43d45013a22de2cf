"""The SDK writes each event from the text the store keeps: one serialization per message.

The hook reaches into the SDK's transport (see ``writes_stored_text``), so these tests pin
what a user relies on against the ``mcp`` release in the lock file: on a real SDK server the
hook is in place on every session's transport, what goes on the wire is byte for byte what a
resumption replays, and an event the ring does not hold is written as the SDK always wrote it.
"""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventMessage, StreamableHTTPServerTransport
from mcp_types import JSONRPCNotification
from sse_starlette.event import ensure_bytes

import mcp_epoch
from mcp_epoch._internal.adapters.sdk import writes_stored_text
from mcp_epoch._internal.store import EpochEventStore
from mcp_epoch.contract import PodEpoch, ProcessEpoch
from tests.replica.conftest import PROTOCOL, parse_sse

pytestmark = pytest.mark.anyio

HEADERS = {
    "accept": "application/json, text/event-stream",
    "content-type": "application/json",
    "mcp-protocol-version": PROTOCOL,
}


def counting_server() -> MCPServer:
    mcp = MCPServer("wire-text")

    @mcp.tool()
    async def count(steps: int, ctx: Context = None) -> str:  # type: ignore[assignment]
        for i in range(1, steps + 1):
            await ctx.report_progress(i, steps, f"step {i} é")  # not ASCII: bytes must match
        return f"counted {steps}"

    return mcp


def rpc(method: str, rid: int | None, params: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    return body if rid is None else {**body, "id": rid}


async def test_a_real_sdk_server_writes_every_event_as_the_store_keeps_it() -> None:
    mcp = counting_server()
    app = mcp_epoch.epoch_safe_app(mcp, env={})
    transport = httpx.ASGITransport(app=app)
    async with (
        app.running(),
        mcp.session_manager.run(),  # the SDK app's own lifespan, which ASGITransport skips
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http,
    ):
        init = {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        }
        r = await http.post("/mcp", json=rpc("initialize", 1, init), headers=HEADERS)
        assert r.status_code == 200, r.text
        headers = {**HEADERS, "mcp-session-id": r.headers["mcp-session-id"]}
        await http.post("/mcp", json=rpc("notifications/initialized", None, {}), headers=headers)
        params = {"name": "count", "arguments": {"steps": 5}, "_meta": {"progressToken": "t"}}
        r = await http.post("/mcp", json=rpc("tools/call", 2, params), headers=headers)
        assert r.status_code == 200, r.text

        events = [e for e in parse_sse(r.text.splitlines()) if e.data]
        assert len(events) == 6 and '"counted 5"' in events[-1].data
        # Each event's bytes on the wire are the store's text for its ID: what a resumption
        # from any earlier cursor replays is what the client first read.
        for event in events:
            assert event.id is not None
            assert event.data == app.store.stored_text(event.id)
        # ... and they came from the store, not from a second serialization: the session's
        # own transport in the SDK has the hook.
        (sdk_transport,) = mcp.session_manager._server_instances.values()
        assert getattr(sdk_transport._create_event_data, "writes_stored_text", False)


class Texts:
    """A store that knows the text of one event ID (unlike anything the model serializes to,
    so a test can tell which was written)."""

    def __init__(self, known: dict[str, str]) -> None:
        self.known = known

    def stored_text(self, event_id: str) -> str | None:
        return self.known.get(event_id)


def sdk_transport(local: str) -> tuple[Any, StreamableHTTPServerTransport]:
    transport = StreamableHTTPServerTransport(mcp_session_id=local)
    manager = SimpleNamespace(_server_instances={local: transport})
    return manager, transport


PROGRESS = JSONRPCNotification(
    jsonrpc="2.0", method="notifications/progress", params={"progressToken": 1, "progress": 1}
)


def test_the_stored_text_is_written_and_anything_else_as_the_sdk_writes_it() -> None:
    manager, transport = sdk_transport("s1")
    own = transport._create_event_data(EventMessage(PROGRESS, "e:2"))
    writes_stored_text(manager, Texts({"e:1": '{"stored":true}', "e:3": '{"a":\n1}'}))("s1")

    chunk = transport._create_event_data(EventMessage(PROGRESS, "e:1"))
    # The chunk sse-starlette sends as it is: what it would have made of the SDK's own event.
    assert chunk == b'id: e:1\r\nevent: message\r\ndata: {"stored":true}\r\n\r\n'
    assert ensure_bytes({**own, "id": "e:1", "data": '{"stored":true}'}, "\r\n") == chunk
    # An ID the store does not hold (evicted, another process's) and an event without an
    # ID: the model, serialized by the SDK as before.
    assert transport._create_event_data(EventMessage(PROGRESS, "e:2")) == own
    assert transport._create_event_data(EventMessage(PROGRESS))["data"] == own["data"]
    # A text one data line cannot carry: the SDK's own event (sse-starlette splits it).
    assert transport._create_event_data(EventMessage(PROGRESS, "e:3"))["id"] == "e:3"


def test_a_session_opened_twice_is_hooked_once_and_an_unknown_one_is_left_alone() -> None:
    manager, transport = sdk_transport("s1")
    opened = writes_stored_text(manager, Texts({}))
    opened("s1")
    hooked = transport._create_event_data
    opened("s1")  # an adopted session rebound, say: no hook around the hook
    assert transport._create_event_data is hooked
    opened("not-a-session")  # the SDK ended it already: nothing to hook, no error
    # An SDK whose session manager has no table of transports is served as it is.
    writes_stored_text(object(), Texts({}))("s1")


def test_a_hooked_transport_is_freed_with_its_session_not_left_to_the_collector() -> None:
    manager, transport = sdk_transport("s1")
    writes_stored_text(manager, Texts({}))("s1")
    assert getattr(transport._create_event_data, "writes_stored_text", False)
    gone = weakref.ref(transport)
    gc.disable()
    try:
        del transport, manager  # the SDK drops an ended session's transport
        assert gone() is None  # by reference counting: the hook holds no cycle to it
    finally:
        gc.enable()


class OtherEvents(StreamableHTTPServerTransport):
    """An SDK release that builds its events some other way (a field more, say)."""

    def _create_event_data(self, event_message: EventMessage) -> Any:
        return {**super()._create_event_data(event_message), "retry": 1000}


def test_an_sdk_that_builds_events_another_way_keeps_its_own_writer() -> None:
    transport = OtherEvents(mcp_session_id="s1")
    manager = SimpleNamespace(_server_instances={"s1": transport})
    writes_stored_text(manager, Texts({"e:1": '{"stored":true}'}))("s1")
    event = transport._create_event_data(EventMessage(PROGRESS, "e:1"))
    assert event["retry"] == 1000 and event["data"] != '{"stored":true}'


def test_the_store_gives_the_text_of_its_own_events_while_the_ring_holds_them() -> None:
    epoch = ProcessEpoch(PodEpoch("9f2c1a7e", 7), 0)
    store = EpochEventStore(epoch, capacity=2)
    first = store.event_id(1)
    store.buffer.append(None, "s", '{"a":1}')
    assert store.stored_text(first) == '{"a":1}'
    for bad in ("", "9f2c1a7e", f"{epoch}:x", f"{epoch}:-1", f"{epoch}:99", "other.1.0:1"):
        assert store.stored_text(bad) is None, bad
    store.buffer.append(None, "s", None)
    assert store.stored_text(store.event_id(2)) is None  # a priming event has no text
    store.buffer.append(None, "s", '{"a":3}')
    assert store.stored_text(first) is None  # evicted: its slot holds event 3 now
