"""Percentiles as every benchmark here reports them (inclusive method; one sample is itself)."""

from __future__ import annotations

import statistics


def pct(values: list[float], q: int) -> float:
    """The ``q``-th percentile of ``values``, in their unit."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
