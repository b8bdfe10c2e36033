"""Confidence intervals for paired overhead ratios.

Each pair is a traced window between two untraced ones, so each gives one ratio
traced/untraced. Ratios multiply, so the interval is computed on their logs:
mean of log ratios ± t(n-1) × standard error, mapped back with exp. That is the
geometric mean of the ratios and a 95 % interval around it; its half-width is
the smallest overhead the run could tell apart from none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

# Two-sided 95 % quantiles of Student's t for 1..30 degrees of freedom (standard tables);
# past 30 the normal quantile is within 2 % of t.
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z95 = 1.960


def t95(df: int) -> float:
    if df < 1:
        raise ValueError("no interval from fewer than 2 pairs")
    return _T95[df - 1] if df <= len(_T95) else _Z95


@dataclass(frozen=True)
class Interval:
    """A ratio's geometric mean and its 95 % confidence interval."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width_pct(self) -> float:
        """Half the interval's width, in % of the mean: what the run can resolve."""
        return 50.0 * (self.high - self.low) / self.mean

    def verdict(self, budget: float) -> str:
        """met (whole interval at or above the budget), missed (all below), or undecided."""
        if self.low >= budget:
            return "met"
        if self.high < budget:
            return "missed"
        return "undecided"

    def text(self, fmt: str = ".3f") -> str:
        return f"{self.mean:{fmt}} [{self.low:{fmt}}–{self.high:{fmt}}]"


def ratio_interval(ratios: Iterable[float]) -> Interval | None:
    """The 95 % interval of the geometric mean of positive ratios (None below 2 ratios)."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2:
        return None
    mean = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


def pairs_needed(ratios: Iterable[float], target_half_width_pct: float) -> int | None:
    """Pairs a run of the same spread would need to resolve target_half_width_pct."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2 or target_half_width_pct <= 0:
        return None
    sd = statistics.stdev(logs)
    n = len(logs)
    for _ in range(10):  # t depends on n: iterate to a fixed point
        n = max(2, math.ceil((t95(n - 1) * sd / math.log1p(target_half_width_pct / 100)) ** 2))
    return n
