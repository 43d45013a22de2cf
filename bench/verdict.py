"""One way for every benchmark to judge a ratio to a floor measured in the same run.

A ratio is measured in rounds: each round measures the path and its floor back to back, so a
machine that speeds up or slows down moves both (on a shared two-core VM whole runs of one
thing after another differed by 20% or more). The verdict reads every round, not only the
median:

* ``met``: the median meets the target, and so do at least three rounds in four;
* ``MISSED``: the median misses it, and so do at least three rounds in four;
* ``noisy``: fewer rounds than the benchmark needs to judge, or rounds that disagree. A quick
  run says so rather than "met" from too few samples.

Every verdict is printed as one line beginning ``ratio:``, which ``python -m bench`` gathers
into its closing summary.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

#: The share of rounds that must agree with the median for a verdict other than noisy.
AGREEMENT = 0.75


@dataclass(frozen=True)
class Ratio:
    """``path`` over ``floor``, one value per round, against ``target`` (``at_most``: the
    ratio must not exceed it; otherwise it must reach it)."""

    path: str
    floor: str
    rounds: tuple[float, ...]
    target: float
    at_most: bool
    min_rounds: int = 3
    #: What the figures are: ``x`` for a ratio, `` ms`` for a difference in milliseconds.
    unit: str = "x"

    def _meets(self, value: float) -> bool:
        return value <= self.target if self.at_most else value >= self.target

    @property
    def median(self) -> float:
        return statistics.median(self.rounds) if self.rounds else float("nan")

    @property
    def verdict(self) -> str:
        if len(self.rounds) < self.min_rounds:
            return "noisy"
        meeting = sum(self._meets(r) for r in self.rounds) / len(self.rounds)
        if self._meets(self.median) and meeting >= AGREEMENT:
            return "met"
        if not self._meets(self.median) and meeting <= 1 - AGREEMENT:
            return "MISSED"
        return "noisy"

    def line(self) -> str:
        sign = "<=" if self.at_most else ">="
        u = self.unit
        spread = (
            f"rounds {min(self.rounds):.2f}-{max(self.rounds):.2f}{u}"
            if self.rounds
            else "no rounds"
        )
        return (
            f"ratio: {self.path} / {self.floor}: {self.median:.2f}{u} (target {sign} "
            f"{self.target:g}{u}; {len(self.rounds)} rounds, {spread}): {self.verdict}"
        )
