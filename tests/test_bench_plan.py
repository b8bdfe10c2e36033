"""The bench's plan (bench/plan.py, bench/configs.py): what a full run contains and that it
fits its time box. Pure: no cluster, no tracer, no timing."""

from __future__ import annotations

import argparse

import pytest

from bench import __main__ as bench_main
from bench import configs, plan


def full_args(**over: object) -> argparse.Namespace:
    args = bench_main.parse_args(["--full"])
    for key, value in over.items():
        setattr(args, key, value)
    return args


def test_the_full_run_fits_35_minutes_with_windows_of_at_least_6_s() -> None:
    args = full_args()
    chosen = bench_main.entries(args)
    fixed = bench_main.fixed_seconds(args)
    long_s = configs.LONG_CAPTURE[2]
    seconds = plan.choose_seconds(chosen, fixed, args.minutes * 60, long_capture_s=long_s)
    total = fixed + plan.overhead_seconds(chosen, seconds, long_s)
    assert seconds >= 6
    assert total <= 35 * 60


def test_the_full_run_measures_what_the_issues_ask() -> None:
    chosen = {(e.workload, e.config): e.pairs for e in bench_main.entries(full_args())}
    for row in [
        ("select", "clog-reads"),
        ("select", "triage-slru"),
        ("select", "clog-reads-syscalls"),
        ("select", "waits"),
        ("tpcb", "waits"),
        ("select", "flame-fp"),
        ("select", "flame-dwarf"),
        ("tpcb", "flame-fp"),
        ("tpcb", "flame-dwarf"),
        ("contention", "lwlocks"),
    ]:
        assert row in chosen, row
    # the tight budgets get the most pairs
    assert chosen[("select", "clog-reads")] > chosen[("select", "waits")]
    assert configs.CONFIGS["clog-reads"].budget == 0.99
    assert configs.CONFIGS["triage-slru"].budget == 0.99
    for key in ("waits", "flame-fp", "flame-dwarf"):
        assert configs.CONFIGS[key].budget == 0.98
    assert configs.LONG_CAPTURE == ("tpcb", "flame-dwarf", 30)


def test_filters_and_quick_sizes() -> None:
    args = bench_main.parse_args(["--quick", "--workloads", "select", "--tools", "waits"])
    assert bench_main.entries(args) == [plan.Entry("select", "waits", bench_main.QUICK_PAIRS)]


def test_expected_resolution_shrinks_with_pairs_and_window_length() -> None:
    few = plan.expected_half_width_pct(4, 8)
    many = plan.expected_half_width_pct(16, 8)
    longer = plan.expected_half_width_pct(4, 16)
    assert few is not None and many is not None and longer is not None
    assert many < few and longer < few
    assert plan.expected_half_width_pct(1, 8) is None


def test_choose_seconds_takes_the_longest_window_that_fits() -> None:
    entries = [plan.Entry("select", "waits", 5)]
    fixed = 100.0
    at8 = fixed + plan.overhead_seconds(entries, 8)
    assert plan.choose_seconds(entries, fixed, at8) == 8
    assert plan.choose_seconds(entries, fixed, at8 - 1) == 7
    assert plan.choose_seconds(entries, fixed, 1.0) == 6  # nothing fits: the shortest


def test_a_config_is_counted_new_once_across_workloads() -> None:
    one = [plan.Entry("select", "waits", 3)]
    two = one + [plan.Entry("tpcb", "waits", 3)]
    difference = plan.overhead_seconds(two, 8) - plan.overhead_seconds(one, 8)
    assert difference == pytest.approx(plan.workload_seconds(two[1:], 8, new_configs=0))


HELP_WITH_SOURCE = """
  --source {uprobe,syscalls}
                        where reads are counted from
"""


def test_a_variant_is_chosen_from_the_tools_help() -> None:
    commands = "    clog-reads\n    waits     time model\n"
    config = configs.CONFIGS["clog-reads-syscalls"]
    chosen, note = configs.resolve(config, {"clog-reads": HELP_WITH_SOURCE}, commands)
    assert note is None and chosen is not None
    assert chosen.args[-2:] == ("--source", "syscalls")
    missing, why = configs.resolve(config, {"clog-reads": "  --slru LIST\n"}, commands)
    assert missing is None and why is not None and "--source syscalls" in why
    absent, why = configs.resolve(configs.CONFIGS["lwlocks"], {}, commands)
    assert absent is None and why is not None and "does not list" in why
