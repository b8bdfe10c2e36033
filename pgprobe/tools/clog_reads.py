"""`pgprobe clog-reads`: physical reads of SLRU pages per backend and file (bpf/clog_reads.bt).

The rsnoop of pg_xact and the other SLRUs. An SLRU buffer miss in PostgreSQL
(SimpleLruReadPage -> SlruPhysicalReadPage) opens the segment file, preads one
BLCKSZ page and closes it; the probe script follows those system calls (syscall
tracepoints only, no kprobes, no USDT) and keeps, per (pid, file): reads,
bytes, latency total / max / log2 histogram. This module turns those into:

- a table per backend and SLRU (pid, backend type, application, reads, bytes,
  avg / p99 / max latency, the segment files), and totals per SLRU;
- beside the totals, the ``pg_stat_slru`` deltas over the same window
  (blks_hit, blks_read, hit ratio), read through pgprobe's read-only session
  (see SlruStats for what that cross-check can and cannot promise);
- ``--stacks``: the user stacks of the reads, named in Python with the
  profiling tools' path (pgprobe.symbolize.Symbolizer + folded_names), with
  counts: the code paths that miss (TransactionIdGetStatus <- ... );
- ``--trace``: one line per read as it completes (time, pid, file, offset,
  bytes, latency), then the summary.

JSON (``--json``): rows per (pid, file) with ``pid``, ``backend_type``,
``application_name``, ``slru``, ``file``, ``reads``, ``bytes``, ``total_us``,
``avg_us``, ``p50_us``, ``p99_us``, ``max_us``; ``meta.slru_stats`` holds the
pg_stat_slru deltas per SLRU (null when unavailable, with
``meta.slru_stats_unavailable`` saying why), ``meta.open_errors`` the failed
opens of SLRU files, ``meta.stacks`` the stacks with --stacks. With
``--trace --json`` every read is first printed as a JSON line of its own
(``"event": "read"``), the document comes last.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgprobe import discover, histogram, pgstats
from pgprobe.discover import Backend, Targets
from pgprobe.engines.base import (
    Capture,
    KeyKind,
    Line,
    Log2Hist,
    MapSpec,
    NamedStack,
    RunInfo,
    Snapshot,
    Stats,
)
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.render import table
from pgprobe.stacks import fold, write_folded
from pgprobe.symbolize import Frame, Symbolizer, folded_names
from pgprobe.tools import common, pprof_export, profiling

NAME = "clog-reads"
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
STAT_COLUMNS = (
    "blks_zeroed",
    "blks_hit",
    "blks_read",
    "blks_written",
    "blks_exists",
    "flushes",
    "truncates",
)
STATS_SQL = f"SELECT name, {', '.join(STAT_COLUMNS)} FROM pg_stat_slru"
STACKS_SHOWN = 10
FILES_SHOWN = 4

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


# -- options ---------------------------------------------------------------------------------


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


def slru_of(file: str) -> str:
    """The SLRU directory of a file as opened: 'pg_multixact/offsets/0000' -> its dir."""
    head, _, _ = file.rpartition("/")
    return head or file


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="physical reads of SLRU pages (pg_xact, pg_subtrans, ...) per backend",
        description="Count the reads of SLRU segment files (pg_xact by default) per "
        "backend and file, with latency, beside pg_stat_slru's deltas over the same "
        "window; --stacks shows the code paths that miss, --trace every read.",
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
        "--folded",
        metavar="FILE",
        help="with --stacks: write the read stacks as FlameGraph folded stacks to FILE "
        "(render with `pgprobe flame --from FILE`)",
    )
    parser.add_argument(
        "--pprof", metavar="FILE", help="with --stacks: write the reads per stack and pid as a "
        "pprof profile (gzipped profile.proto, for go tool pprof, Pyroscope, Parca) to FILE",
    )  # fmt: skip
    parser.add_argument(
        "--trace", action="store_true", help="print every read as it happens (like rsnoop)"
    )
    parser.add_argument(
        "--interval",
        type=common.positive_int,
        metavar="N",
        help="print a fresh summary every N seconds until the duration ends",
    )
    parser.set_defaults(run=run)


def check_server(targets: Targets) -> None:
    """Syscall tracepoints only: any PostgreSQL version and build will do."""


def script_args(targets: Targets, mask: int, mode: int, interval: int | None) -> list[int | Path]:
    """$1 postmaster, $2 SLRU mask, $3 mode, $4 single pid (0: all), $5 interval."""
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    return [targets.cluster.postmaster_pid, mask, mode, single, interval or 0]


# -- records and rows ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadRecord:
    """What the kernel aggregated for one (pid, file)."""

    pid: int
    file: str
    reads: int
    total_ns: int
    bytes: int
    max_ns: int
    hist: Log2Hist

    @property
    def slru(self) -> str:
        return slru_of(self.file)


def records(snapshot: Snapshot) -> list[ReadRecord]:
    stats, nbytes, maxes, hists = (snapshot.get(m.name) for m in MAPS[:4])
    out = []
    for key, value in stats.items():
        assert isinstance(value, Stats)
        pid, file = key
        assert isinstance(pid, int) and isinstance(file, str)
        got_bytes, max_ns = nbytes.get(key, 0), maxes.get(key, 0)
        hist = hists.get(key, Log2Hist(()))
        assert isinstance(got_bytes, int) and isinstance(max_ns, int)
        assert isinstance(hist, Log2Hist)
        out.append(ReadRecord(pid, file, value.count, value.total, got_bytes, max_ns, hist))
    return out


@dataclass(frozen=True)
class OpenError:
    pid: int
    file: str
    count: int

    def as_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "slru": slru_of(self.file), "file": self.file, "count": self.count}


def open_errors(snapshot: Snapshot, keep: Any) -> list[OpenError]:
    out = []
    for (pid, file), value in snapshot.get("open_errors").items():
        assert isinstance(pid, int) and isinstance(file, str) and isinstance(value, int)
        if keep(pid):
            out.append(OpenError(pid, file, value))
    return sorted(out, key=lambda e: (-e.count, e.pid, e.file))


@dataclass(frozen=True)
class ReadRow:
    """Reads of one group of files: a (pid, file) for JSON, a (pid, SLRU) or an SLRU for tables."""

    slru: str
    files: tuple[str, ...]
    reads: int
    total_ns: int
    bytes: int
    max_ns: int
    hist: Log2Hist
    pid: int | None = None
    backend_type: str = ""
    application_name: str = ""
    pids: tuple[int, ...] = ()

    @property
    def avg_us(self) -> float:
        return self.total_ns / self.reads / 1000 if self.reads else 0.0

    def percentile_us(self, fraction: float) -> float:
        return histogram.percentile(self.hist, fraction, self.max_ns) / 1000

    def as_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "backend_type": self.backend_type,
            "application_name": self.application_name,
            "slru": self.slru,
            "file": self.files[0] if len(self.files) == 1 else ",".join(self.files),
            "reads": self.reads,
            "bytes": self.bytes,
            "total_us": round(self.total_ns / 1000, 3),
            "avg_us": round(self.avg_us, 3),
            "p50_us": round(self.percentile_us(0.50), 3),
            "p99_us": round(self.percentile_us(0.99), 3),
            "max_us": round(self.max_ns / 1000, 3),
        }


def _merge(
    recs: Sequence[ReadRecord], slru: str, pid: int | None, backend: Backend | None
) -> ReadRow:
    return ReadRow(
        slru=slru,
        files=tuple(sorted({r.file for r in recs})),
        reads=sum(r.reads for r in recs),
        total_ns=sum(r.total_ns for r in recs),
        bytes=sum(r.bytes for r in recs),
        max_ns=max(r.max_ns for r in recs),
        hist=histogram.merge(r.hist for r in recs),
        pid=pid,
        backend_type=backend.backend_type if backend else "",
        application_name=backend.application_name if backend else "",
        pids=tuple(sorted({r.pid for r in recs})),
    )


def _order(row: ReadRow) -> tuple[int, int, str, str]:
    return (-row.reads, row.pid or 0, row.slru, ",".join(row.files))


def group_rows(recs: Sequence[ReadRecord], by: str, describe: Any = None) -> list[ReadRow]:
    """Rows per "file" ((pid, file): JSON), "pid" ((pid, SLRU): the table) or "slru"."""
    groups: dict[tuple[int | None, str, str], list[ReadRecord]] = defaultdict(list)
    for rec in recs:
        if by == "file":
            groups[(rec.pid, rec.slru, rec.file)].append(rec)
        elif by == "pid":
            groups[(rec.pid, rec.slru, "")].append(rec)
        else:
            groups[(None, rec.slru, "")].append(rec)
    out = []
    for (pid, slru, _), group in groups.items():
        backend = describe(pid) if describe is not None and pid is not None else None
        out.append(_merge(group, slru, pid, backend))
    out.sort(key=_order)
    return out


# -- pg_stat_slru ----------------------------------------------------------------------------


@dataclass
class SlruStats:
    """pg_stat_slru read through pgprobe's read-only session, before and after the capture.

    What the cross-check can promise: pg_stat_slru counts a blks_read in
    SimpleLruReadPage just before the physical read the probe sees (one open,
    one pread of BLCKSZ, one close), and a blks_hit for a page found in the
    SLRU buffers (no I/O). So the probe's reads of an SLRU equal its
    blks_read delta exactly over a window whose edges no unflushed count
    crosses (failed opens aside: pg_stat_slru counts them as reads, the
    probe as open errors).

    What it cannot: the counters are cluster-wide (a --pid capture sees only
    some of the backends that add to them), and they are not live. A backend
    keeps its counts in local memory and adds them to the shared stats when
    it flushes: on PostgreSQL 15+ when it goes idle outside a transaction
    block, at most once a second (PGSTAT_MIN_INTERVAL), never in the middle
    of a long query or transaction, and a backend that goes idle less than a
    second after its last flush keeps its counts until its idle timeout
    (PGSTAT_IDLE_INTERVAL, 10 s) or its next transaction a second later; on
    13-14 it sends them to the statistics collector at most every 500 ms,
    and readers see the collector's file. pg_stat_force_next_flush() acts on the calling
    session only, so pgprobe cannot make the other backends flush.

    One window: the probe script counts from its BEGIN (run once every probe
    is attached; it prints "@@live") to the start of its END (after SIGINT,
    before bpftrace prints its maps, which takes a second or more while the
    probes stay attached). pgprobe reads "before" as soon as "@@live" arrives
    and "after" as soon as END's first line does, so both windows agree
    within the few milliseconds a line takes to arrive and a query to run.
    What remains is PostgreSQL's own lag: reads made shortly before the
    window and flushed inside it are in the delta but not traced, reads near
    its end not flushed yet are traced but not in the delta; on a steady
    load these nearly cancel out, and on a quiet window (every backend that
    read had flushed its counts before the end, and had nothing pending at
    the start) the two agree exactly. Waiting for the counts to settle after
    the capture was tried and dropped: it lets every read made during the
    wait into the delta without tracing it, a bias that does not cancel.
    """

    conn: Any = None
    pid: int | None = None  # the session's backend: not a target
    unavailable: str | None = None
    before: dict[str, dict[str, Any]] | None = None
    before_at: float = 0.0
    last: dict[str, dict[str, Any]] | None = None
    window_s: float = 0.0

    @classmethod
    def open(cls, cluster: discover.Cluster) -> SlruStats:
        if cluster.version_num and cluster.major < 13:
            return cls(
                unavailable=f"PostgreSQL {cluster.version.split()[0]} has no pg_stat_slru "
                "(13 and later): the cross-check is unavailable; tracing anyway"
            )
        if cluster.conninfo is None:
            return cls(
                unavailable="no connection to PostgreSQL (targets found from /proc): "
                "the pg_stat_slru cross-check is unavailable"
            )
        stats = cls()
        try:
            stats.conn = discover.connect_conninfo(cluster.conninfo)
            stats.pid = int(stats.conn.info.backend_pid)
            stats._query()  # warms the session's caches before the window
        except Exception as exc:  # noqa: BLE001 - one line, and tracing goes on
            stats._give_up(exc)
        return stats

    def _give_up(self, exc: BaseException) -> None:
        text = exc.message if isinstance(exc, PgprobeError) else str(exc).splitlines()[0]
        self.unavailable = f"cannot read pg_stat_slru ({text}): the cross-check is unavailable"
        self.close()

    def _query(self) -> dict[str, dict[str, Any]]:
        with self.conn.cursor() as cur:
            cur.execute(STATS_SQL)
            rows = cur.fetchall()
        out: dict[str, dict[str, Any]] = {}
        for name, *values in rows:
            slru = STAT_NAMES.get(str(name), str(name))
            out[slru] = {
                "name": str(name),
                **{c: int(v) for c, v in zip(STAT_COLUMNS, values, strict=True)},
            }
        return out

    def read(self) -> dict[str, dict[str, Any]] | None:
        if self.conn is None:
            return None
        try:
            return self._query()
        except Exception as exc:  # noqa: BLE001
            self._give_up(exc)
            return None

    def start(self) -> None:
        """The window's start: read right after the probes attached."""
        self.before = self.read()
        self.before_at = time.monotonic()
        self.last = self.before

    def delta(self) -> dict[str, dict[str, Any]] | None:
        """The deltas since the last read (the window's start, or the previous interval)."""
        if self.last is None:
            if self.conn is not None and self.unavailable is None:
                self.unavailable = "the capture ended before pg_stat_slru was first read"
            return None
        now = self.read()
        if now is None:
            return None
        out: dict[str, dict[str, Any]] = {}
        for slru, row in now.items():
            old = self.last.get(slru, {})
            d = {c: row[c] - int(old.get(c, 0)) for c in STAT_COLUMNS}
            accesses = d["blks_hit"] + d["blks_read"]
            out[slru] = {
                "name": row["name"],
                **d,
                "hit_ratio_pct": round(100 * d["blks_hit"] / accesses, 2) if accesses else None,
            }
        self.window_s = time.monotonic() - self.before_at
        self.before_at = time.monotonic()
        self.last = now
        return out

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


