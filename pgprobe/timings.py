"""PGPROBE_TIMINGS=1: where a run's time goes, one stderr line per phase.

Each line reads ``pgprobe: timing PHASE WALL_S CPU_S``: WALL_S is the wall-clock time since
the process started (interpreter start-up included, from /proc/self/stat), CPU_S pgprobe's own
CPU time (all threads) plus that of the children it has waited for. bench/answer.py reads
them; for anyone else they show which phase of a slow run was slow. Off (and free) without
the variable.
"""

from __future__ import annotations

import os
import sys
import time

ENABLED = bool(os.environ.get("PGPROBE_TIMINGS"))
PREFIX = "pgprobe: timing "


def _process_start() -> float:
    """time.monotonic() at this process's start (Linux; now elsewhere or when unreadable)."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22, starttime: clock ticks after boot
        uptime = time.clock_gettime(time.CLOCK_BOOTTIME)
        age = uptime - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - max(0.0, age)


_STARTED = _process_start() if ENABLED else 0.0


def cpu_seconds() -> float:
    """This process's CPU time, and that of its children that have been waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def mark(phase: str) -> None:
    """Print a phase's end when PGPROBE_TIMINGS is set (thread-safe: one write per line)."""
    if ENABLED:
        wall = time.monotonic() - _STARTED
        sys.stderr.write(f"{PREFIX}{phase} {wall:.4f} {cpu_seconds():.4f}\n")
        sys.stderr.flush()


def parse(stderr: str) -> list[tuple[str, float, float]]:
    """The (phase, wall s, CPU s) marks in a run's stderr, in order."""
    out = []
    for line in stderr.splitlines():
        if line.startswith(PREFIX):
            phase, wall, cpu = line[len(PREFIX) :].split()
            out.append((phase, float(wall), float(cpu)))
    return out
