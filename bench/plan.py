"""How long each part of a run takes, and the window length that fits the time box.

The spread of the pair ratios sets what a run can resolve. On the last quiet run of this
2-CPU VM (docs/benchmarks.md, 2026-11-22: 5 pairs x 4 s windows per tool, pgbench -c 8)
the pair ratios of a tool spanned 0.08-0.15 (min to max of 5), a standard deviation of the
log ratio of about 5 % (range / 2.33 for 5 draws). Per-second throughput noise averages
out over a window roughly as 1 / sqrt(seconds), so an 8 s window gives about 3.5 %, and
a 95 % interval of +-2 % needs about 14 pairs: more than a 35-minute run can give every
row. The plan gives the tight budgets (>= 0.99) the most pairs; each row's interval is then
reported with what it resolves and the pairs a +-2 % interval would have needed at the
spread the run itself measured (bench.stats.pairs_needed). Where the TPS interval cannot
decide a budget, the cost measured per probe fire (BPF ns x fires/s, plus the trap) can:
see bench/results.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench import stats

SD_LOG_RATIO_4S = 0.05  # pair-to-pair spread at 4 s windows, last quiet run
SD_REFERENCE_S = 4.0

# Seconds per part, measured on busy and quiet runs of this VM (rounded up).
SETUP_S = 60.0  # scripts/setup, the cluster, pgbench -i -s 2
PROBE_COST_S = 150.0  # the uprobe and tracepoint rounds ~60 s, context switches (7 runs x 5) ~90 s
SYMBOLIZE_S = 20.0
RENDER_S = 45.0
ANSWER_S = 180.0  # 5 and 1,000 + 32 backends, 4 tools x 3 runs, connecting 1,000
SERVE_S = 150.0
WARMUP_S = 5.0
FIRST_RUN_S = 8.0  # a tool's first, uncounted run (learns its attach time)
TRACED_EXTRA_S = 4.1  # start, attach wait, boundary waits, finish around a traced window
UNTRACED_EXTRA_S = 0.6  # the wait for pgbench's next report boundary
LONG_EXTRA_S = 10.0


def expected_sd(seconds: float) -> float:
    return SD_LOG_RATIO_4S * math.sqrt(SD_REFERENCE_S / seconds)


def expected_half_width_pct(pairs: int, seconds: float) -> float | None:
    """The 95 % half-width a row of `pairs` pairs should resolve at the usual spread."""
    if pairs < 2:
        return None
    half = stats.t95(pairs - 1) * expected_sd(seconds) / math.sqrt(pairs)
    return 100 * math.expm1(half)


@dataclass(frozen=True)
class Entry:
    workload: str
    config: str
    pairs: int


def workload_seconds(entries: list[Entry], seconds: float, new_configs: int) -> float:
    """One workload: warm-up, first runs, then A T A ... A (each traced window after an
    untraced one, one untraced window more at the end)."""
    traced = sum(e.pairs for e in entries)
    return (
        WARMUP_S
        + FIRST_RUN_S * new_configs
        + (traced + 1) * (seconds + UNTRACED_EXTRA_S)
        + traced * (seconds + TRACED_EXTRA_S)
    )


def overhead_seconds(entries: list[Entry], seconds: float, long_capture_s: float = 0.0) -> float:
    total = 0.0
    seen: set[str] = set()
    for workload in dict.fromkeys(e.workload for e in entries):
        mine = [e for e in entries if e.workload == workload]
        new = {e.config for e in mine} - seen
        seen |= new
        total += workload_seconds(mine, seconds, len(new))
    if long_capture_s:
        total += long_capture_s + LONG_EXTRA_S
    return total


def choose_seconds(
    entries: list[Entry],
    fixed_s: float,
    box_s: float,
    candidates: range = range(10, 5, -1),
    long_capture_s: float = 0.0,
) -> int:
    """The longest window (from `candidates`) whose run fits the box; the shortest if none."""
    for s in candidates:
        if fixed_s + overhead_seconds(entries, s, long_capture_s) <= box_s:
            return s
    return candidates[-1]
