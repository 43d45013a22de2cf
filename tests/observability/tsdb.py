"""Scrapes of real ``/metrics`` endpoints kept as time series, the way Prometheus keeps them.

The clock is the test's own: every scrape is stored at a timestamp the test chooses (by
default one scrape interval after the previous one), never the wall clock, so an evaluation
depends only on what the components exposed, in which order. A test causes a fault, waits for
a condition it can observe, and then scrapes.

What Prometheus does on a scrape, and so this store too:

* every series gets the target's labels (``job``, ``instance`` and any extra ones); an
  exposed label of the same name is kept as ``exported_<name>`` (``honor_labels: false``);
* ``up{job, instance}`` is 1 when the scrape succeeded and 0 when it failed (no answer, a
  status other than 200, an exposition that does not parse);
* a series that was in the target's previous scrape but is not in this one (or the whole
  target, when the scrape failed or the target went away) gets a staleness marker: an instant
  selector no longer returns it, though the five-minute lookback has not passed.

Not done: exposed timestamps (none of the components expose any), ``scrape_*`` series other
than ``up``, native histograms, relabelling.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: One series' identity: its labels (``__name__`` included), sorted, none with an empty value.
Labels = tuple[tuple[str, str], ...]

METRIC_NAME = "__name__"


def labels_of(mapping: Mapping[str, str]) -> Labels:
    """The canonical form of a label set: sorted by name, empty values dropped (Prometheus
    treats an empty label value as the label's absence)."""
    return tuple(sorted((k, v) for k, v in mapping.items() if v != ""))


@dataclass(frozen=True, slots=True)
class Point:
    """One sample; ``value`` None is a staleness marker (the series ended at ``t``)."""

    t: float
    value: float | None


class Store:
    """Append-only series of points, each series in time order."""

    def __init__(self) -> None:
        self._series: dict[Labels, list[Point]] = {}

    def append(self, labels: Labels, t: float, value: float | None) -> None:
        points = self._series.setdefault(labels, [])
        if points and t <= points[-1].t:
            raise ValueError(f"out of order sample for {labels!r}: {t} after {points[-1].t}")
        points.append(Point(t, value))

    def series(self) -> Iterator[tuple[Labels, list[Point]]]:
        yield from self._series.items()


@dataclass(frozen=True)
class Target:
    """One scrape target: what service discovery would hand Prometheus."""

    job: str
    url: str
    #: Extra target labels (``namespace``, ``pod``... as service discovery adds them).
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def instance(self) -> str:
        parts = urlsplit(self.url)
        return parts.netloc

    def target_labels(self) -> dict[str, str]:
        return {"job": self.job, "instance": self.instance, **self.labels}


class ScrapeFailed(Exception):
    pass


def parse_exposition(text: str) -> list[tuple[dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (labels with ``__name__``, value)."""
    try:
        return [
            ({METRIC_NAME: sample.name, **sample.labels}, float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except ValueError as exc:  # the parser's way of saying the text is not an exposition
        raise ScrapeFailed(f"unparsable exposition: {exc}") from exc


class Scraper:
    """Scrapes a set of targets into a :class:`Store`, each round at one timestamp."""

    def __init__(
        self,
        targets: Iterable[Target] = (),
        *,
        store: Store | None = None,
        interval: float = 15.0,
        timeout: float = 5.0,
    ) -> None:
        self.store = store if store is not None else Store()
        self.targets: list[Target] = list(targets)
        self.interval = interval
        self.timeout = timeout
        #: Timestamp of the last scrape round (None before the first).
        self.now: float | None = None
        #: Why each target's last scrape failed (absent: it succeeded).
        self.errors: dict[Target, str] = {}
        self._previous: dict[Target, set[Labels]] = {}

    def scrape(self, at: float | None = None) -> float:
        """One round over every target at ``at`` (default: one interval after the previous
        round, 0 for the first); returns the round's timestamp."""
        if at is None:
            at = 0.0 if self.now is None else self.now + self.interval
        if self.now is not None and at <= self.now:
            raise ValueError(f"scrape at {at} is not after the previous one at {self.now}")
        self.now = at
        for gone in [t for t in self._previous if t not in self.targets]:
            self._end(gone, set(), at)
            del self._previous[gone]
            self.errors.pop(gone, None)
        for target in self.targets:
            self._scrape_one(target, at)
        return at

    def _scrape_one(self, target: Target, at: float) -> None:
        base = target.target_labels()
        up_labels = labels_of({METRIC_NAME: "up", **base})
        try:
            samples = self._fetch(target)
        except ScrapeFailed as exc:
            self.errors[target] = str(exc)
            self._end(target, {up_labels}, at)
            self.store.append(up_labels, at, 0.0)
            return
        self.errors.pop(target, None)
        seen: set[Labels] = {up_labels}
        for exposed, value in samples:
            labels = labels_of(_with_target_labels(exposed, base))
            if labels in seen:  # Prometheus drops a duplicate sample within one scrape
                continue
            seen.add(labels)
            self.store.append(labels, at, value)
        self._end(target, seen, at)
        self.store.append(up_labels, at, 1.0)

    def _end(self, target: Target, seen: set[Labels], at: float) -> None:
        """Staleness markers for the target's series (``up`` included) that this round did
        not bring."""
        for labels in self._previous.get(target, set()) - seen:
            self.store.append(labels, at, None)
        self._previous[target] = seen

    def _fetch(self, target: Target) -> list[tuple[dict[str, str], float]]:
        try:
            response = httpx.get(target.url, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise ScrapeFailed(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise ScrapeFailed(f"HTTP {response.status_code}")
        return parse_exposition(response.text)


def _with_target_labels(exposed: dict[str, str], target: dict[str, str]) -> dict[str, str]:
    """Target labels win; an exposed label they would overwrite is kept as ``exported_``."""
    out = dict(exposed)
    for name, value in target.items():
        if name in out and out[name] != "":
            out[f"exported_{name}"] = out.pop(name)
        out[name] = value
    return out
