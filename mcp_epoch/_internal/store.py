"""``EpochEventStore``: the MCP SDK's ``EventStore`` built on the epoch rules.

Event IDs are ``<process epoch>:<seq>`` with one seq counter per process, so an ID is unique
across every stream and session of the process and meaningless in any other process. Events
are owned by the session (see :mod:`mcp_epoch._internal.sessions`) and the stream they were first
sent on; replay sends only the owner's events of that stream. This module imports ``mcp``.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Protocol

from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCResponse

from mcp_epoch._internal.buffer import BufferedEvent, ReplayBuffer
from mcp_epoch._internal.decision import ReplayPlan, decide, zombie
from mcp_epoch._internal.errors import ResumptionGap
from mcp_epoch._internal.eventid import EventId
from mcp_epoch._internal.inflight import InFlight
from mcp_epoch._internal.resume import Followers, follow, follow_from, mark_broken
from mcp_epoch._internal.sessions import SessionTag, current_session
from mcp_epoch._internal.snapshot import EpochSnapshot
from mcp_epoch.contract import DEFAULT_BUFFER_EVENTS, ProcessEpoch

log = logging.getLogger(__name__)
NOT_STARTED = (
    "mcp-epoch has no process epoch yet: serve the app with its ASGI lifespan on "
    "(or enter EpochSafeApp.running()) before the first request"
)


class RawMessage(NamedTuple):
    """A JSON-RPC message kept as the text it arrived in. The sidecar relays messages it has
    no reason to rebuild: validating each into the SDK's models cost more than everything
    else it did per event (bench proxy: 40% of its CPU while streaming). It answers
    ``model_dump_json`` as the SDK's models do, so whatever writes a buffered message writes
    either kind the same way."""

    json: str
    #: A response or an error: it ends its request's stream.
    final: bool
    id: str | int | None = None

    def model_dump_json(self, **_options: Any) -> str:
        return self.json


def as_sent(ev: BufferedEvent) -> Any:
    """A buffered event's message as the SDK's writer takes it, a :class:`RawMessage` standing
    in for its model (``None``: a priming event)."""
    return None if ev.message is None else RawMessage(ev.message, ev.final)


class SnapshotSource(Protocol):
    @property
    def snapshot(self) -> EpochSnapshot: ...


#: The messages that end their request's stream (the SDK's own writer stops there too).
_FINAL = (JSONRPCResponse, JSONRPCError)
#: Whether a message class ends its stream, learnt once per class: ``isinstance`` against
#: pydantic's classes goes through ``ABCMeta`` (measured: a tenth of an event's cost).
_ENDS_STREAM: dict[type, bool] = {}


def wire(message: JSONRPCMessage | RawMessage) -> tuple[str, bool]:
    """A message as the SDK writes it on a stream (and as the buffer keeps it), and whether
    it ends its stream. One function for every event stored, so it takes the fewest steps."""
    if isinstance(message, RawMessage):
        return message.json, message.final
    cls = type(message)
    final = _ENDS_STREAM.get(cls)
    if final is None:
        final = _ENDS_STREAM[cls] = issubclass(cls, _FINAL)
    # What ``model_dump_json`` does, without its Python layer (half its time).
    serializer = cls.__pydantic_serializer__
    return serializer.to_json(message, by_alias=True, exclude_unset=True).decode(), final


#: What a store without a view of the ledger sees (it is immutable: one serves every request).
_NO_VIEW = EpochSnapshot()


class EpochEventStore(EventStore):
    """Bounded, epoch-tagged, session- and stream-owned event store for the SDK."""

    def __init__(
        self,
        epoch: ProcessEpoch | None = None,
        *,
        capacity: int = DEFAULT_BUFFER_EVENTS,
        view: SnapshotSource | None = None,
        inflight: InFlight | None = None,
    ) -> None:
        self.buffer = ReplayBuffer(capacity)
        self.view = view
        self.inflight = inflight
        self._followers = Followers()
        self._epoch: ProcessEpoch | None = None
        self._prefix = ""
        #: The epoch and its pod epoch as text, made once (every request names them).
        self.epoch_text = ""
        self.pod_text = ""
        if epoch is not None:
            self.bind(epoch)

    @property
    def epoch(self) -> ProcessEpoch:
        """This process's epoch; set once, before the first request (see :meth:`bind`)."""
        if self._epoch is None:
            raise RuntimeError(NOT_STARTED)
        return self._epoch

    @property
    def bound(self) -> bool:
        return self._epoch is not None

    def bind(self, epoch: ProcessEpoch) -> None:
        """Fix the process epoch; event IDs are minted from it from now on."""
        if self._epoch is not None and self._epoch != epoch:
            raise RuntimeError(f"the process epoch is {self._epoch} already")
        self._epoch = epoch
        self._prefix = f"{epoch}:"
        self.epoch_text, self.pod_text = str(epoch), str(epoch.pod)

    def snapshot(self) -> EpochSnapshot:
        return _NO_VIEW if self.view is None else self.view.snapshot

    def is_zombie(self) -> bool:
        return zombie(self.snapshot(), self.epoch)

    def decide(self, cursor: str | EventId, owner: SessionTag | None) -> ReplayPlan:
        """The resume decision against this store's state right now (raises on rejection)."""
        return decide(cursor, self.epoch, self.buffer, self.snapshot(), owner)

    @staticmethod
    def message_json(message: JSONRPCMessage | RawMessage) -> str:
        """A message as the SDK writes it on a stream (and as the buffer keeps it)."""
        return wire(message)[0]

    def stored_text(self, event_id: str) -> str | None:
        """The text of an event this store minted ``event_id`` for, while the ring holds it;
        None for another process's ID, a malformed one, an evicted event or a priming one."""
        prefix = self._prefix
        n = len(prefix)
        if not n or event_id[:n] != prefix:
            return None
        try:
            seq = int(event_id[n:])
        except ValueError:
            return None
        text: str | None = self.buffer.message_of(seq)
        return text

    def event_id(self, seq: int) -> str:
        return self._prefix + str(seq)

    async def store_event(self, stream_id: str, message: JSONRPCMessage | RawMessage | None) -> str:
        if not self._prefix:
            raise RuntimeError(NOT_STARTED)
        buffer = self.buffer
        owner = current_session.get()
        event_id = self._prefix + str(buffer.next_seq)
        # Kept as the text it is sent as: one string, which the collector never walks, where
        # an SDK model is a handful of tracked objects held for the whole window.
        text, final = (None, False) if message is None else wire(message)
        buffer.append(owner, stream_id, text, final)
        if final and self.inflight is not None:
            self.inflight.answered((owner, stream_id))
        if self._followers:
            self._followers.wake((owner, stream_id))
        return event_id

    async def replay_events_after(
        self, last_event_id: str, send_callback: EventCallback
    ) -> str | None:
        """Serve a resumed stream from the buffer alone: the missing suffix, then every later
        event of the same (session, stream) as it is stored, until the stream's final response.

        There is no hand-off to the SDK's live delivery: the SDK delivers a stream live only
        through its own per-request queue, and a resumed stream that is registered there late,
        or whose registration an older connection of the same stream removes, silently misses
        events or never ends. Following the buffer cannot miss one: every event is stored here
        before it is sent anywhere. An eviction that overtakes the follower aborts the
        connection (see :mod:`mcp_epoch._internal.resume`), so the client reconnects from its
        last cursor and hears ``gap``; nothing is skipped.

        Returns None: by the time following returns, the stream has sent its final response,
        and the SDK given a stream ID would register a fresh live queue for that finished
        stream and hold the response open until the session ends. Clients that keep a resumed
        GET open until the server ends it (the TypeScript and Go SDK clients) then held it,
        and a replica relaying it held its drain to the deadline.
        """
        owner = current_session.get()
        plan = decide(last_event_id, self.epoch, self.buffer, self.snapshot(), owner)
        try:

            async def send(ev: BufferedEvent) -> None:
                await send_callback(EventMessage(as_sent(ev), self.event_id(ev.seq)))

            await follow(self.buffer, self._followers, plan, owner, send)
        except ResumptionGap:
            mark_broken()
            raise
        return None

    async def follow_stream(self, stream_id: str, since: int, send_callback: EventCallback) -> None:
        """Send every event of the current session's ``stream_id`` from seq ``since`` on, as
        it is stored (a stream opened without a cursor: the sidecar's standalone streams)."""
        owner = current_session.get()

        async def send(ev: BufferedEvent) -> None:
            await send_callback(EventMessage(as_sent(ev), self.event_id(ev.seq)))

        if self.buffer.is_evicted(since):
            raise ResumptionGap(f"event {since} was evicted before the stream could send it")
        await follow_from(self.buffer, self._followers, (), since, owner, stream_id, send)