# -- stacks ----------------------------------------------------------------------------------


@dataclass
class StackRow:
    """One code path that read SLRU pages: frame names innermost first."""

    frames: tuple[str, ...]
    reads: int = 0
    pids: set[int] = field(default_factory=set)
    by_pid: dict[int, int] = field(default_factory=dict)  # reads per pid (for pprof labels)

    def as_json(self) -> dict[str, Any]:
        return {
            "reads": self.reads,
            "pids": sorted(self.pids),
            "frames": list(self.frames),
            "folded": fold(self.frames),
        }


@dataclass
class StackNamer:
    """Names the raw stacks of @read_stacks with the profiling tools' symbolizer."""

    targets: Targets
    symbolizer: Symbolizer
    watcher: profiling.ChildWatcher | None
    unnamed_reads: int = 0  # reads whose stack the kernel did not give (hash collision)

    @classmethod
    def start(cls, targets: Targets) -> StackNamer:
        symbolizer = Symbolizer(kallsyms=False)
        symbolizer.set_fallback(targets.cluster.postmaster_pid)
        for pid in targets.pids:
            symbolizer.snapshot(pid)
        watcher = profiling.ChildWatcher(symbolizer, targets) if targets.whole_cluster else None
        if watcher is not None:
            watcher.scan()
        return cls(targets, symbolizer, watcher)

    def tick(self) -> None:
        if self.watcher is not None:
            self.watcher.tick()

    def describe(self, pid: int) -> Backend | None:
        return self.watcher.backends.get(pid) if self.watcher is not None else None

    def rows(self, snapshot: Snapshot, keep: Any) -> list[StackRow]:
        module = os.path.basename(self.targets.cluster.binary)
        self.unnamed_reads = 0
        merged: dict[tuple[str, ...], StackRow] = {}
        for (pid, stack), value in snapshot.get("read_stacks").items():
            assert isinstance(pid, int) and isinstance(value, int)
            if not keep(pid):
                continue
            frames: list[Frame]
            if isinstance(stack, NamedStack):
                frames = stack.symbolized()
            else:
                assert isinstance(stack, tuple)
                frames = self.symbolizer.user_frames(pid, stack, value)
            if not frames:
                self.unnamed_reads += value
            names = tuple(folded_names(frames, main=module)) or ("[unknown]",)
            row = merged.setdefault(names, StackRow(names))
            row.reads += value
            row.pids.add(pid)
            row.by_pid[pid] = row.by_pid.get(pid, 0) + value
        return sorted(merged.values(), key=lambda r: (-r.reads, r.frames))


