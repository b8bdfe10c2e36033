"""`pgprobe clog-reads`: the CLI glue (options, the capture loop, JSON or the terminal view).

Long because one idea holds it together (~400 lines): each summary's reads beside the
pg_stat_slru reading taken at the same edge of its window (the probes live, each window's
end as bpftrace prints it, the probes stopped), which the capture loop threads through."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pgprobe.discover import Backend, Targets
from pgprobe.engines import bpftrace, sigqueue
from pgprobe.engines.base import Line, RunInfo, Snapshot
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.literal import literal
from pgprobe.pgstats import SlruStats
from pgprobe.stacks import fold, write_folded
from pgprobe.tools import aliases, bystatement, common, pprof_export, profiling
from pgprobe.tools.clog_reads import compiled, stacks, statements, view
from pgprobe.tools.clog_reads.probe import (
    MODE_AGGREGATE,
    MODE_STACKS,
    MODE_TRACE,
    SLRU_BITS,
    SOURCES,
    UPROBE_FIRE_NS,
    UprobeCapture,
    check_server,
    choose_source,
    index_mask,
    selected_slrus,
    slru_mask,
    slru_value,
    start,
    start_uprobe,
)
from pgprobe.tools.clog_reads.records import (
    TRACE_HEADER,
    StackRow,
    group_rows,
    open_errors,
    parse_trace_line,
    records,
)
from pgprobe.tools.clog_reads.stacks import DwarfStacks, StackNamer, stacks_file

NAME = "clog-reads"
FORMATS = ("folded", "pprof")


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="physical reads of SLRU pages (pg_xact, pg_subtrans, ...) per backend",
        description="Count the SLRU page reads (pg_xact by default) per backend, beside "
        "pg_stat_slru's deltas over the same window; --stacks shows the code paths that "
        "miss, --source syscalls adds files and latency, --trace every read.",
    )
    common.add_tracing_arguments(parser, default_duration=10)
    parser.add_argument(
        "--slru",
        type=slru_value,
        action="append",
        default=[],
        metavar="LIST",
        help="SLRUs to trace, comma-separated or repeated: "
        + ", ".join(SLRU_BITS)
        + ", or all (default pg_xact; pg_xact and pg_clog select each other)",
    )
    parser.add_argument(
        "--stacks",
        action="store_true",
        help="also count the user stack of each read and show the top code paths",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        action=aliases.OneValue,
        help="with --stacks: the file -o writes: folded (FlameGraph folded stacks, for "
        "`pgprobe flame --from FILE`; the default) or pprof (reads per stack and pid, gzipped "
        "profile.proto for go tool pprof, Pyroscope, Parca; -o FILE.pb.gz implies it)",
    )
    parser.add_argument(
        "-o", "--output", metavar="FILE", action=aliases.OneValue,
        help="write the read stacks to FILE, as --format says (implies --stacks)",
    )  # fmt: skip
    # The old spellings: --folded FILE is --format folded -o FILE, --pprof FILE likewise.
    for fmt in FORMATS:
        aliases.add_alias(parser, f"--{fmt}", dest="output", metavar="FILE",
                         action=aliases.OutputAs, const=fmt)  # fmt: skip
    parser.add_argument(
        "--source",
        choices=SOURCES,
        help="uprobe (default): a uprobe on pgstat_count_slru_page_read, where PostgreSQL "
        "counts the read; free when nothing misses, but a trap per read, which adds up when "
        "many reads miss. syscalls: follows open/pread/close of every process (a small cost "
        "per system call, whether or not it is an SLRU read) and adds segment files, bytes "
        "and latency; --trace needs it. Their costs: see docs/clog-reads.md",
    )
    parser.add_argument(
        "--trace", action="store_true", help="print every read as it happens (like rsnoop; "
        "implies --source syscalls)",
    )  # fmt: skip
    parser.add_argument(
        "--interval",
        type=common.positive_int,
        metavar="N",
        help="print a fresh summary every N seconds until the duration ends",
    )
    profiling.add_unwind_argument(parser)
    bystatement.add_arguments(parser, by=("pid",))
    parser.set_defaults(run=run)


@dataclass
class Session:
    """One run of the command: what every snapshot's output needs."""

    ns: argparse.Namespace
    targets: Targets
    slrus: list[str]
    stats: SlruStats
    namer: StackNamer | None
    mono_to_wall_ns: int = field(default_factory=lambda: time.time_ns() - time.monotonic_ns())
    header_printed: bool = False
    warned_unavailable: str | None = None  # said on stderr at the start
    source: str = "uprobe"
    mask: int | None = None  # the uprobe script's INDEX_MASK (1 << pg_stat_slru row)
    dwarf: DwarfStacks | None = None  # --stacks with --unwind dwarf: perf's stacks
    folded: dict[str, int] = field(default_factory=dict)  # every snapshot's, for folded
    all_stacks: list[StackRow] = field(default_factory=list)  # every snapshot's, for pprof
    closing: dict[str, dict[str, Any]] | None = None  # pg_stat_slru when the probes stopped
    closing_s: float = 0.0  # its window's seconds
    texts: bystatement.Texts | None = None  # --by query or --query-id: the statements' texts

    def keep(self, pid: int) -> bool:
        """Reads of the targets; never those of pgprobe's own sessions."""
        own = (self.stats.pid, self.targets.cluster.own_pid, self.texts and self.texts.own_pid)
        if pid in own:
            return False
        return self.targets.whole_cluster or pid in self.targets.pids

    def describe(self, pid: int) -> Backend:
        found = self.targets.cluster.backend(pid)
        if found is None and self.namer is not None:
            found = self.namer.describe(pid)
        return found or self.targets.describe(pid)

    # -- streaming

    def on_line(self, line: Line) -> None:
        read = parse_trace_line(line.text)
        if read is None:
            if line.text.startswith("TIME_NS"):
                if not self.ns.json and not self.header_printed:
                    print(TRACE_HEADER, flush=True)
                    self.header_printed = True
            elif line.text.strip():
                common.warn(f"unexpected line from the tracer: {line.text[:120]}")
            return
        if not self.keep(read.pid):
            return
        if self.ns.json:
            print(json.dumps(read.as_json(self.mono_to_wall_ns)), flush=True)
        else:
            print(literal(read.text(self.mono_to_wall_ns)), flush=True)

    # -- one summary

    def emit(self, snapshot: Snapshot, info: RunInfo, slru_delta: Any, window_s: float) -> None:
        if snapshot.final:
            common.refresh_if_needed(self.targets, True)
        if snapshot.final and self.dwarf is not None:
            self._add_dwarf_stacks(snapshot)
        recs = [r for r in records(snapshot) if self.keep(r.pid)]
        shown, by_query = None, None
        if self.texts is not None:
            shown, by_query = statements.rows(self.texts, snapshot, self.ns, self.targets,
                                              self.source == "syscalls", self.keep)  # fmt: skip
        shown = recs if shown is None else shown
        per_file = group_rows(shown, "file", self.describe)
        errors = open_errors(snapshot, self.keep)
        stacks = self.namer.rows(snapshot, self.keep) if self.namer is not None else None
        for row in stacks or ():
            key = literal(fold(row.frames))  # a text format: names as text, one stack a line
            self.folded[key] = self.folded.get(key, 0) + row.reads
        self.all_stacks += stacks or ()
        meta = common.meta(
            self.targets,
            info,
            snapshot,
            interval=self.ns.interval,
            slru=self.slrus,
            slru_mask=self.mask if self.mask is not None else slru_mask(self.slrus),
            mode="trace" if self.ns.trace else "stacks" if self.ns.stacks else "aggregate",
            source=self.source,
            reads=sum(r.reads for r in (by_query if by_query is not None else shown)),
        )
        if self.texts is not None:
            meta.update(by=self.ns.by or "pid", query_id=self.ns.query_id,
                        query_ids_note=self.texts.note)  # fmt: skip
        if self.source == "syscalls":
            if self.texts is None:  # (the statement's reads are counted, not sized)
                meta["bytes"] = sum(r.bytes for r in recs)
        else:
            fires = snapshot.get("fires").get((), 0)
            assert isinstance(fires, int)
            meta["uprobe_fires"] = fires
            meta["uprobe_cpu_s_estimate"] = round(fires * UPROBE_FIRE_NS / 1e9, 3)
        if self.ns.stacks:
            meta["unwind"] = "dwarf" if self.dwarf is not None else "fp"
        meta["slru_stats"] = slru_delta
        meta["slru_stats_window_s"] = round(window_s, 3) if slru_delta else None
        meta["slru_stats_unavailable"] = self.stats.unavailable
        meta["open_errors"] = [e.as_json() for e in errors]
        if stacks is not None:
            meta["stacks"] = [s.as_json() for s in stacks]
            meta["reads_without_stack"] = self.namer.unnamed_reads if self.namer else 0
        if self.ns.json:
            rows = by_query if by_query is not None else per_file
            common.print_json(NAME, meta, [r.as_json() for r in rows])
        else:
            if self.header_printed:
                print()  # after the trace lines
            view.print_tables(
                meta, recs, slru_delta, self.slrus, self.targets, self.stats, self.describe,
                shown, None if by_query is None or self.texts is None else (by_query, self.texts),
            )  # fmt: skip
            if stacks is not None:
                view.print_stacks(stacks, meta["reads"], meta.get("unwind", ""))
        view.print_open_errors(errors)
        fires = meta.get("uprobe_fires", 0)
        cost = view.cost_line(fires, meta["duration_s"], UPROBE_FIRE_NS, self.source,
                              self.targets.cluster.binary)  # fmt: skip
        if cost and not self.ns.json:
            print(literal(cost), file=sys.stderr)
        if snapshot.final:
            self._write_files(info)  # after the tables, which a full disk then cannot lose
            common.print_losses(info)
            if self.stats.unavailable and self.stats.unavailable != self.warned_unavailable:
                common.warn(self.stats.unavailable)
            if stacks is not None and self.namer is not None:
                for line in self.namer.symbolizer.stats.warnings():
                    common.warn(line)

    def _write_files(self, info: RunInfo) -> None:
        if self.ns.format == "folded":
            write_folded(self.ns.output, self.folded)
        elif self.ns.format == "pprof":
            profile = pprof_export.reads_profile(self.all_stacks, self.targets, self.describe,
                                                 info.duration_seconds)  # fmt: skip
            pprof_export.write(self.ns.output, profile)

    def _add_dwarf_stacks(self, snapshot: Snapshot) -> None:
        """perf's unwound stacks as the final snapshot's read_stacks (said if perf failed)."""
        assert self.dwarf is not None
        stacks = self.dwarf.finish()
        if stacks is None:
            common.warn(f"no DWARF stacks: {self.dwarf.error}")
            return
        snapshot.maps["read_stacks"] = stacks.get("read_stacks")
        for warning in self.dwarf.warnings:
            common.warn(warning)
        if self.dwarf.lost:
            common.warn(f"perf lost {self.dwarf.lost:,} read stacks (its buffer was full): "
                        "the stacks undercount the reads")  # fmt: skip
        cut = 0
        for key, n in stacks.get("read_stacks").items():
            assert isinstance(key, tuple) and isinstance(n, int)
            if key in self.dwarf.stops:
                cut += n
        if cut:
            reasons = sorted(set(self.dwarf.stops.values()))[:3]
            common.warn(f"{cut:,} read stacks stopped early ({'; '.join(reasons)})")


