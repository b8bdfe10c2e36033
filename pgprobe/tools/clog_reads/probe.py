"""What clog-reads asks its probe scripts: the script, its maps, its parameters.

Two sources: ``uprobe`` (the default: bpf/clog_reads_uprobe.bt, a uprobe on
pgstat_count_slru_page_read, reads per pid and SLRU index, free without misses,
a trap of ~16 us per read) and ``syscalls`` (bpf/clog_reads.bt, d/clog_reads.d:
files, offsets, latency, --trace; ~0.1 us per system call of every process).
The SLRUs and their bits in the syscall script's SLRU_MASK ($2) or, for the
uprobe, the server's pg_stat_slru row numbers; the positional parameters
computed from validated values only.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from elftools.common.exceptions import ELFError

from pgprobe import engines, pgstats
from pgprobe.discover import Targets
from pgprobe.engines import bpftrace
from pgprobe.engines import compiled as engine
from pgprobe.engines.base import (
    AggValue,
    Capture,
    Event,
    Key,
    KeyKind,
    MapSpec,
    RunInfo,
    Snapshot,
    TickCallback,
)
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.symbolize.dynsym import defined_symbol
from pgprobe.tools import bystatement, common
from pgprobe.tools.clog_reads import compiled

SCRIPT = "clog_reads"  # bpf/clog_reads.bt, d/clog_reads.d
UPROBE_SCRIPT = "clog_reads_uprobe"  # bpf/clog_reads_uprobe.bt (counts only)
# With stacks: its own script, as a ustack brings bpftrace 0.17's fixed-size stack map
# (131,072 x 1 KiB of kernel memory, ~0.1 s more to start) to every capture using it.
UPROBE_STACKS_SCRIPT = "clog_reads_uprobe_stacks"
UPROBE_FUNCTION = "pgstat_count_slru_page_read"
SOURCES = ("uprobe", "syscalls")
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
    MapSpec("qreads", ("int", "str", "int", "int")),  # pid, file, st_state, st_query_id
)
MODE_AGGREGATE, MODE_STACKS, MODE_TRACE = 0, 1, 2
# The uprobe script's maps: reads per (pid, SLRU index); UprobeCapture turns the
# index into the SLRU's directory (by the server's own pg_stat_slru order).
UPROBE_MAPS = (
    MapSpec("reads", ("int", "int")),
    MapSpec("read_stacks", ("int", "int", "stack")),  # pid, return address at sp, ustack
    MapSpec("fires", ()),
    MapSpec("qreads", ("int", "int", "int", "int")),  # pid, SLRU index, st_state, st_query_id
)
# CPU per uprobe fire (the trap), measured on the development VM with
# bench/probe_cost.py (docs/clog-reads.md): for the one-line cost estimate.
UPROBE_FIRE_NS = 16_000


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
    """Nothing to refuse: the uprobe source falls back to syscalls where it cannot run."""


def uprobe_unavailable(targets: Targets, order: Sequence[str] | None, engine: str) -> str | None:
    """Why the uprobe source cannot count on this server (None: it can)."""
    cluster = targets.cluster
    if engine == "dtrace":
        return "DTrace for Linux has no pid provider for it (docs/clog-reads.md)"
    if cluster.version_num and cluster.major < 13:
        return f"PostgreSQL {cluster.version.split()[0]} has no {UPROBE_FUNCTION} (13+)"
    if not exports(cluster.binary, UPROBE_FUNCTION):
        return f"{os.path.basename(cluster.binary)} exports no {UPROBE_FUNCTION}"
    if not order:
        return "pg_stat_slru's row order (the SLRU index) could not be read"
    return None


def exports(binary: str, function: str) -> bool:
    """Whether binary's .dynsym defines function (a uprobe can attach to it by name)."""
    try:
        return defined_symbol(binary, function) is not None
    except (OSError, ELFError):
        return False


def index_mask(order: Sequence[str], slrus: Iterable[str]) -> int:
    """The uprobe script's INDEX_MASK: bit (1 << row number in pg_stat_slru) per SLRU."""
    wanted = set(slrus)
    if "pg_xact" in wanted or "pg_clog" in wanted:
        wanted |= {"pg_xact", "pg_clog"}
    return sum(1 << i for i, name in enumerate(order) if name in wanted)


