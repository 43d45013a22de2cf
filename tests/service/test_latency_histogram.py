"""The request-latency histogram the service keeps without locks: what Prometheus reads from
it is what a ``prometheus_client`` histogram with the same buckets would expose."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from epochsvc.service.metrics import Latency

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 60)
#: Below, on, between and beyond the bounds: a bound is inclusive (``le``).
AMOUNTS = (0.0, 0.0005, 0.001, 0.0011, 0.25, 0.3, 1.0, 59.9, 60.0, 61.0, 3600.0)


def _samples(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_the_exposition_is_a_prometheus_histograms_for_the_same_observations() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    latency = Latency("req_seconds", "latency", ("route", "status"), BUCKETS)
    ours.register(latency)
    reference = Histogram(
        "req_seconds", "latency", ["route", "status"], buckets=BUCKETS, registry=theirs
    )
    for i, amount in enumerate(AMOUNTS):
        labels = ("/a", "200") if i % 3 else ("/b", "503")
        latency.labels(*labels).observe(amount)
        reference.labels(*labels).observe(amount)
    assert _samples(ours) == _samples(theirs)
