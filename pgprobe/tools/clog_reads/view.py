"""How clog-reads is shown on a terminal: the tables per backend (or per statement) and per
SLRU, notes, stacks.

Every function handles an empty capture (a table says why it is empty).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import Any

from pgprobe.discover import Targets
from pgprobe.literal import literal, one_line
from pgprobe.pgstats import SlruStats
from pgprobe.render import table
from pgprobe.tools import common
from pgprobe.tools.bystatement import Texts
from pgprobe.tools.clog_reads.probe import SLRU_BITS
from pgprobe.tools.clog_reads.records import (
    OpenError,
    ReadRecord,
    ReadRow,
    StackRow,
    StatementRow,
    group_rows,
)
from pgprobe.tools.queries.records import STATEMENT

STACKS_SHOWN = 10
FILES_SHOWN = 4


def print_tables(
    meta: dict[str, Any],
    recs: Sequence[ReadRecord],
    slru_delta: Any,
    slrus: Sequence[str],
    targets: Targets,
    stats: SlruStats,
    describe: Any,
    shown: Sequence[ReadRecord] | None = None,
    statements: tuple[Sequence[StatementRow], Texts] | None = None,
) -> None:
    """The table per backend (of `shown`: --query-id's reads; default recs) or per statement,
    then the totals of every read (recs) beside pg_stat_slru."""
    what = f"SLRU reads of {', '.join(slrus)}"
    if len(slrus) == len(SLRU_BITS) - 1:
        what = "SLRU reads of all SLRUs"
    query_id = meta.get("query_id")
    if statements is not None:
        what += " by statement" if query_id is None else f" of statement {query_id}"
    elif query_id is not None:
        what += f" in statement {query_id}"
    title = common.title(what, meta)
    empty = (
        f"no reads of SLRU files in {meta['duration_s']:.1f} s "
        "(every lookup hit the SLRU buffers, or the targets did not look)"
    )
    if query_id is not None:
        empty = f"no reads of SLRU files by statement {query_id} in {meta['duration_s']:.1f} s"
    timed = meta.get("source") != "uprobe"
    if statements is not None:
        print_statements(title, *statements, empty)
    else:
        shown = recs if shown is None else shown
        per_pid = group_rows(shown, "pid", describe)
        table.render(title, columns(PID_COLUMNS, timed and all(r.timed for r in shown)),
                     [pid_cells(r) for r in per_pid], empty=empty)  # fmt: skip
    totals = group_rows(recs, "slru")
    rows = totals_cells(totals, slru_delta, slrus)
    if not rows and slru_delta is None:
        return
    print()
    table.render(
        totals_title(targets, slru_delta, stats),
        columns(TOTAL_COLUMNS, timed),
        rows,
        empty="no lookups of any SLRU in pg_stat_slru either",
    )
    note = agreement_note(totals, slru_delta, targets)
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


UNTIMED = {"bytes", "avg_us", "p99_us", "max_us", "files"}  # syscall source only
STATEMENT_COLUMNS = [
    table.Column("query_id", "QUERYID", numeric=True),
    table.Column("slru", "SLRU"),
    table.Column("reads", "READS", numeric=True),
    table.Column("backends", "BACKENDS", numeric=True),
    table.Column("query", "QUERY"),
]
FIXED_WIDTH = 60  # the columns before QUERY, roughly: the text gets the rest


def print_statements(title: str, rows: Sequence[StatementRow], texts: Texts, empty: str) -> None:
    """--by query: one row per statement and SLRU, its text cut to the terminal's width."""
    width = max(shutil.get_terminal_size((160, 24)).columns - FIXED_WIDTH, 30)
    table.render(title, STATEMENT_COLUMNS, [statement_cells(r, texts, width) for r in rows],
                 empty=empty)  # fmt: skip


def statement_cells(row: StatementRow, texts: Texts, width: int) -> dict[str, str]:
    p = row.part
    if p.kind == STATEMENT:
        query = (row.query or "(text not seen)") if texts.read else ""
    else:
        query = texts.name(p)  # idle in transaction after ..., (outside statements), ...
    return {
        "query_id": "" if p.query_id is None else str(p.query_id),
        "slru": row.slru,
        "reads": f"{row.reads:,}",
        "backends": str(len(row.pids)),
        "query": one_line(query, width),
    }


def columns(all_columns: list[table.Column], timed: bool) -> list[table.Column]:
    """The uprobe source counts reads only: no bytes, latency or files columns."""
    return [c for c in all_columns if timed or c.key not in UNTIMED]


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


UNWOUND = {"fp": "walked by frame pointer", "dwarf": "unwound with DWARF from perf's copies"}


def print_stacks(stacks: Sequence[StackRow], reads: int, unwind: str = "") -> None:
    shown = stacks[:STACKS_SHOWN]
    print()
    if not stacks:
        print("No read stacks (no reads)")
        return
    how = f", {UNWOUND[unwind]}" if unwind in UNWOUND else ""
    print(
        f"Top reading code paths: {len(shown)} of {len(stacks)} distinct user stacks "
        f"(innermost frame first{how}; --json has them all)"
    )
    for row in shown:
        share = 100 * row.reads / reads if reads else 0.0
        pids = ", ".join(str(p) for p in sorted(row.pids)[:6])
        if len(row.pids) > 6:
            pids += f", ... ({len(row.pids)} pids)"
        print(f"\n  {row.reads:,} reads ({share:.1f}%), pid {pids}")
        for name in row.frames:
            print(f"      {literal(name)}")


def cost_line(fires: int, seconds: float, fire_ns: float, source: str, binary: str = "") -> str:
    """One line on what the uprobe cost, when it is material (> 1 % of a CPU)."""
    if source != "uprobe" or seconds <= 0:
        return ""
    cpu_share = fires * fire_ns / 1e9 / seconds
    if cpu_share <= 0.01:
        return ""
    return (
        f"pgprobe: note: the uprobe fired {fires:,} times in {seconds:.1f} s "
        f"({fires / seconds:,.0f}/s), about {cpu_share:.0%} of a CPU at ~{fire_ns / 1000:.0f} us "
        f"a fire, paid by the processes of {binary or 'the server binary'} that read SLRU "
        "pages (other clusters' too, whatever --slru and --pid keep); where reads are this "
        "frequent, --source syscalls costs less (~0.1 us per system call of any process)"
    )


def print_open_errors(errors: Sequence[OpenError]) -> None:
    if not errors:
        return
    total = sum(e.count for e in errors)
    shown = ", ".join(f"pid {e.pid} {e.file} ({e.count})" for e in errors[:5])
    more = f", +{len(errors) - 5} more" if len(errors) > 5 else ""
    common.warn(
        f"{total} failed opens of SLRU files (counted as blks_read by "
        f"pg_stat_slru, not as reads here): {shown}{more}"
    )