# -- trace lines -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceRead:
    time_ns: int  # CLOCK_MONOTONIC at the end of the read
    pid: int
    file: str
    offset: int  # -1: unknown
    bytes: int
    lat_ns: int

    def wall(self, mono_to_wall_ns: int) -> dt.datetime:
        return dt.datetime.fromtimestamp((self.time_ns + mono_to_wall_ns) / 1e9)

    def as_json(self, mono_to_wall_ns: int) -> dict[str, Any]:
        return {
            "event": "read",
            "time": self.wall(mono_to_wall_ns).isoformat(timespec="microseconds"),
            "time_ns": self.time_ns,
            "pid": self.pid,
            "slru": slru_of(self.file),
            "file": self.file,
            "offset": self.offset,
            "bytes": self.bytes,
            "lat_us": round(self.lat_ns / 1000, 3),
        }

    def text(self, mono_to_wall_ns: int) -> str:
        clock = self.wall(mono_to_wall_ns).strftime("%H:%M:%S.%f")
        offset = str(self.offset) if self.offset >= 0 else "-"
        return (
            f"{clock:<15} {self.pid:>7}  {self.file:<27} {offset:>9} {self.bytes:>6} "
            f"{self.lat_ns / 1000:>9.1f}"
        )


TRACE_HEADER = f"{'TIME':<15} {'PID':>7}  {'FILE':<27} {'OFFSET':>9} {'BYTES':>6} {'LAT us':>9}"


