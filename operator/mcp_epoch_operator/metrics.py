"""The operator's Prometheus metrics, on a port of its own (``--metrics-port``).

What a platform team needs to see when pods are slow to admit or epochs lag their pods: how
long the webhook takes (buckets from 1 ms, fine enough to tell the epoch service's few
milliseconds from the operator's own time), how reconciles go, and how the epoch service
answers (by call and outcome, how long the operator waited for it, plus the attempts repeated
after an outage).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

#: Admission is on the critical path of every pod create: resolve 1-100 ms finely.
WEBHOOK_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Admission = Literal["issued", "refused", "skipped"]
ServiceOutcome = Literal["ok", "refused", "unavailable"]


class _Sum(Collector):
    """A counter read at each scrape: the sum of counters kept elsewhere (on another thread's
    objects, which count without a lock of the registry's)."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self.reads: list[Callable[[], int]] = []

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation)
        family.add_metric([], sum(read() for read in self.reads))
        yield family


class OperatorMetrics:
    """One registry per operator process (not the global one: tests start several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.webhook = Histogram(
            "mcp_epoch_operator_webhook_seconds",
            "Time the epoch-injecting webhook took per pod admission, by outcome.",
            ["outcome"],
            buckets=WEBHOOK_BUCKETS,
            registry=self.registry,
        )
        # Every outcome from 0: a refusal must show as an increase even when it is the first
        # (a series first seen at 1 has none, and the alert on refusals would miss it).
        for outcome in get_args(Admission):
            self.webhook.labels(outcome)
        self.reconcile = Histogram(
            "mcp_epoch_operator_reconcile_seconds",
            "Time one reconcile of a server took (owned objects, ledger vs pods, status).",
            ["result"],
            buckets=RECONCILE_BUCKETS,
            registry=self.registry,
        )
        self.service_calls = Counter(
            "mcp_epoch_operator_epoch_service_calls",
            "Epoch service calls by call and outcome (refused: it answered no).",
            ["call", "outcome"],
            registry=self.registry,
        )
        self.service_seconds = Histogram(
            "mcp_epoch_operator_epoch_service_seconds",
            "Time the operator waited for the epoch service per call, retries included, by "
            "call and outcome (the webhook's issue is part of its admission time).",
            ["call", "outcome"],
            buckets=WEBHOOK_BUCKETS,
            registry=self.registry,
        )
        self.rotation_stalled = Gauge(
            "mcp_epoch_operator_request_state_rotation_stalled",
            "1 while a server's request-state key rotation waits on pods that do not hold its "
            "revision for longer than the stall time, else 0.",
            ["namespace", "server"],
            registry=self.registry,
        )
        self.forwarded = Counter(
            "mcp_epoch_operator_admissions_forwarded",
            "Admissions this process forwarded to the admission lease's holder, by outcome "
            "(relayed: the holder answered; unreachable: none could be reached in time, so the "
            "pod was refused).",
            ["outcome"],
            registry=self.registry,
        )
        for outcome in ("relayed", "unreachable"):
            self.forwarded.labels(outcome)
        self.lease_held = Gauge(
            "mcp_epoch_operator_admission_lease_held",
            "1 while this process holds the admission lease (it hands out pod epochs), else 0.",
            registry=self.registry,
        )
        self.pooled = Gauge(
            "mcp_epoch_operator_epoch_pool_epochs",
            "Pod epochs issued ahead and not yet handed out, over every server.",
            registry=self.registry,
        )
        #: The clients' counters (the worker's client, and the webhook's on its own thread).
        self._retries = _Sum(
            "mcp_epoch_operator_epoch_service_retries",
            "Epoch service attempts repeated after an outage answer (no answer, 502-504).",
        )
        self.registry.register(self._retries)
        self._pool_waits = _Sum(
            "mcp_epoch_operator_epoch_pool_waits",
            "Admissions that found their server's epoch pool empty and waited for a refill "
            "(the epoch service's durable issue): many mean the pools are too small for the "
            "bursts.",
        )
        self.registry.register(self._pool_waits)

    def follow_retries(self, read: Callable[[], int]) -> None:
        """Count one more client's repeated attempts (read at every scrape)."""
        self._retries.reads.append(read)

    def follow_pool_waits(self, read: Callable[[], int]) -> None:
        """Count one more epoch pool's admissions that waited for a refill."""
        self._pool_waits.reads.append(read)

    @contextmanager
    def reconciling(self) -> Iterator[None]:
        """Time one reconcile; one that raises counts as ``error`` (and still raises)."""
        began, result = time.perf_counter(), "error"
        try:
            yield
            result = "ok"
        finally:
            self.reconcile.labels(result).observe(time.perf_counter() - began)

    def admission(self, outcome: Admission, began: float) -> None:
        """One webhook call, from ``began`` (``time.perf_counter()``) until now."""
        self.webhook.labels(outcome).observe(time.perf_counter() - began)

    def service_call(self, call: str, outcome: ServiceOutcome, began: float) -> None:
        """One epoch service call, sent at ``began`` (``time.perf_counter()``), ended now."""
        self.service_calls.labels(call, outcome).inc()
        self.service_seconds.labels(call, outcome).observe(time.perf_counter() - began)

    def ring_stalled(self, key: tuple[str, str], stalled: bool) -> None:
        """What the last look at ``key``'s (namespace, server) ring found: an alert reads the
        gauge, so it is set at every look, not only when the stall is announced."""
        self.rotation_stalled.labels(*key).set(int(stalled))

    def forget_server(self, key: tuple[str, str]) -> None:
        """The server is gone: its series go too (a stalled one would otherwise alert on)."""
        with suppress(KeyError):  # its ring was never looked at
            self.rotation_stalled.remove(*key)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """``/metrics`` on ``addr:port`` (a daemon thread: nothing of it runs on kopf's loop)."""
        start_http_server(port, addr, registry=self.registry)
