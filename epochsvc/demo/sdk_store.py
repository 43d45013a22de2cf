"""What users run today instead: the SDK's example kind of in-memory event store.

The official SDK ships no production event store; its Streamable HTTP examples use an
in-memory one, and that is what servers in the field copy: random (UUID) event IDs, a bounded
deque of events per stream, and replay of the events after a known ID within its stream. Random
IDs mean a cursor is never *misread* by another process; the store just does not know it. Such
a fleet relies on the balancer's session affinity to send every request of a session, and every
reconnect, to the one process that holds it (see :mod:`epochsvc.demo.balancer`, ``sticky``).
This is written after the SDK's example, not imported: the SDK does not ship it.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from dataclasses import dataclass

from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp_types import JSONRPCMessage

log = logging.getLogger(__name__)
EVENTS_PER_STREAM = 100  # the example's default


@dataclass(frozen=True, slots=True)
class _Event:
    event_id: str
    stream_id: str
    message: JSONRPCMessage | None


class ExampleEventStore(EventStore):
    """Per-stream deques with UUID event IDs; unknown IDs replay nothing."""

    def __init__(self, max_events_per_stream: int = EVENTS_PER_STREAM) -> None:
        self.max_events_per_stream = max_events_per_stream
        self._streams: dict[str, deque[_Event]] = {}
        self._index: dict[str, _Event] = {}

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        event = _Event(uuid.uuid4().hex, stream_id, message)
        stream = self._streams.setdefault(stream_id, deque(maxlen=self.max_events_per_stream))
        if len(stream) == stream.maxlen:
            self._index.pop(stream[0].event_id, None)
        stream.append(event)
        self._index[event.event_id] = event
        return event.event_id

    async def replay_events_after(
        self, last_event_id: str, send_callback: EventCallback
    ) -> str | None:
        last = self._index.get(last_event_id)
        if last is None:
            log.warning("event ID %s not found in store", last_event_id)
            return None
        after = False
        for event in self._streams.get(last.stream_id, ()):
            if after and event.message is not None:
                await send_callback(EventMessage(event.message, event.event_id))
            after = after or event.event_id == last_event_id
        return last.stream_id