def parse_trace_line(text: str) -> TraceRead | None:
    """One MODE 2 line of the script (TIME_NS PID FILE OFFSET BYTES LAT_NS); None: not one."""
    fields = text.rstrip("\n").split("\t")
    if len(fields) != 6:
        return None
    try:
        return TraceRead(
            int(fields[0]), int(fields[1]), fields[2], int(fields[3]), int(fields[4]),
            int(fields[5]),
        )  # fmt: skip
    except ValueError:
        return None


# -- the command -----------------------------------------------------------------------------


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
    folded: dict[str, int] = field(default_factory=dict)  # every snapshot's stacks, for --folded
    all_stacks: list[StackRow] = field(default_factory=list)  # every snapshot's, for --pprof
    closing: dict[str, dict[str, Any]] | None = None  # pg_stat_slru when the probes stopped

    def keep(self, pid: int) -> bool:
        """Reads of the targets; never those of pgprobe's own session."""
        if pid == self.stats.pid:
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
                print(f"pgprobe: warning: unexpected line from the tracer: {line.text[:120]}",
                      file=sys.stderr)  # fmt: skip
            return
        if not self.keep(read.pid):
            return
        if self.ns.json:
            print(json.dumps(read.as_json(self.mono_to_wall_ns)), flush=True)
        else:
            print(read.text(self.mono_to_wall_ns), flush=True)

    # -- one summary

    def emit(self, snapshot: Snapshot, info: RunInfo, slru_delta: Any) -> None:
        if snapshot.final:
            common.refresh_if_needed(self.targets, True)
        recs = [r for r in records(snapshot) if self.keep(r.pid)]
        per_file = group_rows(recs, "file", self.describe)
        errors = open_errors(snapshot, self.keep)
        stacks = self.namer.rows(snapshot, self.keep) if self.namer is not None else None
        for row in stacks or ():
            key = fold(row.frames)
            self.folded[key] = self.folded.get(key, 0) + row.reads
        if self.ns.folded and snapshot.final:
            write_folded(self.ns.folded, self.folded)
        self.all_stacks += stacks or ()
        if self.ns.pprof and snapshot.final:
            profile = pprof_export.reads_profile(self.all_stacks, self.targets, self.describe,
                                                 info.duration_seconds)  # fmt: skip
            pprof_export.write(self.ns.pprof, profile)
        meta = common.meta(
            self.targets,
            info,
            snapshot,
            interval=self.ns.interval,
            slru=self.slrus,
            slru_mask=slru_mask(self.slrus),
            mode="trace" if self.ns.trace else "stacks" if self.ns.stacks else "aggregate",
            reads=sum(r.reads for r in recs),
            bytes=sum(r.bytes for r in recs),
        )
        meta["slru_stats"] = slru_delta
        meta["slru_stats_window_s"] = round(self.stats.window_s, 3) if slru_delta else None
        meta["slru_stats_unavailable"] = self.stats.unavailable
        meta["open_errors"] = [e.as_json() for e in errors]
        if stacks is not None:
            meta["stacks"] = [s.as_json() for s in stacks]
            meta["reads_without_stack"] = self.namer.unnamed_reads if self.namer else 0
        if self.ns.json:
            common.print_json(NAME, meta, [r.as_json() for r in per_file])
        else:
            if self.header_printed:
                print()  # after the trace lines
            self.print_tables(meta, recs, slru_delta)
            if stacks is not None:
                print_stacks(stacks, meta["reads"])
        print_open_errors(errors)
        if snapshot.final:
            common.print_losses(info)
            if self.stats.unavailable and self.stats.unavailable != self.warned_unavailable:
                print(f"pgprobe: warning: {self.stats.unavailable}", file=sys.stderr)
            if stacks is not None and self.namer is not None:
                for line in self.namer.symbolizer.stats.warnings():
                    print(f"pgprobe: warning: {line}", file=sys.stderr)

    def print_tables(
        self, meta: dict[str, Any], recs: Sequence[ReadRecord], slru_delta: Any
    ) -> None:
        what = f"SLRU reads of {', '.join(self.slrus)}"
        if len(self.slrus) == len(SLRU_BITS) - 1:
            what = "SLRU reads of all SLRUs"
        title = common.title(what, meta)
        empty = (
            f"no reads of SLRU files in {meta['duration_s']:.1f} s "
            "(every lookup hit the SLRU buffers, or the targets did not look)"
        )
        per_pid = group_rows(recs, "pid", self.describe)
        table.render(title, PID_COLUMNS, [pid_cells(r) for r in per_pid], empty=empty)
        totals = group_rows(recs, "slru")
        rows = totals_cells(totals, slru_delta, self.slrus)
        if not rows and slru_delta is None:
            return
        print()
        table.render(
            totals_title(self.targets, slru_delta, self.stats),
            TOTAL_COLUMNS,
            rows,
            empty="no lookups of any SLRU in pg_stat_slru either",
        )
        note = agreement_note(totals, slru_delta, self.targets)
        if note:
            print(note)


