"""The bench's confidence intervals (bench/stats.py): checked against hand-computed values."""

from __future__ import annotations

import math

import pytest

from bench.stats import pairs_needed, ratio_interval, t95


def test_interval_of_identical_ratios_is_a_point() -> None:
    iv = ratio_interval([0.95, 0.95, 0.95])
    assert iv is not None
    assert iv.mean == pytest.approx(0.95) and iv.low == pytest.approx(0.95)
    assert iv.half_width_pct == pytest.approx(0.0)


def test_interval_matches_a_hand_computed_t_interval() -> None:
    ratios = [0.9, 1.0, 1.1]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.303 * sd / math.sqrt(3)  # t(0.975, 2 df)
    iv = ratio_interval(ratios)
    assert iv is not None and iv.n == 3
    assert iv.low == pytest.approx(math.exp(mean - half))
    assert iv.high == pytest.approx(math.exp(mean + half))


def test_verdicts() -> None:
    tight = ratio_interval([0.99, 1.0, 1.01, 1.0])
    assert tight is not None and tight.verdict(0.98) == "met"
    low = ratio_interval([0.90, 0.91, 0.89, 0.90])
    assert low is not None and low.verdict(0.98) == "missed"
    wide = ratio_interval([0.85, 1.1, 0.95, 1.05])
    assert wide is not None and wide.verdict(0.98) == "undecided"


def test_fewer_than_two_ratios_give_no_interval() -> None:
    assert ratio_interval([1.0]) is None
    with pytest.raises(ValueError):
        t95(0)


def test_pairs_needed_grows_with_the_square_of_the_precision() -> None:
    ratios = [0.9, 1.1, 0.95, 1.05, 1.0]
    two = pairs_needed(ratios, 2.0)
    one = pairs_needed(ratios, 1.0)
    assert two is not None and one is not None
    assert 3.5 < one / two < 4.5
