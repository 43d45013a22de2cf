"""``EpochEventStore``: the MCP SDK's ``EventStore`` built on the epoch rules.

Event IDs are ``<process epoch>:<seq>`` with one seq counter per process, so an ID is unique
across every stream and session of the process and meaningless in any other process. Events
are owned by the session (see :mod:`epochsvc.replica.sessions`) and the stream they were first
sent on; replay sends only the owner's events of that stream. This module imports ``mcp``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp_types import JSONRPCError, JSONRPCMessage, JSONRPCResponse

from epochsvc.replica.buffer import BufferedEvent, ReplayBuffer
from epochsvc.replica.config import ReplicaConfig
from epochsvc.replica.decision import ReplayPlan, decide, zombie
from epochsvc.replica.errors import ResumptionGap
from epochsvc.replica.eventid import EventId
from epochsvc.replica.liveview import LiveEpochView
from epochsvc.replica.process import ProcessStart, start_process_epoch
from epochsvc.replica.resume import Followers, follow, mark_broken
from epochsvc.replica.sessions import SessionTag, current_session
from epochsvc.replica.snapshot import EpochSnapshot
from epochsvc.tokens import ProcessEpoch

log = logging.getLogger(__name__)


def _is_final(ev: BufferedEvent) -> bool:
    """A response or error ends its request's stream (the SDK's own writer stops there too)."""
    return isinstance(ev.message, JSONRPCResponse | JSONRPCError)


class SnapshotSource(Protocol):
    @property
    def snapshot(self) -> EpochSnapshot: ...


class EpochEventStore(EventStore):
    """Bounded, epoch-tagged, session- and stream-owned event store for the SDK."""

    def __init__(
        self,
        epoch: ProcessEpoch,
        *,
        capacity: int | None = None,
        view: SnapshotSource | None = None,
    ) -> None:
        self.epoch = epoch
        self.buffer = ReplayBuffer(capacity)
        self.view = view
        self._prefix = f"{epoch}:"
        self._followers = Followers()
        self.start: ProcessStart | None = None

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        follow: bool = True,
        first_sync_timeout: float = 3.0,
    ) -> EpochEventStore:
        """Everything from the operator-injected environment: register the process epoch,
        size the buffer, and (if ``follow``) start the live-epoch view in the background.

        Waits up to ``first_sync_timeout`` for the view's first copy of the ledger: a process
        serving before it knows any epoch would reject every foreign cursor as ``unknown``
        (still safe, but the wrong reason). If the service does not answer in time, it serves
        anyway and the view catches up in the background.
        """
        config = ReplicaConfig.from_env(env)
        start = start_process_epoch(config)
        view = LiveEpochView.from_config(config)
        if view is not None and follow:
            view.start()
            if not view.wait_for(lambda snap: snap.ledger_id is not None, first_sync_timeout):
                log.warning(
                    "no copy of the ledger after %.1fs; serving, foreign cursors read as "
                    "'unknown' until the epoch service answers",
                    first_sync_timeout,
                )
        store = cls(start.epoch, capacity=config.buffer_events, view=view)
        store.start = start
        return store

    def snapshot(self) -> EpochSnapshot:
        return EpochSnapshot() if self.view is None else self.view.snapshot

    def is_zombie(self) -> bool:
        return zombie(self.snapshot(), self.epoch)

    def decide(self, cursor: str | EventId, owner: SessionTag | None) -> ReplayPlan:
        """The resume decision against this store's state right now (raises on rejection)."""
        return decide(cursor, self.epoch, self.buffer, self.snapshot(), owner)

    def event_id(self, seq: int) -> str:
        return self._prefix + str(seq)

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        buffer = self.buffer
        owner = current_session.get()
        event_id = self._prefix + str(buffer.next_seq)
        buffer.append(owner, stream_id, message, event_id)
        if self._followers:
            self._followers.wake((owner, stream_id))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str:
        """Serve a resumed stream from the buffer alone: the missing suffix, then every later
        event of the same (session, stream) as it is stored, until the stream's final response.

        There is no hand-off to the SDK's live delivery: the SDK delivers a stream live only
        through its own per-request queue, and a resumed stream that is registered there late,
        or whose registration an older connection of the same stream removes, silently misses
        events or never ends. Following the buffer cannot miss one: every event is stored here
        before it is sent anywhere. An eviction that overtakes the follower aborts the
        connection (see :mod:`epochsvc.replica.resume`), so the client reconnects from its
        last cursor and hears ``gap``; nothing is skipped.
        """
        owner = current_session.get()
        plan = decide(last_event_id, self.epoch, self.buffer, self.snapshot(), owner)
        try:

            async def send(ev: BufferedEvent) -> None:
                await send_callback(EventMessage(ev.message, ev.event_id))

            await follow(self.buffer, self._followers, plan, owner, send, _is_final)
        except ResumptionGap:
            mark_broken()
            raise
        return plan.stream_id
