"""How `pgprobe queries` is shown: the statements by DB time, or one statement's time model
(--query-id), as a table on a terminal; the text cut to the terminal's width."""

from __future__ import annotations

import shutil
import sys
from typing import Any

from pgprobe.literal import one_line
from pgprobe.render import table
from pgprobe.tools.queries.records import (
    IDLE_IN_XACT,
    STATEMENT,
    TEXT,
    StatementTime,
    named_waits,
)

COLUMNS = [
    table.Column("db_s", "DB TIME s", numeric=True),
    table.Column("share", "SHARE", numeric=True),
    table.Column("aas", "AAS", numeric=True),
    table.Column("calls", "CALLS", numeric=True),
    table.Column("ms_call", "MS/CALL", numeric=True),
    table.Column("cpu_s", "CPU s", numeric=True),
    table.Column("runq_s", "RUNQ s", numeric=True),
    table.Column("waits", "TOP WAITS"),
    table.Column("query_id", "QUERYID", numeric=True),
    table.Column("query", "QUERY"),
]
MODEL_COLUMNS = [
    table.Column("part", "WHERE"),
    table.Column("event", "EVENT"),
    table.Column("seconds", "SECONDS", numeric=True),
    table.Column("share", "SHARE", numeric=True),
]
TOP_WAITS = 2
FIXED_WIDTH = 100  # the columns before QUERY, roughly: the text gets the rest


def label(row: StatementTime) -> str:
    """What names a row when it has no text of its own."""
    if row.kind == STATEMENT:
        return row.query or "(text not seen)"
    if row.kind == IDLE_IN_XACT:
        return f"idle in transaction after: {row.query or '(text not seen)'}"
    if row.kind == TEXT:
        return row.query or "(no query id; text not seen)"
    return f"({row.kind})"


def cells(row: StatementTime, major: int, db_ns: int, window_ns: int, width: int) -> dict[str, str]:
    top = "; ".join(f"{name} {ns / 1e9:.2f}" for name, ns in named_waits(row, major, TOP_WAITS))
    return {
        "db_s": f"{row.db_ns / 1e9:,.3f}",
        "share": f"{100 * row.db_ns / db_ns:.1f}%" if db_ns else "",
        "aas": f"{row.db_ns / window_ns:.2f}" if window_ns else "",
        "calls": f"{row.calls:,}" if row.calls is not None else "",
        "ms_call": f"{(row.exec_ms or 0.0) / row.calls:,.3f}" if row.calls else "",
        "cpu_s": f"{row.cpu_ns / 1e9:,.3f}",
        "runq_s": f"{(row.preempted_ns + row.woken_ns) / 1e9:,.3f}",
        "waits": top,
        "query_id": str(row.query_id)
        if row.kind in (STATEMENT, IDLE_IN_XACT) and not row.text_keyed
        else "",
        "query": one_line(label(row), max(width, 9)),
    }


def show(title: str, rows: list[StatementTime], meta: dict[str, Any], major: int) -> None:
    width = max(shutil.get_terminal_size((160, 24)).columns - FIXED_WIDTH, 30)
    db_ns, window_ns = int(meta["db_time_us"] * 1000), int(meta["window_s"] * 1e9)
    empty = f"no DB time in {meta['duration_s']:.1f} s"
    table.render(title, COLUMNS, [cells(r, major, db_ns, window_ns, width) for r in rows],
                 empty=empty)  # fmt: skip


BY_QUERY_COLUMNS = [
    table.Column("query_id", "QUERYID", numeric=True),
    table.Column("category", "WHERE"),
    table.Column("wait_event_type", "TYPE"),
    table.Column("wait_event", "EVENT"),
    table.Column("seconds", "SECONDS", numeric=True),
    table.Column("share", "SHARE", numeric=True),
    table.Column("query", "QUERY"),
]


def show_components(
    title: str, rows: list[StatementTime], parts: list[list[dict[str, Any]]]
) -> None:
    """waits --by query: each statement's time model, its rows under its id and text."""
    width = max(shutil.get_terminal_size((160, 24)).columns - 80, 30)
    cells = []
    for row, model in zip(rows, parts, strict=True):
        for i, part in enumerate(model):
            first = i == 0
            qid = part["query_id"]
            cells.append(
                {
                    "query_id": str(qid) if first and qid is not None else "",
                    "category": part["category"],
                    "wait_event_type": part["wait_event_type"],
                    "wait_event": part["wait_event"],
                    "seconds": f"{part['total_us'] / 1e6:,.3f}",
                    "share": f"{part['share_pct']:.1f}%",
                    "query": one_line(label(row), max(width, 9)) if first else "",
                }
            )
    table.render(title, BY_QUERY_COLUMNS, cells, empty="no DB time")


def show_model(title: str, row: StatementTime, major: int) -> None:
    """--query-id: one statement's time model, part by part."""
    parts = [("on CPU", "CPU", row.cpu_ns), ("runqueue", "preempted", row.preempted_ns),
             ("runqueue", "woken, not yet running", row.woken_ns)]  # fmt: skip
    for name, ns in named_waits(row, major):
        parts.append(("wait", name, ns))
    total = row.db_ns
    cells = [
        {
            "part": p,
            "event": e,
            "seconds": f"{ns / 1e9:,.3f}",
            "share": f"{100 * ns / total:.1f}%" if total else "",
        }
        for p, e, ns in parts
    ]
    table.render(title, MODEL_COLUMNS, cells, empty="no time")
    print(f"query: {one_line(label(row), 400)}", file=sys.stderr)
