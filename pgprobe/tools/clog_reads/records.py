"""What comes back from clog_reads: records per (pid, file), rows per group, trace lines. Pure.

A record is what the kernel aggregated for one (pid, file as opened) with the
syscall source, or for one (pid, SLRU) with the uprobe source (``timed`` False:
no file, bytes or latency); a row is what is shown: the reads of one group of
files, per (pid, file) for JSON, per (pid, SLRU) or per SLRU for the tables.
With --by query or --query-id the scripts also count the reads by the statement
each backend ran (QueryRead), shown per statement and SLRU (StatementRow).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pgprobe import histogram
from pgprobe.discover import Backend
from pgprobe.engines.base import Log2Hist, Snapshot, Stats
from pgprobe.stacks import fold
from pgprobe.tools.bystatement import Part, part
from pgprobe.tools.clog_reads.probe import MAPS, UPROBE_MAPS
from pgprobe.tools.queries.records import IDLE_IN_XACT, STATEMENT


def slru_of(file: str) -> str:
    """The SLRU directory of a file as opened: 'pg_multixact/offsets/0000' -> its dir."""
    head, _, _ = file.rpartition("/")
    return head or file


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
    timed: bool = True  # False: the uprobe source (file is the SLRU directory, no latency)

    @property
    def slru(self) -> str:
        return slru_of(self.file) if self.timed else self.file


def records(snapshot: Snapshot) -> list[ReadRecord]:
    """The records of either source (the uprobe's "reads" keyed by (pid, directory))."""
    out = []
    for key, value in snapshot.get(UPROBE_MAPS[0].name).items():
        pid, slru = key
        assert isinstance(pid, int) and isinstance(slru, str) and isinstance(value, int)
        out.append(ReadRecord(pid, slru, value, 0, 0, 0, Log2Hist(()), timed=False))
    stats, nbytes, maxes, hists = (snapshot.get(m.name) for m in MAPS[:4])
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
class QueryRead:
    """Reads of one pid and SLRU under one (st_state, st_query_id) that the probe read."""

    pid: int
    slru: str
    state: int
    query_id: int
    reads: int


def query_reads(snapshot: Snapshot, files: bool) -> list[QueryRead]:
    """The "qreads" map; files: keyed by the file as opened (the syscall source), else by
    the SLRU's directory (the uprobe's, as UprobeCapture names it)."""
    out = []
    for key, value in snapshot.get("qreads").items():
        pid, where, state, qid = key
        assert isinstance(pid, int) and isinstance(where, str) and isinstance(value, int)
        assert isinstance(state, int) and isinstance(qid, int)
        out.append(QueryRead(pid, slru_of(where) if files else where, state, qid, value))
    return out


@dataclass
class StatementRow:
    """--by query: the reads of one SLRU under one statement (or idle in transaction after
    one, or outside any), ranked by reads."""

    part: Part
    slru: str
    reads: int = 0
    pids: set[int] = field(default_factory=set)
    query: str | None = None  # the statement's text, when read

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.part.kind, "query_id": self.part.query_id, "query": self.query,
                "slru": self.slru, "reads": self.reads, "pids": sorted(self.pids)}  # fmt: skip


def statement_rows(
    reads: Sequence[QueryRead], major: int, query_id: int | None = None
) -> list[StatementRow]:
    """Rows per (part, SLRU), most reads first; query_id: only that statement's parts."""
    rows: dict[tuple[Part, str], StatementRow] = {}
    for r in reads:
        p = part(major, r.state, r.query_id)
        if query_id is not None and p.query_id != query_id:
            continue
        row = rows.setdefault((p, r.slru), StatementRow(p, r.slru))
        row.reads += r.reads
        row.pids.add(r.pid)
    return sorted(
        rows.values(), key=lambda r: (-r.reads, r.part.kind, r.part.query_id or 0, r.slru)
    )


def add_texts(rows: Sequence[StatementRow], texts: dict[int, str]) -> None:
    """Each statement's text (pg_stat_statements', else pg_stat_activity's), when known."""
    for row in rows:
        if row.part.kind in (STATEMENT, IDLE_IN_XACT) and row.part.query_id is not None:
            row.query = texts.get(row.part.query_id)


def statement_records(reads: Sequence[QueryRead], major: int, query_id: int) -> list[ReadRecord]:
    """--query-id without --by query: that statement's reads per (pid, SLRU), as records of
    the uprobe's shape (counts only: the statement is not read with bytes or latency)."""
    per: dict[tuple[int, str], int] = defaultdict(int)
    for r in reads:
        if part(major, r.state, r.query_id).query_id == query_id:
            per[(r.pid, r.slru)] += r.reads
    return [ReadRecord(pid, slru, n, 0, 0, 0, Log2Hist(()), timed=False)
            for (pid, slru), n in per.items()]  # fmt: skip


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
    timed: bool = True  # False: counted by the uprobe (no files, bytes, latency)

    @property
    def avg_us(self) -> float:
        return self.total_ns / self.reads / 1000 if self.reads else 0.0

    def percentile_us(self, fraction: float) -> float:
        return histogram.percentile(self.hist, fraction, self.max_ns) / 1000

    def as_json(self) -> dict[str, Any]:
        who = {
            "pid": self.pid,
            "backend_type": self.backend_type,
            "application_name": self.application_name,
            "slru": self.slru,
        }
        if not self.timed:
            return {**who, "reads": self.reads}
        return {
            **who,
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
    timed = all(r.timed for r in recs)
    return ReadRow(
        slru=slru,
        files=tuple(sorted({r.file for r in recs})) if timed else (),
        reads=sum(r.reads for r in recs),
        total_ns=sum(r.total_ns for r in recs),
        bytes=sum(r.bytes for r in recs),
        max_ns=max(r.max_ns for r in recs),
        hist=histogram.merge(r.hist for r in recs),
        pid=pid,
        backend_type=backend.backend_type if backend else "",
        application_name=backend.application_name if backend else "",
        pids=tuple(sorted({r.pid for r in recs})),
        timed=timed,
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
        """The line under TRACE_HEADER (the two are kept together so that they agree)."""
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