def uprobe_args(targets: Targets, mask: int, interval: int | None) -> list[int | Path]:
    """$1 binary, $2 postmaster, $3 index mask, $4 single pid, $5 interval (then
    $6 STOPPER_PID, $7-$9 where the statement is read: see with_statement)."""
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    cluster = targets.cluster
    return [Path(cluster.binary), cluster.postmaster_pid, mask, single, interval or 0]


def with_caller(stack: tuple[int, ...], caller: int) -> tuple[int, ...]:
    """A stack walked by frame pointer at a function's entry, with the caller put back.

    The walk starts at the probed function and goes on with the frame of its
    caller's caller; the caller's return address was at the stack pointer.
    Not added twice (a kernel that already adds it at function entries).
    """
    if not stack or caller == 0 or (len(stack) > 1 and stack[1] == caller):
        return stack
    return (stack[0], caller, *stack[1:])


class UprobeCapture:
    """The uprobe script's capture with "reads" keyed (pid, SLRU directory), not (pid, index),
    and "read_stacks" keyed (pid, stack with its caller) as the syscall script's.

    The index is the row number of the server's pg_stat_slru (read before the
    capture, never guessed); one outside it shows as "slru #N".
    """

    def __init__(self, inner: Capture, order: Sequence[str]) -> None:
        self.inner = inner
        self.order = list(order)

    @property
    def info(self) -> RunInfo:
        return self.inner.info

    @info.setter
    def info(self, value: RunInfo) -> None:
        self.inner.info = value

    @property
    def on_tick(self) -> TickCallback | None:
        return self.inner.on_tick

    @on_tick.setter
    def on_tick(self, value: TickCallback | None) -> None:
        self.inner.on_tick = value

    def request_stop(self) -> None:
        self.inner.request_stop()

    def name(self, index: int) -> str:
        return self.order[index] if 0 <= index < len(self.order) else f"slru #{index}"

    def events(self) -> Iterator[Event]:
        for event in self.inner.events():
            if isinstance(event, Snapshot):
                reads = event.get("reads")
                named: dict[Key, AggValue] = {}
                for (pid, index), value in reads.items():
                    assert isinstance(index, int)
                    named[(pid, self.name(index))] = value
                event.maps["reads"] = named
                by_statement: dict[Key, AggValue] = {}
                for (pid, index, state, qid), value in event.get("qreads").items():
                    assert isinstance(index, int)
                    by_statement[(pid, self.name(index), state, qid)] = value
                event.maps["qreads"] = by_statement
                stacks: dict[Key, AggValue] = {}
                for (pid, caller, stack), value in event.get("read_stacks").items():
                    assert isinstance(caller, int) and isinstance(stack, tuple)
                    key = (pid, with_caller(stack, caller))
                    old = stacks.get(key, 0)
                    assert isinstance(old, int) and isinstance(value, int)
                    stacks[key] = old + value
                event.maps["read_stacks"] = stacks
            yield event


def with_statement(
    args: list[int | Path], stopper: int, statement: Sequence[int]
) -> list[int | Path]:
    """The scripts' trailing parameters: $6 STOPPER_PID, and $7-$9 ENTRY STATE_OFF QID_OFF
    only when the statement is read (else the parameters stay as before it existed)."""
    if not any(statement):
        return [*args, stopper] if stopper else args
    return [*args, stopper, *statement]


def script_args(targets: Targets, mask: int, mode: int, interval: int | None) -> list[int | Path]:
    """$1 postmaster, $2 SLRU mask, $3 mode, $4 single pid (0: all), $5 interval."""
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    return [targets.cluster.postmaster_pid, mask, mode, single, interval or 0]


def choose_source(
    ns: argparse.Namespace, targets: Targets, mode: int
) -> tuple[str, list[str] | None]:
    """(uprobe or syscalls, pg_stat_slru's SLRU directories in row order) for this capture.

    --source (default uprobe; --trace needs syscalls). The uprobe falls back to
    syscalls, said on stderr, where it cannot count (no function, no order, DTrace).
    """
    wanted = getattr(ns, "source", None) or ("syscalls" if mode == MODE_TRACE else "uprobe")
    if wanted == "syscalls":
        return "syscalls", None
    engine = engines.choose(getattr(ns, "engine", "auto"))
    order = pgstats.slru_order(targets.cluster.conninfo) if engine != "dtrace" else None
    why = uprobe_unavailable(targets, order, engine)
    if why is None:
        return "uprobe", order
    if getattr(ns, "source", None) == "uprobe":
        raise PgprobeError(f"--source uprobe: {why}", EXIT_USAGE)
    common.warn(f"SLRU reads from system calls: {why}", "note")
    return "syscalls", None


