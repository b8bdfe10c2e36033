"""`pgprobe waits`: where the time of every PostgreSQL process goes (thin CLI glue)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

from pgprobe.discover import Targets
from pgprobe.engines.base import RunInfo, Snapshot
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.tools import common, pprof_export
from pgprobe.tools.flame.output import check_output
from pgprobe.tools.queries import command as queries_command
from pgprobe.tools.queries import records as query_records
from pgprobe.tools.queries import view as query_view
from pgprobe.tools.waits import compiled, offcpu, probe, records, stacks, view
from pgprobe.tools.waits.targets import (
    asleep_all_along,
    asleep_at,
    describe,
    identities,
    ours,
    present,
    run_counts,
    watched,
)
from pgprobe.waitevents import address

NAME = "waits"
BY_QUERY_TOP = 10


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="time model: on CPU, waiting for a CPU, each wait event",
        description="Where the time of the targets goes, exactly, from the scheduler and "
        "PostgreSQL's own wait_event_info (14+, any build): on CPU, runqueue, each wait "
        "event as pg_stat_activity names it, idle, not accounted.",
    )
    common.add_tracing_arguments(parser, default_duration=10)
    parser.add_argument("--by", choices=["pid", "query"],
                        help="one time model per process, or per statement (the top "
                        f"{BY_QUERY_TOP}; pgprobe queries ranks them all)")  # fmt: skip
    parser.add_argument(
        "--interval",
        type=common.positive_int,
        metavar="N",
        help="print a fresh table every N seconds until the duration ends",
    )
    offcpu.add_arguments(parser)
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    if ns.by == "query":
        return by_query(ns)
    by_pid = ns.by == "pid"
    if ns.interval and ns.interval > ns.duration:
        raise PgprobeError(
            f"--interval {ns.interval} is longer than the duration ({ns.duration:g} s)",
            EXIT_USAGE,
        )
    fmt = output_format(ns)
    if fmt and ns.interval:
        raise PgprobeError("--stacks takes no --interval (one graph per capture)", EXIT_USAGE)
    if fmt and getattr(ns, "engine", "auto") == "dtrace":
        raise PgprobeError("--stacks needs bpftrace (no DTrace script for it)", EXIT_USAGE)
    # the time model from its object needs no bpftrace (the off-CPU stacks do)
    targets = common.prepare(ns, probe.check_server, None if fmt else compiled.OBJECT)
    cluster = targets.cluster
    where = address.find(cluster.postmaster_pid, cluster.binary)
    started, left = time.monotonic(), ns
    untraced_s: float | None = None  # set for the first window after a restart
    while True:
        last = capture_windows(left, targets, by_pid, where, fmt, untraced_s)
        if last.restart_exited is None:
            return 0
        remaining = ns.duration - (time.monotonic() - started)
        if remaining < 1:
            return 0
        left = argparse.Namespace(**{**vars(ns), "duration": remaining})
        print(f"pgprobe: note: the tracer is restarted: its maps held "
              f"{last.restart_exited:,} processes that exited (the bound: "
              f"{records.RECYCLE_AFTER_EXITED:,}); the time it takes to attach again is in "
              "no window (meta untraced_before_s)", file=sys.stderr)  # fmt: skip
        untraced_s = -last.end_ns / 1e9  # + the next tracer's start, at its first window


def by_query(ns: argparse.Namespace) -> int:
    """--by query: the time model of each of the top statements (pgprobe queries' capture)."""
    if ns.interval or ns.stacks:
        flag = "--interval" if ns.interval else "--stacks"
        raise PgprobeError(f"--by query takes no {flag} (one table per capture)", EXIT_USAGE)
    targets = common.prepare(ns, probe.check_server, compiled.OBJECT)
    major = targets.cluster.major
    got = queries_command.capture_statements(ns, targets)
    rows = got.rows[:BY_QUERY_TOP]
    parts = [query_records.components(r, major) for r in rows]
    if ns.json:
        common.print_json(NAME, got.meta, [p for model in parts for p in model])
    else:
        title = common.title("Time model by statement", got.meta) + (
            f"; top {len(rows)} of {len(got.rows)} by DB time"
        )
        query_view.show_components(title, rows, parts)
    common.print_losses(got.info)
    if got.note:
        common.warn(got.note, "note")
    return 0


@dataclass
class CaptureEnd:
    """How one tracer's run ended: restart_exited, when stopped to bound its maps."""

    end_ns: int  # @now_ns of its last snapshot (the kernel's monotonic clock)
    restart_exited: int | None = None


def capture_windows(
    ns: argparse.Namespace,
    targets: Targets,
    by_pid: bool,
    where: address.WaitEventAddress,
    fmt: str | None,
    untraced_s: float | None,
) -> CaptureEnd:
    """One tracer's run: its windows emitted. In interval mode its maps keep every exited
    process (running totals): past records.RECYCLE_AFTER_EXITED it is stopped, its last
    window emitted, and the caller starts another (as serve does)."""
    runs_before = run_counts(watched(targets))
    discovered = identities(runs_before)  # alive before the window: may sleep all along
    asleep_now = asleep_at(targets, runs_before)

    def at_live() -> None:
        # The sleeps under way once the probes are in, of every process then, the ones born
        # while the tracer started (bpftrace: up to seconds) too: the script names a sleep
        # begun before its probes by this read (the compiled object reads them itself).
        asleep_now.update(asleep_at(targets, run_counts(watched(targets))))

    args = probe.script_args(targets, where, ns.interval)
    namer: offcpu.StackNamer | None = None
    if fmt:
        namer = offcpu.StackNamer(targets)
        capture: Any = offcpu.start(ns, targets, args, namer)
    else:
        capture = probe.capture(ns, args)
    end = CaptureEnd(0)
    previous = None  # the maps are cumulative: each window is the difference of two
    for snapshot, info in common.snapshots(capture, ns, "time per wait event", at_live):
        # Each window is modelled with pg_stat_activity's knowledge at its read, for the
        # processes asleep all along (the compiled capture needs it only for one that had no
        # entry: it seeds each process with the wait event read from its memory).
        slept_in = asleep_all_along(targets, runs_before)
        records.keep_asleep(snapshot, slept_in, asleep_now)
        if untraced_s is not None and previous is None:  # the gap since the last tracer ended
            untraced_s += records.window(snapshot)[0] / 1e9
        emit(ns, snapshot, info, targets, present(discovered), by_pid, where, slept_in, fmt,
             namer, previous, untraced_s if previous is None else None)  # fmt: skip
        previous = snapshot
        end.end_ns = records.window(snapshot)[1]
        exited = records.exited(snapshot)
        if ns.interval and exited >= records.RECYCLE_AFTER_EXITED and end.restart_exited is None:
            end.restart_exited = exited
            capture.request_stop()  # its last maps come as one more (final) window
    return end


def emit(
    ns: argparse.Namespace,
    snapshot: Snapshot,
    info: RunInfo,
    targets: Targets,
    alive: list[int],
    by_pid: bool,
    where: address.WaitEventAddress,
    slept_in: dict[int, int],
    fmt: str | None = None,
    namer: offcpu.StackNamer | None = None,
    previous: Snapshot | None = None,
    untraced_s: float | None = None,
) -> None:
    is_ours = ours(targets)
    # alive: the targets of the discovery still there (targets.present), which may have slept
    # all along; slept_in and asleep_at_start: the snapshot's own (records.keep_asleep)
    procs = records.since(previous, snapshot, alive, is_ours)
    if not targets.whole_cluster:
        procs = [p for p in procs if p.pid in targets.pids]
    off: list[stacks.OffCpuStack] | None = None
    if fmt and namer is not None:
        kept = {p.pid for p in procs}
        sleeps = offcpu.sleeps_of(snapshot, procs, lambda pid: pid in kept, namer)
        off = namer.name(sleeps, targets.cluster.major)
    result = records.rows(procs, targets.cluster.major, by_pid, describe(targets))
    start, end = records.window(snapshot, previous)
    not_read = probe.client_read_note(where, targets.cluster.major)
    meta = common.meta(
        targets,
        info,
        snapshot,
        interval=ns.interval,
        window_s=round((end - start) / 1e9, 6),
        window_unix_s=common.wall_clock(start, end),
        processes=len(procs),
        process_seconds=round(sum(p.wall_ns for p in procs) / 1e9, 6),
        exited_pids=[p.pid for p in procs if p.exited],
        born_pids=[p.pid for p in procs if p.born],
        wait_event_address=hex(where.address),
        asleep_all_along_pids=sorted(slept_in),
        missed_runs=info.missed_runs,
        unseen_events=records.unseen(snapshot, previous),
        lost_pids=[p for p in records.lost_pids(snapshot, previous) if is_ours(p)],
        lost_gap_ms=round(records.gap_ns(snapshot, previous) / 1e6, 3),
        client_read_state_unknown_s=round(records.client_read_unknown_ns(result) / 1e9, 6),
        client_read_state_not_read=not_read or None,
    )
    if untraced_s is not None:  # a restarted tracer: the seconds before this window untraced
        meta["untraced_before_s"] = round(untraced_s, 6)
    has_graph = off is not None and fmt is not None and namer is not None
    if off is not None and fmt is not None and namer is not None:
        meta["stacks"] = [s.as_json() for s in off]
        meta.update(namer.facts())
        if ns.output in (None, "-"):  # stdout holds the graph
            emit_stacks(ns, fmt, off, meta, targets, namer)
            common.print_losses(info)
            return
    if ns.json:
        common.print_json(NAME, meta, [r.as_json() for r in result])
    else:
        show(meta, result, by_pid, info, not_read)
    if has_graph:
        # The graph's file after the table: a full disk then loses the file, not the table.
        assert off is not None and fmt is not None and namer is not None
        emit_stacks(ns, fmt, off, meta, targets, namer)


def show(
    meta: dict[str, Any],
    result: list[records.Row],
    by_pid: bool,
    info: RunInfo,
    not_read: str | None,
) -> None:
    """The time model's table on stdout, its losses and notes on stderr."""
    title = common.title("Time model", meta) + (
        f"; {meta['processes']} processes, {meta['process_seconds']:.1f} process-seconds"
    )
    view.show(title, result, by_pid, meta)
    common.print_losses(info)
    warning = records.lost_warning(meta["unseen_events"], meta["lost_gap_ms"])
    if warning:
        common.warn(warning)
    note = records.client_read_warning(result, not_read)
    if note:
        common.warn(note, "note")


def emit_stacks(
    ns: argparse.Namespace,
    fmt: str,
    off: list[stacks.OffCpuStack],
    meta: dict[str, Any],
    targets: Targets,
    namer: offcpu.StackNamer,
) -> None:
    """The off-CPU graph (or pprof) of the capture, and its warnings on stderr."""
    title = common.title("Off-CPU time by wait event", meta)
    total_s = sum(s.ns for s in off) / 1e9
    facts = {"window": f"{meta['window_s']:.1f} s", "off-CPU": f"{total_s:.3f} s",
             "unit": "microseconds"}  # fmt: skip

    def describe(pid: int) -> Any:
        return targets.cluster.backend(pid) or namer.describe(pid)

    view.emit_stacks(ns, fmt, off, title, facts, targets, describe, meta["window_s"])
    offcpu.print_warnings(namer, off)


def output_format(ns: argparse.Namespace) -> str | None:
    """The stacks' format, or None without --stacks (checked before the capture)."""
    if not ns.stacks:
        if ns.format or ns.output or ns.unwind or ns.idle:
            flag = (
                "--format"
                if ns.format
                else "-o"
                if ns.output
                else "--unwind"
                if ns.unwind
                else "--idle"
            )
            offcpu.raise_usage(f"{flag} is for --stacks")
        return None
    fmt: str = ns.format or ("pprof" if pprof_export.wants_pprof(ns.output) else "svg")
    if ns.json and ns.output in (None, "-"):
        offcpu.raise_usage("--stacks --json: give -o FILE for the stacks (stdout holds the JSON)")
    check_output(ns, fmt)
    return fmt
