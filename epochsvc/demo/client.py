"""The scenario's clients: one long-lived MCP session each, busy with checked tool calls.

A client runs ``work`` calls back to back. Each call streams progress notifications and makes
the server ask the client (elicitation) every few steps; the tool awaits the answer. Everything
the client accepts (progress, questions, the result) goes through a :class:`CallCheck`, and
every ``Last-Event-ID`` reconnect is observed on the HTTP responses (status, and which replica
answered, from the balancer's ``X-Demo-Backend``), so each reconnect is classified as
same-process or cross-process and as lossless or not by what the call accepts next.

* :class:`NaiveClient` is the SDK client's plain behaviour (``mcp.Client``): it reconnects as
  the SDK does and believes what it gets. Only when a call passes its deadline does the user
  give up on the session and open a new one (that call counts as hung).
* :class:`EpochDemoClient` uses :class:`mcp_epoch.EpochClient`, the rejection path:
  a rejected resumption fails the pending call at once and the next request opens a new
  session; the client measures how long that re-initialization took. A call that passes its
  deadline (hung) makes the user give up on that client and open a new one, as above.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT

from epochsvc.demo.balancer import BACKEND_HEADER, CLIENT_HEADER
from epochsvc.demo.checker import REPLICA_HEADER, CallCheck
from mcp_epoch import EpochClient, ResumptionRejected
from mcp_epoch.contract import (
    FORWARDED_BY_HEADER,
    REJECTED_HEADER,
    SERVED_BY_HEADER,
    TAIL_OF_HEADER,
)


@dataclass(frozen=True)
class CallShape:
    """What every call asks the server for; ``deadline`` bounds a call (hung after it)."""

    steps: int = 30
    interval: float = 0.1
    ask_every: int = 10
    close_every: int = 0
    slack: float = 6.0

    @property
    def asks(self) -> int:
        return self.steps // self.ask_every if self.ask_every else 0

    @property
    def deadline(self) -> float:
        return self.steps * self.interval + self.slack


@dataclass
class Reinit:
    """A rejection seen by the client and what followed it."""

    reason: str
    seconds: float | None  # None: no new session came up


@dataclass
class ClientResult:
    client: str
    calls: list[CallCheck] = field(default_factory=list)
    reinits: list[Reinit] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Every ``Mcp-Resumption-Rejected`` reason this client was answered with.
    reasons: dict[str, int] = field(default_factory=dict)
    #: When (monotonic) each of those rejections arrived, and each response that came through
    #: a forward to the session's owner (``Mcp-Epoch-Forwarded-By``): the report's timeline.
    rejected_at: list[float] = field(default_factory=list)
    forwarded_at: list[float] = field(default_factory=list)


class DemoClient(abc.ABC):
    """The call loop and the checks; subclasses say how a session is held."""

    def __init__(self, index: int, url: str, shape: CallShape, stop: asyncio.Event) -> None:
        self.name = f"c{index:03d}"
        self.url = url
        self.shape = shape
        self.stop = stop
        self.result = ClientResult(self.name)
        self._calls = 0
        self._current: CallCheck | None = None
        self._current_session = 0
        self._stream_origin: str | None = None

    # --- what the client accepts ----------------------------------------------------------

    async def on_elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """Check the question against the ground truth and echo its token as the answer."""
        message = getattr(params, "message", "")
        if self._current is not None:
            self._current.accept(message, "ask")
        return types.ElicitResult(action="accept", content={"token": message})

    def dropped(self) -> None:
        """The network cut connections of this client (the scenario's drop)."""
        if self._current is not None:
            self._current.drop_hit()

    def observe(self, session: int, response: httpx2.Response) -> None:
        """Every HTTP response of this client: find the call's stream and its reconnects.

        The process that answered is the one mcp-epoch names (``Mcp-Epoch-Served-By``: the
        sidecar answers resumptions itself, where the server behind it names nothing), else
        the one the replica names (``X-Demo-Replica``; a forwarded answer carries its owner's
        name), else the balancer's choice."""
        reason = response.headers.get(REJECTED_HEADER)
        forwarded = FORWARDED_BY_HEADER in response.headers
        if response.status_code == 404 and reason:
            self.result.reasons[reason] = self.result.reasons.get(reason, 0) + 1
            self.result.rejected_at.append(time.monotonic())
        if forwarded:
            self.result.forwarded_at.append(time.monotonic())
        call = self._current
        if call is None or session != self._current_session:
            return
        request = response.request
        served = (
            response.headers.get(SERVED_BY_HEADER)
            or response.headers.get(REPLICA_HEADER)
            or response.headers.get(BACKEND_HEADER)
        )
        if request.method == "POST" and b'"tools/call"' in request.content:
            ctype = response.headers.get("content-type", "")
            if ctype.startswith("text/event-stream"):
                self._stream_origin = served
            elif response.status_code == 404:
                call.refused = True  # the server refused the call before it ran
        elif request.method == "GET" and "last-event-id" in request.headers:
            origin = self._stream_origin
            same = None if origin is None or served is None else served == origin
            from_tail = TAIL_OF_HEADER in response.headers
            call.reconnected(
                None if from_tail else same,
                response.status_code,
                forwarded=forwarded,
                from_tail=from_tail,
            )
            if response.status_code < 300:
                self._stream_origin = served
        elif response.status_code == 404 and call.outcome == "pending":
            call.session_refused = request.method  # the session is gone under the call

    def _new_call(self, session: int) -> tuple[CallCheck, dict[str, Any]]:
        self._calls += 1
        uid = f"{self.name}s{session}"
        call = CallCheck(uid, f"k{self._calls}", self.shape.steps, self.shape.asks)
        call.started_at = time.monotonic()
        self.result.calls.append(call)
        self._current, self._current_session, self._stream_origin = call, session, None
        args = {
            "uid": uid,
            "call": call.call,
            "steps": self.shape.steps,
            "interval": self.shape.interval,
            "ask_every": self.shape.ask_every,
            "close_every": self.shape.close_every,
        }
        return call, args

    async def _answer(
        self, call: CallCheck, answer: Awaitable[types.CallToolResult]
    ) -> types.CallToolResult:
        """The call's answer within its deadline. Whatever ends the wait (the answer, an
        error, the deadline, a cancelled session) stamps the call's end for the timeline."""
        try:
            return await asyncio.wait_for(answer, self.shape.deadline)
        finally:
            call.ended_at = time.monotonic()

    @staticmethod
    def _progress(call: CallCheck) -> ProgressFnT:
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            call.accept(message, "step")

        return on_progress

    @staticmethod
    def _finish(call: CallCheck, result: types.CallToolResult) -> None:
        content = result.content[0] if result.content else None
        text = getattr(content, "text", None)
        if result.is_error:
            call.finish("failed")
            return
        call.accept(text, "done")
        call.finish("completed")

    @abc.abstractmethod
    async def run(self) -> ClientResult:
        """Run calls until ``stop`` is set, then let the last call end (or hang)."""


class NaiveClient(DemoClient):
    """The SDK client as it comes: ``mcp.Client`` over Streamable HTTP."""

    async def run(self) -> ClientResult:
        session = 0
        while not self.stop.is_set():
            session += 1
            try:
                await self._session(session)
            except Exception as exc:  # the session could not open, or the SDK client crashed
                self.result.errors.append(f"session {session}: {exc!r}")
                call = self._current
                if call is not None and call.outcome == "pending":
                    # The SDK client's task group died under the call (mcp 2.3: one POST that
                    # gets no response ends the whole session): it failed, it did not hang.
                    call.failed_with(exc)
                await asyncio.sleep(0.2)
        return self.result

    async def _session(self, session: int) -> None:
        # The SDK's own defaults for its HTTP client: 30 s, and 300 s to read a stream.
        timeout = httpx2.Timeout(30.0, read=300.0)
        http = httpx2.AsyncClient(headers={CLIENT_HEADER: self.name}, timeout=timeout)

        async def hook(response: httpx2.Response) -> None:
            self.observe(session, response)

        http.event_hooks = {"request": [], "response": [hook]}
        async with (
            http,
            Client(
                streamable_http_client(self.url, http_client=http, terminate_on_close=False),
                mode="legacy",
                elicitation_callback=self.on_elicit,
            ) as client,
        ):
            while not self.stop.is_set():
                call, args = self._new_call(session)
                try:
                    result = await self._answer(
                        call, client.call_tool("work", args, progress_callback=self._progress(call))
                    )
                except TimeoutError:
                    call.finish("hung")
                    return  # the user gives up on this session and opens a new one
                except Exception as exc:
                    call.failed_with(exc)
                    if not call.refused:
                        self.result.errors.append(f"{call.uid}/{call.call}: {exc!r}")
                    await asyncio.sleep(0.1)
                    return  # an error ends this session for the user too: start a new one
                self._finish(call, result)


class EpochDemoClient(DemoClient):
    """The mcp-epoch client: ``EpochClient`` and its rejection path."""

    def __init__(self, index: int, url: str, shape: CallShape, stop: asyncio.Event) -> None:
        super().__init__(index, url, shape, stop)
        self._rejected_at: dict[int, tuple[float, str]] = {}
        self._ready_at: dict[int, float] = {}
        #: Sessions opened by the clients this one gave up on: numbers go on across clients.
        self._sessions = 0

    def _observe(self, response: httpx2.Response, session: int, rejected: bool) -> None:
        if response.status_code < 400:
            self._ready_at.setdefault(session, time.monotonic())  # the session answers
        if rejected and session not in self._rejected_at:
            reason = response.headers.get(REJECTED_HEADER, "unknown")
            self._rejected_at[session] = (time.monotonic(), reason)
        call = self._current
        if call is not None and call.outcome == "pending" and session > self._current_session:
            # A pending call runs on the newest session the client opened: one opened under
            # it (the last one had lost its connection, or refused the call) is the call's.
            self._current_session = session
        self.observe(session, response)

    async def run(self) -> ClientResult:
        while not self.stop.is_set():
            await self._one_client()
        self._fold_reinits()
        return self.result

    async def _one_client(self) -> None:
        """Calls on one ``EpochClient`` until ``stop``, or until a call hangs: then the user
        gives up on that client and opens a new one, as with the plain SDK client. Carrying on
        would let the hung call's stream, which the SDK keeps reading, bring a later question
        of its tool (a server need not stop a tool its client cancelled) to the next call."""
        base = self._sessions
        ec = EpochClient(
            self.url,
            on_response=lambda response, n, rejected: self._observe(response, base + n, rejected),
            headers={CLIENT_HEADER: self.name},
            min_backoff=0.05,
            elicitation_callback=self.on_elicit,
        )
        try:
            async with ec:
                self._ready_at[base + ec.session_number] = time.monotonic()
                while not self.stop.is_set():
                    session = base + ec.session_number
                    call, args = self._new_call(session)
                    try:
                        result = await self._answer(
                            call,
                            ec.call_tool("work", args, progress_callback=self._progress(call)),
                        )
                    except ResumptionRejected:
                        call.finish("rejected")
                        await self._reinit(ec, base)
                        continue
                    except TimeoutError:
                        call.finish("hung")
                        return
                    except Exception as exc:
                        call.failed_with(exc)
                        self.result.errors.append(f"{call.uid}/{call.call}: {exc!r}")
                        await asyncio.sleep(0.1)
                        continue
                    self._ready_at.setdefault(session, time.monotonic())
                    self._finish(call, result)
                if self._rejected_at and max(self._rejected_at) >= max(self._ready_at):
                    await self._reinit(ec, base)  # a rejection after the last call: re-init
        finally:
            self._sessions = base + ec.session_number

    async def _reinit(self, ec: EpochClient, base: int) -> None:
        """The next request opens a new session; a ping is the cheapest next request."""
        for _ in range(3):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ec.run(lambda c: c.send_ping()), 10.0)
                self._ready_at.setdefault(base + ec.session_number, time.monotonic())
                return
            await asyncio.sleep(0.1)

    def _fold_reinits(self) -> None:
        for number, (at, reason) in sorted(self._rejected_at.items()):
            later = [t for n, t in self._ready_at.items() if n > number and t >= at]
            self.result.reinits.append(Reinit(reason, min(later) - at if later else None))


def make_client(
    kind: str, index: int, url: str, shape: CallShape, stop: asyncio.Event
) -> DemoClient:
    """``epoch``: :class:`EpochDemoClient`; ``plain``: the SDK client as it comes."""
    cls: type[DemoClient] = EpochDemoClient if kind == "epoch" else NaiveClient
    return cls(index, url, shape, stop)


def drop_schedule(rng: random.Random, mean: float, start: float, end: float) -> list[float]:
    """Random drop moments (a Poisson process of rate 1/mean) in [start, end)."""
    out: list[float] = []
    t = start + rng.expovariate(1.0 / mean)
    while t < end:
        out.append(t)
        t += rng.expovariate(1.0 / mean)
    return out