def map_env(mode: int) -> dict[str, str]:
    """bpftrace's settings for either source's maps: room for stacks, left raw for pgprobe."""
    if mode == MODE_STACKS:
        return {"BPFTRACE_MAP_KEYS_MAX": "65536", "BPFTRACE_NO_USER_SYMBOLS": "1"}
    return {"BPFTRACE_MAP_KEYS_MAX": "16384"}


def start(
    ns: argparse.Namespace,
    targets: Targets,
    slrus: Sequence[str],
    mode: int,
    interval: int | None,
    signal_window: bool = False,
    statement: Sequence[int] = bystatement.NO_READ,
) -> Capture:
    """clog_reads for the targets and SLRUs, ready to run (iterate its events).

    The source is ns.source (uprobe by default, see choose_source); both give
    records() the same shape. signal_window: reads count from pgprobe's signal 0
    to its SIGINT (see below); the caller must then send that signal 0 after its
    opening pg_stat_slru read, as the clog-reads command does. Without it
    (triage, serve) reads count from "@@live" to END. statement: StatementAddress.script_args()
    args, where the scripts read each reading backend's statement into @qreads
    (NO_READ: not read).
    """
    source, order = choose_source(ns, targets, mode)
    if source == "uprobe":
        assert order is not None
        return start_uprobe(ns, targets, slrus, order, mode, interval, signal_window, statement)
    # The longest SLRU path as opened is 36 characters.
    env = {"BPFTRACE_STRLEN": "40", **map_env(mode)}
    args = script_args(targets, slru_mask(slrus), mode, interval)
    if not signal_window or engines.choose(getattr(ns, "engine", "auto")) == "dtrace":
        # (clog-reads refuses the statement with DTrace: d/clog_reads.d does not read it)
        return common.capture(ns, SCRIPT, with_statement(args, 0, statement), MAPS, env=env)
    # $6: pgprobe's pid. clog_reads.bt counts from this process's signal 0 to its
    # SIGINT (bpftrace 0.17 stops its syscall tracepoints on SIGINT, a second or more
    # before END under load), so the SQL reads are taken just before each signal.
    args = with_statement(args, os.getpid(), statement)
    capture = common.capture(ns, SCRIPT, args, MAPS, env=env)
    if isinstance(capture, bpftrace.BpftraceCapture):
        capture.process.stops_on_signal = True
    return capture


def start_uprobe(
    ns: argparse.Namespace,
    targets: Targets,
    slrus: Sequence[str],
    order: Sequence[str],
    mode: int,
    interval: int | None,
    signal_window: bool = False,
    statement: Sequence[int] = bystatement.NO_READ,
) -> UprobeCapture:
    """bpf/clog_reads.bpf.c compiled where it is built and loads here, else
    bpf/clog_reads_uprobe.bt (MODE_STACKS: its _stacks twin, frame-pointer stacks), same
    window and statement rules (the object counts from its attach to its last read)."""
    script = UPROBE_STACKS_SCRIPT if mode == MODE_STACKS else UPROBE_SCRIPT
    args = uprobe_args(targets, index_mask(order, slrus), interval)
    args = with_statement(args, os.getpid() if signal_window else 0, statement)

    def from_script() -> Capture:
        capture = common.capture(ns, script, args, UPROBE_MAPS, env=map_env(mode))
        if signal_window and isinstance(capture, bpftrace.BpftraceCapture):
            capture.process.stops_on_signal = True
        return capture

    duration = getattr(ns, "duration", None)
    capture = engine.object_or_script(
        ns, compiled.OBJECT,
        lambda: compiled.capture(args, duration, interval, targets.cluster.binary),
        from_script, f"ran bpf/{script}.bt", not_here="" if mode == MODE_STACKS else None,
    )  # fmt: skip
    return UprobeCapture(capture, order)