PID_COLUMNS = [
    table.Column("pid", "PID", numeric=True),
    table.Column("backend_type", "BACKEND TYPE"),
    table.Column("application_name", "APPLICATION"),
    table.Column("slru", "SLRU"),
    table.Column("reads", "READS", numeric=True),
    table.Column("bytes", "BYTES", numeric=True),
    table.Column("avg_us", "AVG us", numeric=True),
    table.Column("p99_us", "P99 us", numeric=True),
    table.Column("max_us", "MAX us", numeric=True),
    table.Column("files", "FILES"),
]
TOTAL_COLUMNS = [
    table.Column("slru", "SLRU"),
    table.Column("reads", "READS", numeric=True),
    table.Column("bytes", "BYTES", numeric=True),
    table.Column("avg_us", "AVG us", numeric=True),
    table.Column("p99_us", "P99 us", numeric=True),
    table.Column("max_us", "MAX us", numeric=True),
    table.Column("backends", "BACKENDS", numeric=True),
    table.Column("blks_hit", "BLKS_HIT", numeric=True),
    table.Column("blks_read", "BLKS_READ", numeric=True),
    table.Column("hit_pct", "HIT %", numeric=True),
]


def files_cell(files: Sequence[str]) -> str:
    """Segment names of one SLRU: '0054 0055 0056', '+N' past FILES_SHOWN."""
    segments = [f.rpartition("/")[2] for f in files]
    shown = " ".join(segments[:FILES_SHOWN])
    more = len(segments) - FILES_SHOWN
    return f"{shown} +{more}" if more > 0 else shown


