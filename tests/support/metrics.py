"""Reading a Prometheus text exposition in tests: one sample, or every series name a query
could select."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

#: The series a family of each type exposes (the parser strips a counter's ``_total``).
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum"),
    "info": ("_info",),
}


def samples(text: str) -> list[Sample]:
    """Every sample of an exposition, parsed once: many are then read from one scrape."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def find(among: Iterable[Sample], name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` whose labels include ``labels`` (None: no such one)."""
    for s in among:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    return None


def sample(text: str, name: str, **labels: str) -> float | None:
    """:func:`find` in an exposition's text, parsed only up to the sample."""
    parsed = (s for family in text_string_to_metric_families(text) for s in family.samples)
    return find(parsed, name, **labels)


def series_names(text: str) -> set[str]:
    """Every series name the exposition declares, as a query names it (``x_total``,
    ``x_bucket``...). Taken from the families, so a labelled metric with no child yet (only
    its HELP and TYPE lines) counts too."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names
