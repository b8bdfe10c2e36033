"""How `pgprobe waits` looks on a terminal: the time model as a table."""

from __future__ import annotations

import sys
from typing import Any

from pgprobe.render import table
from pgprobe.tools.waits.records import Row

COLUMNS = [
    table.Column("category", "WHERE"),
    table.Column("wait_event_type", "TYPE"),
    table.Column("wait_event", "EVENT"),
    table.Column("total_s", "SECONDS", numeric=True),
    table.Column("share_pct", "SHARE", numeric=True),
    table.Column("sleeps", "SLEEPS", numeric=True),
    table.Column("p50_ms", "P50 ms", numeric=True),
    table.Column("p99_ms", "P99 ms", numeric=True),
]
PID_COLUMNS = [
    table.Column("pid", "PID", numeric=True),
    table.Column("backend_type", "BACKEND TYPE"),
]


def cells(row: Row) -> dict[str, str]:
    sleeps = row.sleeps > 0
    out = {
        "category": row.category,
        "wait_event_type": row.wait_event_type,
        "wait_event": row.wait_event,
        "total_s": f"{row.total_ns / 1e9:,.3f}",
        "share_pct": f"{100 * row.share:.1f}%",
        "sleeps": f"{row.sleeps:,}" if sleeps else "",
        "p50_ms": f"{row.percentile_us(0.5) / 1000:,.3f}" if sleeps else "",
        "p99_ms": f"{row.percentile_us(0.99) / 1000:,.3f}" if sleeps else "",
    }
    if row.pid is not None:
        out.update(pid=str(row.pid), backend_type=row.backend_type)
    return out


def shown(rows: list[Row]) -> list[Row]:
    """Components worth a line: any time at all (CPU and not accounted always)."""
    return [r for r in rows if r.total_ns or r.category in ("on CPU", "not accounted")]


def show(title: str, rows: list[Row], by_pid: bool, meta: dict[str, Any]) -> None:
    columns = (PID_COLUMNS if by_pid else []) + COLUMNS
    empty = f"no PostgreSQL process seen in {meta['duration_s']:.1f} s"
    table.render(title, columns, [cells(r) for r in shown(rows)], empty=empty)
    if meta.get("unaccounted_note"):
        print(meta["unaccounted_note"], file=sys.stderr)
