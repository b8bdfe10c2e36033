"""bench/toggle.py's arithmetic: ratios within a block, intervals over blocks (no BPF)."""

from __future__ import annotations

import math

import pytest

from bench.toggle import FLOOR, NONE, WAITS, Block, Result


def result_of(*blocks: dict[str, float]) -> Result:
    r = Result(workload="select", window_s=2, seed=1)
    r.blocks = [Block(order=list(tps), tps=tps) for tps in blocks]
    return r


def test_a_ratio_is_within_one_block() -> None:
    block = Block(order=[WAITS, NONE, FLOOR], tps={NONE: 1000.0, FLOOR: 990.0, WAITS: 980.0})
    assert block.ratio(WAITS) == pytest.approx(0.98)
    assert block.ratio(WAITS, FLOOR) == pytest.approx(980 / 990)


def test_a_window_that_was_not_measured_whole_gives_no_ratio() -> None:
    # run_blocks keeps a window's TPS only when pgbench reported each of its seconds
    block = Block(order=[NONE, WAITS, FLOOR], tps={WAITS: 980.0, FLOOR: 990.0})
    assert block.ratio(WAITS) is None
    assert block.ratio(WAITS, FLOOR) is not None


def test_the_interval_is_the_geometric_mean_of_the_blocks_ratios() -> None:
    r = result_of(
        {NONE: 1000.0, WAITS: 980.0, FLOOR: 1000.0},
        {NONE: 2000.0, WAITS: 2000.0, FLOOR: 1990.0},
        {NONE: 500.0, WAITS: 495.0},  # the floor's window short: its ratio left out only
    )
    waits = r.interval(WAITS)
    assert waits is not None and waits.n == 3
    assert waits.mean == pytest.approx(math.exp((math.log(0.98) + 0 + math.log(0.99)) / 3))
    floor = r.interval(FLOOR)
    assert floor is not None and floor.n == 2
    doc = r.as_json()
    assert doc["intervals"][f"{WAITS}/{NONE}"]["n"] == 3
    assert doc["intervals"][f"{WAITS}/{FLOOR}"]["n"] == 2
    assert f"{NONE}/{WAITS}" not in doc["intervals"]
