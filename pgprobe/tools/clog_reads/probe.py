"""What clog-reads asks bpf/clog_reads.bt (d/clog_reads.d): the script, its maps, its parameters.

The SLRUs it can trace and their bits in the script's SLRU_MASK ($2), what --slru
accepts, and the positional parameters computed from validated values only.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from pgprobe import engines, pgstats
from pgprobe.discover import Targets
from pgprobe.engines import bpftrace
from pgprobe.engines.base import Capture, KeyKind, MapSpec
from pgprobe.tools import common

SCRIPT = "clog_reads"  # bpf/clog_reads.bt, d/clog_reads.d
BLCKSZ = 8192

# The SLRU directories and their bits in the script's SLRU_MASK ($2).
SLRU_BITS = {
    "pg_xact": 1,
    "pg_clog": 2,  # pg_xact before PostgreSQL 10
    "pg_subtrans": 4,
    "pg_multixact/offsets": 8,
    "pg_multixact/members": 16,
    "pg_commit_ts": 32,
    "pg_serial": 64,
    "pg_notify": 128,
}
ALL_MASK = 255
# pg_stat_slru's names (13-16, and 17+) -> the directory of that SLRU.
STAT_NAMES = pgstats.SLRU_DIRS
# What --slru accepts besides the directories: 'all', 'pg_multixact' (both of
# its SLRUs), and pg_stat_slru's names, case-insensitively.
_ALIASES: dict[str, tuple[str, ...]] = {
    "pg_multixact": ("pg_multixact/offsets", "pg_multixact/members"),
    **{name.lower(): (path,) for name, path in STAT_NAMES.items() if path in SLRU_BITS},
}

KEY: tuple[KeyKind, ...] = ("int", "str")  # pid, file as opened ("pg_xact/0005")
MAPS = (
    MapSpec("read_stats", KEY),
    MapSpec("read_bytes", KEY),
    MapSpec("read_max_ns", KEY, combine="max"),
    MapSpec("read_ns", KEY),
    MapSpec("open_errors", KEY),
    MapSpec("read_stacks", ("int", "stack")),
)
MODE_AGGREGATE, MODE_STACKS, MODE_TRACE = 0, 1, 2


def slru_value(text: str) -> tuple[str, ...]:
    """One --slru value: names separated by commas -> SLRU directories (or 'all')."""
    out: list[str] = []
    for raw in text.split(","):
        name = raw.strip().rstrip("/")
        if not name:
            continue
        if name.lower() == "all":
            out.append("all")
        elif name in SLRU_BITS:
            out.append(name)
        elif name.lower() in _ALIASES:
            out.extend(_ALIASES[name.lower()])
        else:
            raise argparse.ArgumentTypeError(
                f"unknown SLRU {raw.strip()!r} (choose from {', '.join(SLRU_BITS)}, all)"
            )
    if not out:
        raise argparse.ArgumentTypeError("empty SLRU list")
    return tuple(out)


def selected_slrus(values: Sequence[Sequence[str]], major: int) -> list[str]:
    """The SLRU directories to trace, in SLRU_BITS order.

    Default: the commit log, pg_xact (pg_clog for servers before 10). pg_xact
    and pg_clog are one SLRU, renamed in 10: either name selects the one this
    server has, so the same option works on every version.
    """
    commit_log, other_name = ("pg_xact", "pg_clog") if major >= 10 else ("pg_clog", "pg_xact")
    names = {n for value in values for n in value} or {commit_log}
    if "all" in names:
        names = set(SLRU_BITS)
    if names & {"pg_xact", "pg_clog"}:
        names = (names - {other_name}) | {commit_log}
    return [n for n in SLRU_BITS if n in names]


def slru_mask(slrus: Iterable[str]) -> int:
    mask = 0
    for name in slrus:
        mask |= SLRU_BITS[name]
    return mask


def check_server(targets: Targets) -> None:
    """Syscall tracepoints only: any PostgreSQL version and build will do."""


def script_args(targets: Targets, mask: int, mode: int, interval: int | None) -> list[int | Path]:
    """$1 postmaster, $2 SLRU mask, $3 mode, $4 single pid (0: all), $5 interval."""
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    return [targets.cluster.postmaster_pid, mask, mode, single, interval or 0]


def start(
    ns: argparse.Namespace,
    targets: Targets,
    slrus: Sequence[str],
    mode: int,
    interval: int | None,
    signal_window: bool = False,
) -> Capture:
    """clog_reads for the targets and SLRUs, ready to run (iterate its events).

    signal_window: reads count from pgprobe's signal 0 to its SIGINT (see below); the
    caller must then send that signal 0 after its opening pg_stat_slru read, as the
    clog-reads command does. Without it (triage, serve) reads count from "@@live" to END.
    """
    env = {
        "BPFTRACE_STRLEN": "40",  # the longest SLRU path as opened is 36 characters
        "BPFTRACE_MAP_KEYS_MAX": str(65536 if mode == MODE_STACKS else 16384),
    }
    if mode == MODE_STACKS:
        env["BPFTRACE_NO_USER_SYMBOLS"] = "1"
    args = script_args(targets, slru_mask(slrus), mode, interval)
    if not signal_window or engines.choose(getattr(ns, "engine", "auto")) == "dtrace":
        return common.capture(ns, SCRIPT, args, MAPS, env=env)
    # $6: pgprobe's pid. clog_reads.bt counts from this process's signal 0 to its
    # SIGINT (bpftrace 0.17 stops its syscall tracepoints on SIGINT, a second or more
    # before END under load), so the SQL reads are taken just before each signal.
    capture = common.capture(ns, SCRIPT, [*args, os.getpid()], MAPS, env=env)
    if isinstance(capture, bpftrace.BpftraceCapture):
        capture.process.stops_on_signal = True
    return capture
