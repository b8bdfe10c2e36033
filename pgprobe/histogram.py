"""Percentiles from power-of-two histograms (what the kernel aggregates for us)."""

from __future__ import annotations

from collections.abc import Iterable

from pgprobe.engines.base import Log2Hist


def slot_bounds(slot: int) -> tuple[int, int]:
    """(low, high) of a compiled object's log2 slot (bpf/hist.h): slot 0 holds 0, slot k
    2^(k-1) .. 2^k - 1, as bpftrace's hist buckets."""
    return (0, 0) if slot == 0 else (1 << (slot - 1), (1 << slot) - 1)


def merge(hists: Iterable[Log2Hist]) -> Log2Hist:
    """The sum of several histograms, bucket by bucket."""
    counts: dict[tuple[int, int], int] = {}
    for hist in hists:
        for low, high, count in hist.buckets:
            counts[(low, high)] = counts.get((low, high), 0) + count
    return Log2Hist(tuple((lo, hi, c) for (lo, hi), c in sorted(counts.items()) if c))


def percentile(hist: Log2Hist, fraction: float, observed_max: int | None = None) -> float:
    """The value below which `fraction` of the samples fall, estimated inside its bucket.

    A log2 bucket only says that a value lies in [low, high]; the estimate
    interpolates linearly within the bucket holding the rank and never exceeds
    the largest value actually observed (when the caller knows it).
    """
    total = hist.count
    if total == 0:
        return 0.0
    rank = fraction * total
    seen = 0
    for low, high, count in hist.buckets:
        if count == 0:
            continue
        if seen + count >= rank:
            low = max(low, 0)
            inside = (rank - seen) / count
            estimate = low + inside * (high + 1 - low)
            estimate = min(max(estimate, float(low)), float(high))
            break
        seen += count
    else:  # unreachable with consistent counts; be safe with the top bucket
        estimate = float(hist.buckets[-1][1])
    if observed_max is not None:
        estimate = min(estimate, float(observed_max))
    return estimate