def latency_cells(row: ReadRow) -> dict[str, str]:
    return {
        "reads": f"{row.reads:,}",
        "bytes": f"{row.bytes:,}",
        "avg_us": f"{row.avg_us:,.1f}",
        "p99_us": f"{row.percentile_us(0.99):,.1f}",
        "max_us": f"{row.max_ns / 1000:,.1f}",
    }


def pid_cells(row: ReadRow) -> dict[str, str]:
    return {
        "pid": str(row.pid),
        "backend_type": row.backend_type,
        "application_name": row.application_name,
        "slru": row.slru,
        "files": files_cell(row.files),
        **latency_cells(row),
    }


def totals_cells(
    totals: Sequence[ReadRow], slru_delta: dict[str, dict[str, Any]] | None, slrus: Sequence[str]
) -> list[dict[str, str]]:
    """One row per SLRU that was read or whose pg_stat_slru counters moved, traced first."""
    by_slru = {r.slru: r for r in totals}
    moved = [slru for slru, d in (slru_delta or {}).items() if d["blks_hit"] or d["blks_read"]]
    names = [s for s in slrus if s in by_slru or s in moved]
    names += [s for s in [*by_slru, *moved] if s not in names]
    rows = []
    for slru in names:
        traced = slru in slrus or slru in by_slru
        row = by_slru.get(slru)
        cells = {"slru": slru if traced else f"{slru} (not traced)"}
        if row is not None:
            cells.update(latency_cells(row), backends=str(len(row.pids)))
        elif traced:
            cells.update(reads="0", bytes="0", backends="0")
        d = (slru_delta or {}).get(slru)
        if d is not None:
            ratio = d["hit_ratio_pct"]
            cells.update(
                blks_hit=f"{d['blks_hit']:,}",
                blks_read=f"{d['blks_read']:,}",
                hit_pct="-" if ratio is None else f"{ratio:.2f}%",
            )
        rows.append(cells)
    return rows


