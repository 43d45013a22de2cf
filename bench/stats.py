"""Figures every benchmark here reports the same way: percentiles (inclusive method; one
sample is itself) and a process's CPU time."""

from __future__ import annotations

import os
import statistics
from pathlib import Path


def pct(values: list[float], q: int) -> float:
    """The ``q``-th percentile of ``values``, in their unit."""
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