def run(ns: argparse.Namespace) -> int:
    common.check_interval(ns)
    stacks_file(ns)
    if ns.stacks and ns.trace:
        raise PgprobeError("--stacks and --trace cannot be combined: choose one", EXIT_USAGE)
    if ns.trace and ns.source == "uprobe":
        raise PgprobeError("--trace needs --source syscalls (the uprobe has no files, "
                           "offsets or latency)", EXIT_USAGE)  # fmt: skip
    by_statement = statements.check(ns)
    # the uprobe's counts come from bpf/clog_reads.bpf.o where it loads: no bpftrace needed
    uprobe_only = ns.source in (None, "uprobe") and not ns.stacks and not ns.trace
    targets = common.prepare(ns, check_server, compiled.OBJECT if uprobe_only else None)
    where = statements.where(ns, targets) if by_statement else list(bystatement.NO_READ)
    slrus = selected_slrus(ns.slru, targets.cluster.major if targets.cluster.version_num else 99)
    stats = SlruStats.open(targets.cluster)
    if stats.unavailable:
        common.warn(stats.unavailable)
    session = Session(ns, targets, slrus, stats, StackNamer.start(targets) if ns.stacks else None)
    session.warned_unavailable = stats.unavailable
    mode = MODE_TRACE if ns.trace else MODE_STACKS if ns.stacks else MODE_AGGREGATE
    session.source, order = choose_source(ns, targets, mode)
    try:
        session.texts = statements.start_texts(ns, targets) if by_statement else None
        capture: Any
        if session.source == "syscalls":
            capture = start(ns, targets, slrus, mode, ns.interval, True, where)
        else:
            assert order is not None
            session.mask = index_mask(order, slrus)
            if session.namer is not None and stacks.unwind_mode(ns, targets) == "dwarf":
                indexes = [i for i in range(len(order)) if session.mask >> i & 1]
                session.dwarf = stacks.start_dwarf(targets, session.namer, indexes)
                mode = MODE_AGGREGATE  # bpftrace counts, perf takes the stacks
            capture = start_uprobe(ns, targets, slrus, order, mode, ns.interval, True, where)
        final = _run_capture(session, capture)
        if final is None:
            raise common.nothing_kept(capture.info)
        snapshot, info = final
        _merge_repeated_warnings(info)
        # The closing pg_stat_slru read was taken when the probes stopped counting;
        # without that moment (the tracer died), now.
        if session.closing is not None:
            session.emit(snapshot, info, session.closing, session.closing_s)
        else:
            session.emit(snapshot, info, stats.delta(), stats.window_s)
    finally:
        stats.close()
        if session.texts is not None:
            session.texts.stop()  # (finish() stopped it unless the capture failed)
        if session.dwarf is not None and session.dwarf.thread.is_alive():
            session.dwarf.finish()
    return 0


