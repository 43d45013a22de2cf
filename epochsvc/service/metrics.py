"""Prometheus metrics; one registry per app so that tests and several apps never collide."""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from epochsvc.service.held import HOLD
from epochsvc.service.store.base import CommitStats, EpochStore, StoreUnavailable
from mcp_epoch.api import DRAIN_OUTCOMES


def _le(bound: float) -> str:
    """A bucket's bound as the exposition writes it (``1.0``, ``+Inf``)."""
    return "+Inf" if bound == math.inf else repr(bound)


class _Series:
    """One label set's bucket counts (not cumulative) and sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect.bisect_left(self._bounds, amount)] += 1  # le: amount <= bound
        self.sum += amount


class Latency(Collector):
    """A histogram by label set, observed with no lock.

    prometheus_client's ``Histogram`` takes a lock twice and walks its buckets in Python on
    every observation: a fifth of what waking thousands of held long polls cost, each observed
    as it is answered. The service observes from its one event loop thread, which also renders
    the exposition, so plain counts do. The exposition is the same family: buckets, count and
    sum per label set."""

    def __init__(
        self, name: str, documentation: str, labelnames: tuple[str, ...], buckets: Iterable[float]
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self._bounds = sorted({*map(float, buckets), math.inf})
        self._series: dict[tuple[str, ...], _Series] = {}

    def labels(self, *values: str) -> _Series:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = _Series(self._bounds)
        return series

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in self._series.items():
            cumulative = list(itertools.accumulate(series.counts))
            family.add_metric(
                list(values),
                [(_le(b), n) for b, n in zip(self._bounds, cumulative, strict=True)],
                series.sum,
            )
        yield family


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.issued = Counter(
            "epochsvc_epochs_issued_total",
            "Pod epochs issued (idempotent repeats not counted)",
            ["namespace", "server"],
            registry=self.registry,
        )
        self.epochs = Gauge(
            "epochsvc_epochs",
            "Epochs in the ledger by server and state",
            ["namespace", "server", "state"],
            registry=self.registry,
        )
        self.latency = Latency(
            "epochsvc_request_duration_seconds",
            "Request latency by route (long polls included)",
            ("method", "route", "status"),
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 60),
        )
        self.registry.register(self.latency)
        self.auth_refused = Counter(
            "epochsvc_auth_refused_total",
            "Requests whose credentials were refused or could not be verified, by code",
            ["code"],
            registry=self.registry,
        )
        self.waiters = Gauge(
            "epochsvc_longpoll_waiters", "Long polls currently held", registry=self.registry
        )
        self.store_up = Gauge(
            "epochsvc_store_up",
            "1 if the ledger's store answered the last look (each scrape queries it, /readyz "
            "pings it), 0 if not; a request the store fails sets 0 at once",
            registry=self.registry,
        )
        self.store_unavailable = Counter(
            "epochsvc_store_unavailable",
            "Requests answered 503 store-unavailable: the ledger's store did not answer",
            registry=self.registry,
        )
        self.drains = Counter(
            "epochsvc_drains",
            "Drains of MCP server processes, as each reported it before exiting, by outcome: "
            "clean, or deadline (calls still in flight were cut)",
            ["namespace", "server", "outcome"],
            registry=self.registry,
        )
        self.commits = _CommitCounters()
        self.registry.register(self.commits)

    def observe_request(self, scope: Scope, status: int, started: float) -> None:
        """One request, answered with ``status``, begun at ``started`` (``perf_counter``),
        by route template (not raw path, which would make one series per epoch)."""
        self.observe(
            scope["method"], getattr(scope.get("route"), "path", "unmatched"), status, started
        )

    def observe(self, method: str, route: str, status: int, started: float) -> None:
        """One request to ``route`` (its template), answered outside the routes' own frames."""
        self.latency.labels(method, route, str(status)).observe(time.perf_counter() - started)

    def store_answered(self, up: bool) -> None:
        """What the service just learnt of its store; a 503 it causes is counted too."""
        self.store_up.set(int(up))
        if not up:
            self.store_unavailable.inc()

    async def render(self, store: EpochStore, waiters: int) -> bytes:
        """The exposition. A store that does not answer leaves the epochs by state out and
        says so in ``epochsvc_store_up``: the scrape itself still succeeds, so the outage is
        seen as what it is, not as the service being down."""
        self.waiters.set(waiters)
        self.commits.stats = store.commit_stats()
        self.epochs.clear()
        try:
            counts = await store.state_counts()
        except StoreUnavailable:
            self.store_up.set(0)
            counts = []
        else:
            self.store_up.set(1)
        for namespace, server, state, count in counts:
            self.epochs.labels(namespace, server, state).set(count)
        # Every server in the ledger has its drain series from 0: a counter Prometheus first
        # sees at 1 has no increase, and the first drain that hit its deadline would never
        # fire the alert on it.
        for namespace, server in {(ns, server) for ns, server, _, _ in counts}:
            for outcome in DRAIN_OUTCOMES:
                self.drains.labels(namespace, server, outcome)
        return generate_latest(self.registry)


class _CommitCounters(Collector):
    """The group committer's totals: divided by ``epochsvc_group_commits_total`` they say what
    one commit carries and costs (writes, statements, round trips, seconds)."""

    def __init__(self) -> None:
        self.stats = CommitStats()  # the store's, handed over at each render

    def collect(self) -> Iterable[Metric]:
        for name, help_, value in (
            ("commits", "Group commits (one durable commit each)", self.stats.commits),
            ("commit_writes", "Writes carried by group commits", self.stats.writes),
            (
                "commit_statements",
                "Statements sent by group commits (a round trip each on PostgreSQL)",
                self.stats.statements,
            ),
            (
                "commit_round_trips",
                "Round trips to the database by group commits (BEGIN, COMMIT and pings included)",
                self.stats.round_trips,
            ),
            (
                "commit_seconds",
                "Writer time in group commits, BEGIN to the end of COMMIT",
                self.stats.seconds,
            ),
        ):
            family = CounterMetricFamily(f"epochsvc_group_{name}", help_)
            family.add_metric([], value)
            yield family


class ObserveLatency:
    """Pure ASGI middleware timing every request (:meth:`Metrics.observe_request`)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            if not scope.get(HOLD):  # a held poll is observed when it is answered (.held)
                self.metrics.observe_request(scope, status, started)