def totals_title(targets: Targets, slru_delta: Any, stats: SlruStats) -> str:
    if slru_delta is None:
        return f"Totals per SLRU (pg_stat_slru: {stats.unavailable or 'unavailable'})"
    scope = "" if targets.whole_cluster else "; pg_stat_slru counts the whole cluster"
    return (
        "Totals per SLRU, beside pg_stat_slru over the same window "
        f"({stats.window_s:.1f} s; BLKS_HIT/BLKS_READ are SLRU buffer hits/misses{scope})"
    )


def agreement_note(
    totals: Sequence[ReadRow], slru_delta: dict[str, dict[str, Any]] | None, targets: Targets
) -> str:
    """Where the traced reads and blks_read differ, the likely reason (one line)."""
    if slru_delta is None or not targets.whole_cluster:
        return ""
    differ = [
        f"{r.slru} {r.reads:,} vs {slru_delta[r.slru]['blks_read']:,}"
        for r in totals
        if r.slru in slru_delta and r.reads != slru_delta[r.slru]["blks_read"]
    ]
    if not differ:
        return ""
    return (
        "Traced reads and blks_read differ (" + "; ".join(differ) + "): backends publish "
        "their pg_stat_slru counts when idle, at most once a second and sometimes 10 s later, "
        "so reads near the window's edges are counted in another window (docs/clog-reads.md)"
    )


def print_stacks(stacks: Sequence[StackRow], reads: int) -> None:
    shown = stacks[:STACKS_SHOWN]
    print()
    if not stacks:
        print("No read stacks (no reads)")
        return
    print(
        f"Top reading code paths: {len(shown)} of {len(stacks)} distinct user stacks "
        "(innermost frame first; --json has them all)"
    )
    for row in shown:
        share = 100 * row.reads / reads if reads else 0.0
        pids = ", ".join(str(p) for p in sorted(row.pids)[:6])
        if len(row.pids) > 6:
            pids += f", ... ({len(row.pids)} pids)"
        print(f"\n  {row.reads:,} reads ({share:.1f}%), pid {pids}")
        for name in row.frames:
            print(f"      {name}")


def print_open_errors(errors: Sequence[OpenError]) -> None:
    if not errors:
        return
    total = sum(e.count for e in errors)
    shown = ", ".join(f"pid {e.pid} {e.file} ({e.count})" for e in errors[:5])
    more = f", +{len(errors) - 5} more" if len(errors) > 5 else ""
    print(
        f"pgprobe: warning: {total} failed opens of SLRU files (counted as blks_read by "
        f"pg_stat_slru, not as reads here): {shown}{more}",
        file=sys.stderr,
    )