def _run_capture(session: Session, capture: Any) -> tuple[Snapshot, RunInfo] | None:
    """Stream lines, print interval summaries; return the final snapshot (printed later).

    The final summary waits for the tracer's exit: its stderr then says what
    was lost, and pg_stat_slru's "after" is read then.
    """
    ns = session.ns
    countdown = common.Countdown(f"SLRU reads of {', '.join(session.slrus)}", ns.duration)
    inner = capture.inner if isinstance(capture, UprobeCapture) else capture
    stopper = (
        inner.process
        if isinstance(inner, bpftrace.BpftraceCapture) and inner.process.stops_on_signal
        else None
    )
    attached = False
    closing: dict[str, dict[str, Any]] | None = None
    closing_s = 0.0
    # pg_stat_slru at each interval's end, as bpftrace prints that window's time line; its
    # snapshot comes only with the next one (the parser cannot tell it is whole before).
    ends: deque[tuple[dict[str, dict[str, Any]] | None, float]] = deque()

    def tick(info: RunInfo, remaining: float | None) -> None:
        # Called right after the chunk of output that made the probes live, or
        # showed that they stopped counting: the SQL window's edges.
        nonlocal attached, closing, closing_s
        if remaining is not None and not attached:
            attached = True
            session.stats.start()
            if stopper is not None and stopper.pid is not None:
                # clog_reads.bt counts from this signal 0 (no-op) on: right after the read.
                sigqueue.send(stopper.pid, 0)
        if info.stopped_counting and attached and closing is None:
            closing, closing_s = session.stats.delta(), session.stats.window_s
        if session.namer is not None:
            session.namer.tick()
        countdown.tick(info, remaining)

    def close_window() -> None:
        # Just before the SIGINT at which clog_reads.bt stops counting.
        nonlocal closing, closing_s
        if attached and closing is None:
            closing, closing_s = session.stats.delta(), session.stats.window_s

    def window_end() -> None:
        if ns.interval and attached and closing is None:
            ends.append((session.stats.delta(), session.stats.window_s))

    capture.on_tick = tick
    if isinstance(inner, bpftrace.BpftraceCapture):
        inner.on_time = window_end
    if stopper is not None:
        stopper.before_signal = close_window
    final: tuple[Snapshot, RunInfo] | None = None
    # A countdown would be stopped and restarted for every line in trace mode.
    with countdown if not ns.trace else contextlib.nullcontext(countdown):
        for event in capture.events():
            if isinstance(event, Line):
                with countdown.paused():
                    session.on_line(event)
            elif event.final:
                final = (event, capture.info)
                session.closing, session.closing_s = closing, closing_s
            else:
                delta, window_s = ends.popleft() if ends else (session.stats.delta(), 0.0)
                with countdown.paused():
                    session.emit(event, capture.info, delta, window_s or session.stats.window_s)
    return final


def _merge_repeated_warnings(info: RunInfo) -> None:
    """A warning repeated per event (a bpf helper failing) is said once, with a count."""
    counts: dict[str, int] = {}
    for w in info.warnings:
        counts[w] = counts.get(w, 0) + 1
    info.warnings[:] = [f"{w} ({n} times)" if n > 1 else w for w, n in counts.items()]
