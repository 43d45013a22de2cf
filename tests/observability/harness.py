"""What the alert tests share: the chart's alerts evaluated over scrapes of real components.

:class:`AlertWatch` is a small Prometheus: it scrapes its targets when the test says, on the
test's clock, and evaluates any alert of the chart at the last scrape. Its clock advances one
scrape interval per scrape; :meth:`AlertWatch.after_window` stamps the next scrape one rate
window later instead ("the fault has lasted five minutes"): what the components expose is
real, only its timestamp is chosen, so ratios over ``[5m]`` see the fault and not the healthy
minutes before it, as they do in Prometheus once the fault has lasted that long.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import httpx

from tests.observability.promql import Element, Evaluator
from tests.observability.rules import AlertRule, firing, load_alerts
from tests.observability.tsdb import Scraper, Target, parse_exposition
from tests.operator.support import wait_for

#: The rules' rate windows are at most 15 minutes; a jump of one such window leaves the
#: healthy samples behind for every alert.
WINDOW_SECONDS = 15 * 60.0


class AlertWatch:
    def __init__(self, targets: Iterable[Target] = ()) -> None:
        self.scraper = Scraper(targets)
        self.evaluator = Evaluator(self.scraper.store)
        self.alerts: dict[str, AlertRule] = load_alerts()

    @property
    def now(self) -> float:
        assert self.scraper.now is not None, "nothing scraped yet"
        return self.scraper.now

    def add(self, *targets: Target) -> None:
        self.scraper.targets.extend(targets)

    def remove(self, target: Target) -> None:
        self.scraper.targets.remove(target)

    def scrape(self) -> float:
        return self.scraper.scrape()

    def after_window(self) -> float:
        """Scrape, stamped one rule window after the previous scrape."""
        return self.scraper.scrape(self.now + WINDOW_SECONDS)

    def scraped(self, metric: str, **labels: str) -> float:
        """The sum of ``metric``'s series (with ``labels``) in the last scrape (0: none)."""
        found = self._scraped_or_none(metric, **labels)
        return 0.0 if found is None else found

    def _scraped_or_none(self, metric: str, **labels: str) -> float | None:
        matchers = ",".join(f'{k}="{v}"' for k, v in labels.items())
        found = self.evaluator.vector(f"sum({metric}{{{matchers}}})", self.now)
        return found[0].value if found else None

    def scrape_when_grown(self, url: str, metric: str, within: float = 30, **labels: str) -> None:
        """Scrape once the counter ``metric`` (with ``labels``), live at ``url``, has grown
        beyond what the last scrape saw: the next sample carries news."""
        seen = self.scraped(metric, **labels)

        def grown() -> bool:
            return metric_sum(url, metric, **labels) > seen

        wait_for(grown, within, f"{metric}{labels or ''} at {url} to grow past {seen:g}")
        self.scrape()

    def scrape_until_fires(
        self, alert: str, url: str, metric: str, within: float = 30, **labels: str
    ) -> None:
        """Prometheus scraping on while the fault lasts: a scrape each time the counter the
        alert reads has grown, until the alert's expression is non-empty or ``within`` has
        passed (then :meth:`fires` says what was found). More than one scrape may be needed:
        a rate needs two differing samples of one series, and a series born after a scrape
        (a first refusal, a first unavailable call of a kind) is first seen at its value."""
        deadline = time.monotonic() + within
        while not self.firing(alert) and time.monotonic() < deadline:
            self.scrape_when_grown(url, metric, max(deadline - time.monotonic(), 0.1), **labels)

    def firing(self, alert: str) -> list[Element]:
        return firing(self.evaluator, self.alerts[alert], self.now)

    def quiet(self, *alerts: str) -> None:
        """Each of ``alerts`` evaluates to nothing at the last scrape."""
        loud = {name: self.firing(name) for name in alerts}
        loud = {name: found for name, found in loud.items() if found}
        assert not loud, f"firing in the healthy state: {loud} ({self._errors()})"

    def fires(self, alert: str, **labels: str) -> list[Element]:
        """``alert`` evaluates to at least one element (with ``labels``, if given)."""
        found = self.firing(alert)
        matching = [e for e in found if all(e.metric.get(k) == v for k, v in labels.items())]
        assert matching, (
            f"{alert} does not fire at t={self.now:g} with {labels or 'any labels'}: "
            f"{self.alerts[alert].expr!r} gave {found} ({self._errors()})"
        )
        return matching

    def _errors(self) -> str:
        errors = {t.job: e for t, e in self.scraper.errors.items()}
        return f"scrape errors: {errors}" if errors else "every scrape succeeded"


def metric_sum(url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples with ``labels`` on a live ``/metrics`` (what a test
    waits on before it scrapes: "the counter has moved")."""
    samples = parse_exposition(httpx.get(url, timeout=5).text)
    return sum(
        value
        for found, value in samples
        if found["__name__"] == name and all(found.get(k) == v for k, v in labels.items())
    )
