"""Percentiles from log2 buckets: interpolation inside the bucket, capped by the max."""

from __future__ import annotations

from pgprobe.engines.base import Log2Hist
from pgprobe.histogram import merge, percentile


def test_single_bucket_interpolates_linearly() -> None:
    hist = Log2Hist(((1024, 2047, 100),))
    assert percentile(hist, 0.5) == 1024 + 0.5 * 1024
    assert percentile(hist, 0.01) == 1024 + 0.01 * 1024
    assert percentile(hist, 1.0) == 2047  # never past the bucket


def test_rank_falls_in_the_right_bucket() -> None:
    hist = Log2Hist(((4, 7, 90), (8, 15, 9), (1024, 2047, 1)))
    assert 4 <= percentile(hist, 0.50) <= 7
    assert 8 <= percentile(hist, 0.95) <= 15
    assert 1024 <= percentile(hist, 0.999) <= 2047


def test_capped_by_the_observed_max() -> None:
    hist = Log2Hist(((1024, 2047, 10),))
    assert percentile(hist, 0.99, observed_max=1100) == 1100


def test_monotonic_in_the_fraction() -> None:
    hist = Log2Hist(((0, 0, 3), (1, 1, 5), (2, 3, 7), (4, 7, 11), (64, 127, 2)))
    values = [percentile(hist, q / 100) for q in range(1, 101)]
    assert values == sorted(values)


def test_empty_histogram() -> None:
    assert percentile(Log2Hist(()), 0.5) == 0.0


def test_merge_adds_bucket_by_bucket() -> None:
    a = Log2Hist(((4, 7, 1), (8, 15, 2)))
    b = Log2Hist(((8, 15, 3), (16, 31, 4)))
    assert merge([a, b]).buckets == ((4, 7, 1), (8, 15, 5), (16, 31, 4))
    assert merge([a, b]).count == a.count + b.count
