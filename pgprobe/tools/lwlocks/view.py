"""How `pgprobe lwlocks` looks on a terminal: one table of waits (or sleeps)."""

from __future__ import annotations

from typing import Any

from pgprobe.literal import one_line
from pgprobe.render import table
from pgprobe.tools import common
from pgprobe.tools.lwlocks.bystatement import StatementSleep
from pgprobe.tools.lwlocks.records import WaitRow

COLUMNS = [
    table.Column("tranche", "TRANCHE"),
    table.Column("mode", "MODE"),
    table.Column("waits", "WAITS", numeric=True),
    table.Column("total_ms", "TOTAL ms", numeric=True),
    table.Column("runq_ms", "RUNQ ms", numeric=True),  # of TOTAL (the scheduler source)
    table.Column("avg_us", "AVG us", numeric=True),
    table.Column("p50_us", "P50 us", numeric=True),
    table.Column("p95_us", "P95 us", numeric=True),
    table.Column("p99_us", "P99 us", numeric=True),
    table.Column("max_us", "MAX us", numeric=True),
    table.Column("share_pct", "SHARE", numeric=True),
]
PID_COLUMNS = [
    table.Column("pid", "PID", numeric=True),
    table.Column("backend_type", "BACKEND TYPE"),
    table.Column("application_name", "APPLICATION"),
]


def cells(row: WaitRow) -> dict[str, str]:
    data = row.as_json()
    cells = {
        "tranche": row.tranche,
        "mode": row.mode,
        "waits": f"{row.waits:,}",
        "total_ms": f"{row.total_ns / 1e6:,.3f}",
        "runq_ms": "" if row.runq_ns is None else f"{row.runq_ns / 1e6:,.3f}",
        "avg_us": "-" if data["avg_us"] is None else f"{data['avg_us']:,.1f}",
        "p50_us": f"{data['p50_us']:,.1f}",
        "p95_us": f"{data['p95_us']:,.1f}",
        "p99_us": f"{data['p99_us']:,.1f}",
        "max_us": f"{data['max_us']:,.1f}",
        "share_pct": f"{data['share_pct']:.1f}%",
    }
    if row.pid is not None:
        cells.update(
            pid=str(row.pid),
            backend_type=row.backend_type,
            application_name=row.application_name,
        )
    return cells


def show(result: list[WaitRow], by_pid: bool, meta: dict[str, Any], interval: int | None) -> None:
    """The table (RUNQ ms where measured: the scheduler source's); an empty capture says so
    (and why it may be, for a single window)."""
    runq = any(r.runq_ns is not None for r in result)
    columns = (PID_COLUMNS if by_pid else []) + [
        c for c in COLUMNS if runq or c.key != "runq_ms"]  # fmt: skip
    what = str(meta.get("title", "LWLock waits"))
    sleeps = meta.get("measures") == "sleeps"
    if meta.get("stopped_by_guard"):
        what += " (stopped early by --max-events-per-sec: see the line on stderr)"
    title = common.title(what, meta)
    noun = "sleeps" if sleeps else "waits"
    empty = f"no LWLock {noun} in {meta['duration_s']:.1f} s" + (
        " (nothing contended, or the targets were idle)" if not interval else ""
    )
    table.render(title, columns, [cells(r) for r in result], empty=empty)


BY_QUERY_COLUMNS = [
    table.Column("query_id", "QUERYID", numeric=True),
    table.Column("tranche", "TRANCHE"),
    table.Column("sleep_ms", "SLEPT ms", numeric=True),
    table.Column("woken_ms", "WOKEN ms", numeric=True),
    table.Column("share_pct", "SHARE", numeric=True),
    table.Column("query", "STATEMENT"),
]


def show_by_query(title: str, rows: list[StatementSleep], width: int) -> None:
    """--by query: each statement's LWLock sleeps per tranche."""
    cells = []
    for r in rows:
        text = one_line(r.query or f"({r.kind})", width)
        cells.append({"query_id": "" if r.query_id is None else str(r.query_id),
                      "tranche": r.tranche, "sleep_ms": f"{r.sleep_ns / 1e6:,.3f}",
                      "woken_ms": f"{r.woken_ns / 1e6:,.3f}",
                      "share_pct": f"{100 * r.share:.1f}%", "query": text})  # fmt: skip
    table.render(title, BY_QUERY_COLUMNS, cells, empty="no LWLock sleeps in any statement")