def start(
    ns: argparse.Namespace, targets: Targets, slrus: Sequence[str], mode: int, interval: int | None
) -> Capture:
    """clog_reads for the targets and SLRUs, ready to run (iterate its events)."""
    env = {
        "BPFTRACE_STRLEN": "40",  # the longest SLRU path as opened is 36 characters
        "BPFTRACE_MAP_KEYS_MAX": str(65536 if mode == MODE_STACKS else 16384),
    }
    if mode == MODE_STACKS:
        env["BPFTRACE_NO_USER_SYMBOLS"] = "1"
    args = script_args(targets, slru_mask(slrus), mode, interval)
    return common.capture(ns, SCRIPT, args, MAPS, env=env)


def run(ns: argparse.Namespace) -> int:
    if ns.interval and ns.interval > ns.duration:
        raise PgprobeError(
            f"--interval {ns.interval} is longer than the duration ({ns.duration:g} s)",
            EXIT_USAGE,
        )
    if ns.folded or ns.pprof:
        ns.stacks = True
    if ns.pprof:
        pprof_export.check_writable(ns.pprof)
    if ns.stacks and ns.trace:
        raise PgprobeError("--stacks and --trace cannot be combined: choose one", EXIT_USAGE)
    targets = common.prepare(ns, check_server)
    slrus = selected_slrus(ns.slru, targets.cluster.major if targets.cluster.version_num else 99)
    stats = SlruStats.open(targets.cluster)
    if stats.unavailable:
        print(f"pgprobe: warning: {stats.unavailable}", file=sys.stderr)
    session = Session(ns, targets, slrus, stats, StackNamer.start(targets) if ns.stacks else None)
    session.warned_unavailable = stats.unavailable
    mode = MODE_TRACE if ns.trace else MODE_STACKS if ns.stacks else MODE_AGGREGATE
    try:
        capture = start(ns, targets, slrus, mode, ns.interval)
        final = _run_capture(session, capture)
        if final is None:
            raise common.nothing_kept(capture.info)
        snapshot, info = final
        _merge_repeated_warnings(info)
        # The closing pg_stat_slru read was taken when the probes stopped counting;
        # without that moment (the tracer died), now.
        session.emit(snapshot, info, session.closing or stats.delta())
    finally:
        stats.close()
    return 0


def _run_capture(session: Session, capture: Any) -> tuple[Snapshot, RunInfo] | None:
    """Stream lines, print interval summaries; return the final snapshot (printed later).

    The final summary waits for the tracer's exit: its stderr then says what
    was lost, and pg_stat_slru's "after" is read then.
    """
    ns = session.ns
    countdown = common.Countdown(f"SLRU reads of {', '.join(session.slrus)}", ns.duration)
    attached = False
    closing: dict[str, dict[str, Any]] | None = None

    def tick(info: RunInfo, remaining: float | None) -> None:
        # Called right after the chunk of output that made the probes live, or
        # showed that they stopped counting: the SQL window's edges.
        nonlocal attached, closing
        if remaining is not None and not attached:
            attached = True
            session.stats.start()
        if info.stopped_counting and attached and closing is None:
            closing = session.stats.delta()
        if session.namer is not None:
            session.namer.tick()
        countdown.tick(info, remaining)

    capture.on_tick = tick
    final: tuple[Snapshot, RunInfo] | None = None
    # A countdown would be stopped and restarted for every line in trace mode.
    with countdown if not ns.trace else contextlib.nullcontext(countdown):
        for event in capture.events():
            if isinstance(event, Line):
                with countdown.paused():
                    session.on_line(event)
            elif event.final:
                final = (event, capture.info)
                session.closing = closing
            else:
                with countdown.paused():
                    session.emit(event, capture.info, session.stats.delta())
    return final


def _merge_repeated_warnings(info: RunInfo) -> None:
    """A warning repeated per event (a bpf helper failing) is said once, with a count."""
    counts: dict[str, int] = {}
    for w in info.warnings:
        counts[w] = counts.get(w, 0) + 1
    info.warnings[:] = [f"{w} ({n} times)" if n > 1 else w for w, n in counts.items()]
