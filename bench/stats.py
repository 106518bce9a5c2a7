"""Small statistics: percentiles of samples, and the median/min/max of repeated runs."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile (no interpolation: the value one of the samples really had)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return float(ordered[rank - 1])


@dataclass
class Spread:
    median: float
    low: float
    high: float
    runs: list[float]

    @classmethod
    def of(cls, runs: list[float]) -> Spread:
        clean = [r for r in runs if r is not None and not math.isnan(r)]
        if not clean:
            return cls(math.nan, math.nan, math.nan, list(runs))
        return cls(float(statistics.median(clean)), min(clean), max(clean), list(runs))

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "runs": self.runs}


def ratio(value: float, baseline: float) -> float:
    if not baseline or math.isnan(baseline) or math.isnan(value):
        return math.nan
    return value / baseline
