"""The naive replica: a model of the MCP servers found in the field, NOT something to deploy.

It is the demo's server with three ordinary shortcuts, each of which looks harmless on one
process and breaks as soon as a load balancer moves a client to another process:

* :class:`NaiveEventStore` mints event IDs from a per-process counter (``"1"``, ``"2"``, ...)
  and keeps one buffer shared by all sessions, indexed by the SDK's stream id (the JSON-RPC
  request id), like the SDK's example in-memory store. A cursor it does not hold is clamped to
  what it has ("replay everything after the nearest lower seq", or from its oldest event) instead
  of being refused.
* :class:`NaiveSessionManager` adopts a session id it does not know (as if the client had just
  initialized) instead of answering 404, so a client is never told that its session is gone.
* The client side is the SDK client's plain behaviour (see :mod:`epochsvc.demo.client`).
"""

from __future__ import annotations

import bisect
from collections import deque

import anyio
from anyio.abc import TaskStatus
from mcp.server.connection import Connection
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import (
    MCP_SESSION_ID_HEADER,
    EventCallback,
    EventMessage,
    EventStore,
    StreamableHTTPServerTransport,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    ClientCapabilities,
    ElicitationCapability,
    Implementation,
    InitializeRequestParams,
    JSONRPCMessage,
)
from starlette.types import Receive, Scope, Send

ADOPTED_VERSION = "2025-11-25"


class NaiveEventStore(EventStore):
    """Counter IDs, one bounded buffer for the whole process, clamping replay."""

    def __init__(self, capacity: int = 3000) -> None:
        self._seqs: deque[int] = deque(maxlen=capacity)
        self._events: deque[tuple[str, JSONRPCMessage | None]] = deque(maxlen=capacity)
        self._next = 1

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        seq = self._next
        self._next += 1
        self._seqs.append(seq)
        self._events.append((stream_id, message))
        return str(seq)

    async def replay_events_after(
        self, last_event_id: str, send_callback: EventCallback
    ) -> str | None:
        try:
            cursor = int(last_event_id.rpartition(":")[2])
        except ValueError:
            cursor = 0
        if not self._seqs:
            return None
        # The event at the cursor, else the nearest lower one, else the oldest: never refuse.
        at = max(0, bisect.bisect_right(self._seqs, cursor) - 1)
        stream_id = self._events[at][0]
        for i in range(at + 1, len(self._seqs)):
            sid, message = self._events[i]
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, str(self._seqs[i])))
        return stream_id


class NaiveSessionManager(StreamableHTTPSessionManager):
    """Adopts unknown session ids: the request is served as if the session had always been
    here, so the client never learns that the process holding its session is gone."""

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        sid = None
        for key, value in scope["headers"]:
            if key == MCP_SESSION_ID_HEADER.encode():
                sid = value.decode("latin-1")
        if sid is not None and sid not in self._server_instances and self._task_group is not None:
            await self._adopt(sid)
        await super()._handle_stateful_request(scope, receive, send)

    async def _adopt(self, sid: str) -> None:
        transport = StreamableHTTPServerTransport(
            mcp_session_id=sid,
            is_json_response_enabled=self.json_response,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        self._server_instances[sid] = transport

        async def run(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with transport.connect() as (read_stream, write_stream):
                dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                    read_stream, write_stream, inline_methods=frozenset({"initialize"})
                )
                connection = Connection.for_loop(dispatcher, session_id=sid)
                # Assume the client is like every other one: initialized, able to answer.
                connection.client_params = InitializeRequestParams(
                    protocol_version=ADOPTED_VERSION,
                    capabilities=ClientCapabilities(elicitation=ElicitationCapability()),
                    client_info=Implementation(name="adopted", version="0"),
                )
                connection.initialized.set()
                task_status.started()
                try:
                    await serve_connection(
                        self.app,
                        dispatcher,
                        connection=connection,
                        lifespan_state=self._lifespan_state,
                    )
                finally:
                    self._server_instances.pop(sid, None)

        assert self._task_group is not None
        await self._task_group.start(run)


def make_naive(manager: StreamableHTTPSessionManager) -> None:
    """Turn the SDK-built manager of an app into the naive one (same settings, same lifespan)."""
    manager.__class__ = NaiveSessionManager
