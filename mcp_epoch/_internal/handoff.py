"""The handoff, sending side: a draining process hands its sessions on to one live peer.

A 404 ends the session for most real clients (the TypeScript, Python and Go SDK clients do not
re-initialize), so during a planned stop no session may end merely because its process goes
away. When this process drains it:

1. picks one live peer of its server (the newest: in a rolling deploy the least likely to be
   replaced next) and records the handoff rule in the ledger, once: from then on every replica
   routes this process's sessions to that peer after this process is gone;
2. hands every session on that has no call still running, and every other one as soon as its
   calls are answered (a new call on a session waits for that, then goes to the peer): what
   moves is :mod:`mcp_epoch._internal.handover`'s, sent in one request per batch. An answered
   call whose client has not heard the answer yet moves too: its whole stream, answer
   included, is in the tail, and the client resumes it from the peer;
3. answers any later request of a session it handed on by sending it to the new holder.

Only the sessions the peer confirms have moved. A session that cannot move (no live peer, the
ledger or the peer unreachable, the drain deadline first) stays and ends with this process,
exactly as before: its requests are then rejected, never served half-moved. A process that
dies without draining hands nothing on.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Final

import anyio
import httpx

from mcp_epoch import api
from mcp_epoch._internal import handover, upstream
from mcp_epoch._internal.buffer import BufferedEvent, ReplayBuffer
from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch._internal.forward import Route, live_peers
from mcp_epoch._internal.handover import HandedSession, Tail, TailEvent
from mcp_epoch._internal.inflight import InFlight
from mcp_epoch._internal.sessions import SessionRegistry, SessionTag
from mcp_epoch._internal.snapshot import EpochSnapshot
from mcp_epoch.api_client import EpochServiceClient, EpochServiceError, EpochServiceUnavailable
from mcp_epoch.contract import HANDOFF_FROM_HEADER, HANDOFF_PATH, ProcessEpoch

log = logging.getLogger(__name__)

#: How long recording the rule and one hand-on may take (a hand-on rebuilds each session in
#: the peer's SDK app: milliseconds per session).
RECORD_TIMEOUT: Final = 5.0
SEND_TIMEOUT: Final = 30.0
#: How long a new call on a session of a draining process waits for the session's running
#: calls before it is refused instead (a session moves only when none is running).
CALL_WAIT: Final = 5.0
MAX_ANSWER_BYTES: Final = 16 * 1024 * 1024


class Handoff:
    """Hands this process's sessions on while it drains (see the module docstring)."""

    def __init__(
        self,
        *,
        config: ReplicaConfig,
        registry: SessionRegistry,
        inflight: InFlight,
        buffer: Callable[[], ReplayBuffer],
        epoch: Callable[[], ProcessEpoch],
        snapshot: Callable[[], EpochSnapshot],
        enabled: bool = True,
    ) -> None:
        self._config = config
        self._registry = registry
        self._inflight = inflight
        self._buffer = buffer
        self._epoch = epoch
        self._snapshot = snapshot
        self.enabled = enabled
        self.successor: Route | None = None
        self._chosen = False
        self._choosing = anyio.Lock()
        self._moving: dict[SessionTag, anyio.Event] = {}
        #: Refused by the peer: they stay, and end with this process.
        self._stuck: weakref.WeakSet[SessionTag] = weakref.WeakSet()
        self._broken = False  # the peer could not be reached: nothing more is tried
        self._over = False  # the drain has ended: nothing more moves
        #: Sessions the peer confirmed it took, since start (``/metrics``, the drain report).
        self.handed = 0

    # --- the rule -------------------------------------------------------------------------

    async def successor_route(self) -> Route | None:
        """The peer this process hands to, chosen and recorded in the ledger once; None when
        there is none (no live peer, handoff off, the ledger unreachable)."""
        async with self._choosing:
            if not self._chosen:
                self._chosen = True
                self.successor = await self._choose() if self.enabled else None
            return None if self._broken else self.successor

    async def _choose(self) -> Route | None:
        own = self._epoch()
        view = self._snapshot()
        peers = live_peers(view, own)
        cfg = self._config
        if not peers or cfg.service_url is None:
            log.warning(
                "draining with no live peer of this server to hand %d sessions to: they end "
                "with this process",
                len(self._registry),
            )
            return None
        peer = max(peers, key=lambda r: r.epoch.pod.generation)
        call = api.record_handoff(str(own), str(peer.epoch), cfg.pod_uid)
        try:
            async with EpochServiceClient(
                cfg.service_url, cfg.credential, timeout=RECORD_TIMEOUT
            ) as client:
                await client.once(call)
        except (EpochServiceError, EpochServiceUnavailable, httpx.HTTPError) as exc:
            log.error(
                "cannot record the handoff of this process's sessions to %s (%s): they end "
                "with this process, and their clients must start new sessions",
                peer.epoch,
                exc,
            )
            return None
        log.info("handing sessions on to %s at %s", peer.epoch, peer.address)
        return peer

    # --- moving sessions ------------------------------------------------------------------

    def is_moving(self, tag: SessionTag) -> bool:
        """Whether ``tag`` is being handed on now (:meth:`settled` waits for the outcome)."""
        return tag in self._moving

    async def settled(self, tag: SessionTag) -> None:
        """Return once ``tag`` is not being handed on (then ``tag.moved_to`` says where it is)."""
        event = self._moving.get(tag)
        if event is not None:
            await event.wait()

    async def hand_on_when_idle(self, tag: SessionTag) -> ProcessEpoch | None:
        """For a new call on a session of this draining process: wait until no call of the
        session is still running, hand it on, and say where it went. None: it stays here (the
        caller refuses the call before it runs), also when a call of the session is still
        running after :data:`CALL_WAIT` seconds. A call whose client went away (waiting for
        an answer to a question nobody will answer) may never end, and a new call that waited
        for it to the drain deadline would wait without a first event for all that time."""
        with anyio.move_on_after(CALL_WAIT):
            while tag.moved_to is None and not self._over:
                await self.settled(tag)
                if tag.moved_to is not None or tag in self._stuck or self._over:
                    break
                if self._inflight.working(tag):
                    await self._inflight.changed()
                    continue
                if not await self._hand_on([tag]):
                    break
        if tag.moved_to is None:
            log.info(
                "a new call on session %s was refused: its calls are still running", tag.public_id
            )
        return tag.moved_to

    def over(self) -> None:
        """The drain has ended (its deadline passed): what has not moved stays, and every
        request still waiting for its session to move is answered now (refused before it
        ran), rather than left for the exit to cut."""
        self._over = True
        self._inflight.wake()

    async def hand_on_all(self) -> None:
        """Hand on every session of this process, the idle ones at once and the others as
        their calls are delivered; return when none is left that can move."""
        while True:
            pending = [
                t
                for t in self._registry.tags()
                if t.moved_to is None and t not in self._stuck and t.public_id is not None
            ]
            if not pending or await self.successor_route() is None:
                return
            idle = [t for t in pending if t not in self._moving and not self._inflight.working(t)]
            if idle:
                await self._hand_on(idle)
            else:
                await self._inflight.changed()

    async def _hand_on(self, tags: list[SessionTag]) -> bool:
        """Send these idle sessions to the successor; False when nothing could be sent. Never
        cut short by its caller's deadline (its own send is bounded): a hand-on abandoned
        half-way could leave the peer holding sessions this process still serves."""
        with anyio.CancelScope(shield=True):
            sent = await self._hand_on_now(tags)
        return sent

    async def _hand_on_now(self, tags: list[SessionTag]) -> bool:
        route = await self.successor_route()
        if route is None:
            return False
        tags = [t for t in tags if t not in self._moving and t.moved_to is None]
        if not tags:
            return True
        events = {t: anyio.Event() for t in tags}
        self._moving.update(events)
        try:
            sessions = self._export(tags)
            if sessions:
                await self._send(route, sessions)
        finally:
            for tag, event in events.items():
                self._moving.pop(tag, None)
                event.set()
            self._inflight.wake()  # hand_on_all may be waiting for these to settle
        return not self._broken

    def _export(self, tags: list[SessionTag]) -> dict[str, tuple[SessionTag, HandedSession]]:
        """What moves of each session, its own tail read from the buffer right now (nothing
        of these sessions is in flight, so nothing can be appended to it after)."""
        buffer = self._buffer()
        own = self._epoch()
        oldest = buffer.oldest_seq
        events = buffer.by_owner(set(tags))
        out: dict[str, tuple[SessionTag, HandedSession]] = {}
        for tag in tags:
            if tag.initialize is None or tag.public_id is None:
                self._stuck.add(tag)  # opened before this process knew how to move it
                continue
            tail = Tail(own, oldest, tuple(self._tail_event(ev) for ev in events[tag]))
            out[tag.public_id] = (
                tag,
                HandedSession(
                    tag.public_id,
                    tag.path,
                    tag.host,
                    tag.initialize,
                    tag.protocol_version,
                    tag.log_level,
                    (*tag.tails, tail),
                ),
            )
        return out

    def _tail_event(self, ev: BufferedEvent) -> TailEvent:
        return TailEvent(ev.seq, ev.stream_id, ev.message)  # the store keeps the JSON text

    async def _send(
        self, route: Route, sessions: dict[str, tuple[SessionTag, HandedSession]]
    ) -> None:
        own = self._epoch()
        body = handover.encode(own, (s for _, s in sessions.values()))
        headers = [
            (b"host", route.address.encode()),
            (b"content-type", b"application/json"),
            (HANDOFF_FROM_HEADER.encode(), str(own).encode()),
        ]
        try:
            with anyio.fail_after(SEND_TIMEOUT):
                answer = await upstream.exchange(
                    route.address,
                    "POST",
                    HANDOFF_PATH.encode(),
                    headers,
                    body,
                    connect_timeout=2.0,
                    write_timeout=SEND_TIMEOUT,
                    local_host=self._own_host(),
                )
                try:
                    text = await answer.read(MAX_ANSWER_BYTES)
                finally:
                    answer.close()
            if answer.status != 200:
                raise ValueError(f"answered {answer.status}: {text[:300]!r}")
            adopted, refused = handover.decode_answer(text)
        except (upstream.Refused, upstream.Broken, TimeoutError, ValueError) as exc:
            # The peer may have taken them and not said so: it then serves them once this
            # process is gone, from tails that hold nothing this process sends later, so a
            # cursor of a later event is rejected there, never served wrong.
            self._broken = True
            log.error(
                "handing %d sessions to %s failed (%s): they end with this process",
                len(sessions),
                route.epoch,
                exc,
            )
            return
        for public_id in adopted:
            if public_id in sessions:
                tag = sessions[public_id][0]
                tag.moved_to = route.epoch
                # Its answered calls go with it: their answers are in the tail it took.
                self._inflight.forget_session(tag)
                self.handed += 1
        for public_id, why in refused.items():
            if public_id in sessions:
                self._stuck.add(sessions[public_id][0])
                log.warning("%s refused session %s: %s", route.epoch, public_id, why)

    def _own_host(self) -> str | None:
        """This process's pod address (the receiver checks a hand-on comes from it)."""
        rec = self._snapshot().epochs.get(str(self._epoch().pod))
        if rec is None or rec.address is None:
            return None
        return upstream.host_port(rec.address)[0]
