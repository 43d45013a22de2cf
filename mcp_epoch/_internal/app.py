"""``EpochSafeApp``: the data plane's one core, wrapped around whatever speaks MCP behind it.

An adapter only says what the Streamable HTTP app behind the core is: the SDK adapter
(:mod:`mcp_epoch._internal.adapters.sdk`) builds the server's own app on the core's event
store, and the sidecar adapter (:mod:`mcp_epoch._internal.adapters.sidecar`) builds a relay to
a server on ``localhost`` that files the server's events in the same store. The IDs, the
buffer, the resume decision, forwarding, the drain and the handoff are all here, once.

It wires what a server needs and nothing blocks while it does: the event store and the guard
are built at once, while everything that talks to the network happens in the ASGI lifespan.
That means registering this process start with the epoch service (or falling back) and following the
ledger's live view. On shutdown the view stops. A server that is mounted inside a larger app
(whose lifespan does not reach mounted apps) enters :meth:`EpochSafeApp.running` itself.
This module imports ``mcp``.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from mcp_epoch import api
from mcp_epoch._internal import inprocess, unfinished
from mcp_epoch._internal.adopt import Adopter
from mcp_epoch._internal.config import ReplicaConfig
from mcp_epoch._internal.drainreport import report_drain
from mcp_epoch._internal.guard import (
    ASGIApp,
    Message,
    Receive,
    ResumptionGuard,
    Scope,
    Send,
    error_body,
    respond,
)
from mcp_epoch._internal.handoff import Handoff
from mcp_epoch._internal.health import Health
from mcp_epoch._internal.inflight import InFlight
from mcp_epoch._internal.keyring import follower
from mcp_epoch._internal.liveview import LiveEpochView
from mcp_epoch._internal.process import ProcessStart, start_process_epoch
from mcp_epoch._internal.sessions import SessionRegistry, SessionTag
from mcp_epoch._internal.snapshot import EpochSnapshot
from mcp_epoch._internal.store import NOT_STARTED, EpochEventStore
from mcp_epoch.contract import (
    DRAIN_PATH,
    DRAIN_TOKEN_HEADER,
    HANDOFF_PATH,
    METRICS_PATH,
    READY_PATH,
    ProcessEpoch,
)

log = logging.getLogger("mcp_epoch")

#: How long start-up waits for the first copy of the ledger. Serving before it would refuse
#: every foreign cursor as ``unknown``: safe, but the wrong reason.
FIRST_SYNC_TIMEOUT = 3.0
#: How long ending the sessions a drain keeps at its deadline may take, in all.
END_SESSIONS_SECONDS = 1.0
INTERNAL_ERROR = -32603
#: The paths mcp-epoch may answer before its process has an epoch (see _served_before_start).
_OWN_PATHS = frozenset({DRAIN_PATH, READY_PATH, METRICS_PATH})


def quiet_http_client_logs() -> None:
    """Keep httpx from logging each request at INFO, unless the application chose its level.

    The forwarder and the live view make their requests with httpx, which logs every one of
    them at INFO, and the SDK's ``MCPServer`` sets the root logger to INFO with a rich
    handler. Every forwarded request then rendered a line: a quarter of a forwarding
    replica's CPU (``python -m bench forward``), and noise in every replica's log. An
    application that set the ``httpx`` logger's level keeps it.
    """
    logger = logging.getLogger("httpx")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


#: What an adapter gives the core: the Streamable HTTP app to serve, built on the core's store
#: and its registry of sessions (which maps the IDs clients hold to the app's own).
InnerApp = Callable[[EpochEventStore, SessionRegistry], ASGIApp]
#: Given "is this process draining", wire the adapter's own end-of-stream on drain; returns
#: what ends the streams open when the drain begins (None: nothing to end).
DrainHook = Callable[[Callable[[], bool]], Callable[[], None] | None]
#: What the adapter itself finds wrong with serving now (readiness), e.g. a dead upstream,
#: and the adapter's own lines for ``/metrics``.
Problems = Callable[[], list[str]]
Metrics = Callable[[], list[str]]


@dataclass(frozen=True, slots=True)
class DrainResult:
    """What a drain waited for: calls in flight when it began, left at its end, and its time;
    the sessions it handed on and those it could not (they ended with the process); and, when
    the deadline ended it, the work that held it (request id, answered)."""

    in_flight: int
    abandoned: int
    seconds: float
    handed: int = 0
    kept: int = 0
    hit_deadline: bool = False
    held_by: tuple[tuple[str, bool], ...] = ()


class EpochSafeApp:
    """The ASGI app the adapters return; serve it like the SDK's own app."""

    def __init__(
        self,
        inner: InnerApp,
        *,
        env: Mapping[str, str] | None = None,
        first_sync_timeout: float = FIRST_SYNC_TIMEOUT,
        on_drain: DrainHook | None = None,
        problems: Problems | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        quiet_http_client_logs()
        unfinished.install()
        self.config = ReplicaConfig.from_env(env)
        self.view = LiveEpochView.from_config(self.config)
        self.inflight = InFlight()
        self.store = EpochEventStore(
            capacity=self.config.buffer_events, view=self.view, inflight=self.inflight
        )
        sessions = SessionRegistry()
        inner_app = inner(self.store, sessions)
        self._guard = ResumptionGuard(
            inner_app, self.store, inflight=self.inflight, sessions=sessions
        )
        self._guard.handoff = self.handoff = Handoff(
            config=self.config,
            registry=self._guard.sessions,
            inflight=self.inflight,
            buffer=lambda: self.store.buffer,
            epoch=lambda: self.store.epoch,
            snapshot=self.store.snapshot,
            enabled=self.config.handoff,
        )
        self._guard.wait_view = self._wait_view
        self._adopter = Adopter(
            inner_app,
            self._guard.sessions,
            epoch=lambda: self.store.epoch,
            snapshot=self.store.snapshot,
            wait_view=self._wait_view,
        )
        self._end_listens = None if on_drain is None else on_drain(self._guard.is_draining)
        self._problems = problems
        self._metrics = metrics
        self._first_sync_timeout = first_sync_timeout
        self.process_start: ProcessStart | None = None
        self.last_drain: DrainResult | None = None
        self._inner = inner_app
        #: A scope the server gave a real request: in-process requests are built on it.
        self._template: Scope | None = None
        #: Set by the server serving this app (``mcp_epoch.serve``): drain as its exit signal
        #: would (its listener closes at the end), without exiting. A drain request uses it.
        self.drain_trigger: Callable[[], Awaitable[DrainResult]] | None = None

    @property
    def epoch(self) -> ProcessEpoch:
        """This process's epoch (known once started)."""
        return self.store.epoch

    async def start(self) -> None:
        """Register this process start and begin following the ledger (idempotent)."""
        if self.process_start is not None:
            return
        start = await anyio.to_thread.run_sync(start_process_epoch, self.config)
        self.store.bind(start.epoch)
        self.process_start = start
        ring = follower()
        if ring is not None:
            # Before serving: a state sealed by a peer opens here only with the server's ring.
            ring.start(start.epoch, start.registered)
            if not await anyio.to_thread.run_sync(ring.wait_loaded, self._first_sync_timeout):
                log.error(
                    "no request-state ring after %.1fs (%s): not ready until it loads",
                    self._first_sync_timeout,
                    ring.last_error,
                )
        if self.view is None:
            return
        self.view.start()
        synced = await anyio.to_thread.run_sync(
            self.view.wait_for, lambda snap: snap.ledger_id is not None, self._first_sync_timeout
        )
        if not synced:
            log.warning(
                "no copy of the ledger after %.1fs; serving, foreign cursors read as 'unknown' "
                "until the epoch service answers (%s)",
                self._first_sync_timeout,
                self.view.last_error,
            )

    async def _wait_view(self, predicate: Callable[[EpochSnapshot], bool], limit: float) -> bool:
        """Wait (off the event loop) until this process's copy of the ledger satisfies
        ``predicate``; False at once without a copy."""
        view = self.view
        if view is None:
            return False
        return await anyio.to_thread.run_sync(view.wait_for, predicate, limit)

    @property
    def forwarded(self) -> int:
        """Requests this process handed to their owners so far."""
        return self._guard.forwarder.forwarded

    async def drain(
        self, deadline: float | None = None, *, stop_accepting: Callable[[], None] | None = None
    ) -> DrainResult:
        """Take no new sessions or calls, and wait until the calls in flight are delivered.

        ``deadline`` defaults to ``MCP_EPOCH_DRAIN_SECONDS``. New sessions go to a live peer
        (or are served here when there is none). This process's sessions are handed on to a
        live peer (:mod:`mcp_epoch._internal.handoff`), each once nothing of it is in flight,
        and a new call on one follows it there; where no session can move, new calls are
        rejected before they start, so clients move to a fresh session. Requests this process
        forwards count as in flight until their relay ends. Once nothing is in flight and
        every session that can move has, ``stop_accepting()`` (the server closing its
        listener) runs and the drain waits again for what arrived in between, so nothing
        accepted is cut at exit. Returns what was left in flight at the deadline (0 after a
        clean drain).
        """
        limit = self.config.drain_seconds if deadline is None else deadline
        self._guard.draining = True
        if self._end_listens is not None:
            self._end_listens()
        began = time.monotonic()
        waiting, relays = len(self.inflight), self.inflight.relays
        log.info(
            "draining: %d calls and %d forwarded requests in flight, at most %.0fs",
            waiting - relays,
            relays,
            limit,
        )
        handoff = self.handoff
        with anyio.move_on_after(limit) as deadline_scope:
            await handoff.hand_on_all()
            await self.inflight.wait_idle()
            if stop_accepting is not None:
                stop_accepting()
                await handoff.hand_on_all()
                await self.inflight.wait_idle()
        handoff.over()
        left = [t for t in self._guard.sessions.tags() if t.moved_to is None]
        kept = len(left)
        if deadline_scope.cancelled_caught:
            await self._end_sessions(left)
        result = DrainResult(
            waiting,
            len(self.inflight),
            time.monotonic() - began,
            handed=handoff.handed,
            kept=kept if handoff.successor is not None else 0,
            hit_deadline=deadline_scope.cancelled_caught,
            held_by=tuple(self.inflight.pending()) if deadline_scope.cancelled_caught else (),
        )
        self.last_drain = result
        cut = self._guard.forwarder.cut_relays()  # endless GET streams, and any late POST
        if cut:
            log.info("cut %d forwarded streams; their clients resume elsewhere", cut)
        if result.hit_deadline:
            log.warning(
                "drain deadline of %.0fs passed with %d requests in flight (id, answered): %s; "
                "%d sessions end here, not handed on",
                limit,
                result.abandoned,
                list(result.held_by[:10]),
                kept,
            )
        else:
            log.info(
                "drained in %.2fs (%d in flight at the start, %d sessions handed on)",
                result.seconds,
                waiting,
                result.handed,
            )
        await self._report_drain(result)
        return result

    async def _report_drain(self, result: DrainResult) -> None:
        """Tell the epoch service how the drain ended (what Prometheus sees of it)."""
        start = self.process_start
        report = api.DrainReport(
            deadline=result.hit_deadline,
            in_flight=result.in_flight,
            abandoned=result.abandoned,
            handed=result.handed,
            kept=result.kept,
            seconds=round(result.seconds, 3),
        )
        registered = start.epoch if start is not None and start.registered else None
        await report_drain(self.config, registered, report)

    def drain_report(self) -> dict[str, Any]:
        """What the last drain did, and the handoff counters since start, as one JSON-able
        document (a supervisor reads it as the process exits; empty before any drain)."""
        d = self.last_drain
        if d is None:
            return {}
        health = self.health()
        return {
            "drained": round(d.seconds, 3),
            "in_flight": d.in_flight,
            "abandoned": d.abandoned,
            "forwarded": self.forwarded,
            "handed": d.handed,
            "kept": d.kept,
            "deadline": d.hit_deadline,
            "held_by": [f"{rid} ({'answered' if a else 'running'})" for rid, a in d.held_by],
            "adopted": health.adopted,
            "served_handed": health.served_handed,
            "tail_replays": health.tail_replays,
        }

    async def _end_sessions(self, tags: list[SessionTag]) -> None:
        """End the sessions a drain that ran out of time keeps (``DELETE``, in process): what
        they had pending fails now (their server-to-client requests included), instead of the
        SDK's shutdown waiting, per request, for a stream nobody reads any more (seconds each,
        which a kubelet's grace period does not have)."""
        template = self._template
        if template is None:
            return

        async def end(tag: SessionTag) -> None:
            assert template is not None and tag.session_id is not None
            tag.ending = True
            with contextlib.suppress(TimeoutError):
                await inprocess.request(
                    self._inner,
                    template,
                    "DELETE",
                    tag.path or str(template.get("path", "/")),
                    tag.host,
                    session=tag.session_id,
                    protocol_version=tag.protocol_version,
                )

        with anyio.move_on_after(END_SESSIONS_SECONDS):
            async with anyio.create_task_group() as tg:
                for tag in tags:
                    if tag.session_id is not None:
                        tg.start_soon(end, tag)

    async def close(self) -> None:
        """Stop following the ledger (forwards hold nothing between requests)."""
        ring = follower()
        if ring is not None:
            # Its thread may be held in a long poll on the ring (up to its wait): not waited
            # for beyond a moment. It is a daemon, and stops at its poll's answer.
            await anyio.to_thread.run_sync(ring.stop, 0.2)
        if self.view is not None:
            await anyio.to_thread.run_sync(self.view.stop)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[EpochSafeApp]:
        """Start and close around a block, for a host whose lifespan does not reach this app."""
        await self.start()
        try:
            yield self
        finally:
            await self.close()

    def health(self) -> Health:
        """What ``/readyz`` and ``/metrics`` report, now."""
        return Health(
            started=self.store.bound,
            draining=self._guard.is_draining(),
            view=self.view,
            forwarded=self.forwarded,
            registered=bool(self.process_start and self.process_start.registered),
            ring=follower(),
            handed=self.handoff.handed,
            adopted=self._adopter.adopted,
            served_handed=self._guard.served_handed,
            tail_replays=self._guard.tail_replays,
            extra=() if self._problems is None else tuple(self._problems()),
            extra_metrics=() if self._metrics is None else tuple(self._metrics()),
            epoch=str(self.store.epoch) if self.store.bound else "",
        )

    async def _probe(self, path: str, send: Send) -> None:
        health = self.health()
        if path == READY_PATH:
            status, body = health.readiness()
            await respond(send, status, body)
            return
        body = health.metrics()
        headers = [
            (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _served_before_start(self, path: str, scope: Scope, send: Send) -> bool:
        """Serve the drain request and the probes, which answer even before the process has
        its epoch; False for any other request (the drain path without a drain token, a
        probe path asked with another method), which goes on as every request does."""
        if path == DRAIN_PATH and self.config.drain_token:
            await self._drain_request(scope, send)
            return True
        if path in (READY_PATH, METRICS_PATH) and scope["method"] == "GET":
            await self._probe(path, send)
            return True
        return False

    async def _drain_request(self, scope: Scope, send: Send) -> None:
        """``GET`` :data:`~mcp_epoch.contract.DRAIN_PATH` with the pod's drain token: wait the
        preStop time, drain, and answer once the drain is over (the sidecar's main container
        runs this as its preStop, so the kubelet signals the server only after it). The process
        keeps running, its listener closed, until its own signal comes."""
        token = self.config.drain_token
        given = dict(scope["headers"]).get(DRAIN_TOKEN_HEADER.encode(), b"")
        if token is None or not hmac.compare_digest(bytes(given), token.encode()):
            log.warning("refused a drain request without this pod's drain token")
            await respond(send, 403, error_body("a drain request needs this pod's drain token"))
            return
        await anyio.sleep(self.config.prestop_seconds)
        result = await (self.drain_trigger() if self.drain_trigger is not None else self.drain())
        body = {
            "drained": round(result.seconds, 3),
            "in_flight": result.in_flight,
            "abandoned": result.abandoned,
            "handed": result.handed,
            "deadline": result.hit_deadline,
        }
        await respond(send, 200, json.dumps(body).encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":  # every request: one test for the common case
            path = scope["path"]
            if path in _OWN_PATHS and await self._served_before_start(path, scope, send):
                return
            if not self.store.bound:
                await respond(send, 503, error_body(NOT_STARTED, code=INTERNAL_ERROR))
            elif path == HANDOFF_PATH:
                await self._adopter(scope, receive, send)
            else:
                if self._template is None:
                    self._template = {k: v for k, v in scope.items() if k != "headers"}
                await self._guard.handle(scope, receive, send)
            return
        if scope["type"] != "lifespan":
            await self._guard(scope, receive, send)
            return

        async def lifespan_receive() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.start()
            elif message["type"] == "lifespan.shutdown":
                await self.close()
            return message

        await self._guard(scope, lifespan_receive, send)
