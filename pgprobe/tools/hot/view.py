"""How ``pgprobe hot`` is shown on a terminal: columns, cells, the title; an idle capture
says so."""

from __future__ import annotations

from typing import Any

from pgprobe.render import table
from pgprobe.tools import common, profiling
from pgprobe.tools.hot.records import HotRow, PartRows

COLUMNS = [
    table.Column("self", "SELF", numeric=True),
    table.Column("self_pct", "SELF%", numeric=True),
    table.Column("total", "TOTAL", numeric=True),
    table.Column("total_pct", "TOTAL%", numeric=True),
]


def cells(row: HotRow) -> dict[str, str]:
    return {
        "self": f"{row.self_samples:,}",
        "self_pct": f"{row.pct(row.self_samples):.1f}%",
        "total": f"{row.total_samples:,}",
        "total_pct": f"{row.pct(row.total_samples):.1f}%",
        "function": row.function or "",
        "module": row.module,
    }


def show(
    profile: profiling.Profile,
    meta: dict[str, Any],
    rows: list[HotRow],
    shown: list[HotRow],
    by_module: bool,
    sort: str,
) -> None:
    """The table of ``shown`` (the first rows of ``rows``), titled with the capture's facts."""
    facts = profile.facts()
    title = (
        f"{common.title('CPU samples', meta)}\n"
        f"{facts['samples']} samples at {facts['Hz']} Hz, {facts['lost']} lost, "
        f"{facts['unresolved frames']} of frames unresolved; "
        f"top {len(shown)} of {len(rows)} by {sort} samples"
    )
    columns = [*COLUMNS]
    if not by_module:
        columns.append(table.Column("function", "FUNCTION"))
    columns.append(table.Column("module", "MODULE"))
    empty = f"no samples in {meta['duration_s']:.1f} s (the targets were idle)"
    table.render(title, columns, [cells(r) for r in shown], empty=empty)


def show_parts(
    profile: profiling.Profile,
    meta: dict[str, Any],
    parts: list[PartRows],
    top: int,
    by_module: bool,
    sort: str,
) -> None:
    """--by query: one table, each statement's functions under its id and name (percent of
    the statement's own samples)."""
    facts = profile.facts()
    total = sum(p.samples for p in parts) or 1
    title = (
        f"{common.title('CPU samples by statement', meta)}\n"
        f"{facts['samples']} samples at {facts['Hz']} Hz, {facts['lost']} lost; "
        f"{len(parts)} statements, top {top or 'all'} functions each by {sort} samples "
        "(% of the statement's samples)"
    )
    columns = [table.Column("query_id", "QUERYID", numeric=True),
               table.Column("share", "SHARE", numeric=True), *COLUMNS]  # fmt: skip
    if not by_module:
        columns.append(table.Column("function", "FUNCTION"))
    columns.append(table.Column("module", "MODULE"))
    columns.append(table.Column("statement", "STATEMENT"))
    rows = []
    for p in parts:
        for i, r in enumerate(p.rows[:top] if top else p.rows):
            first = {"query_id": "" if p.query_id is None else str(p.query_id),
                     "share": f"{100 * p.samples / total:.1f}%", "statement": p.name}  # fmt: skip
            rows.append({**cells(r), **(first if i == 0 else {})})
    empty = f"no samples in {meta['duration_s']:.1f} s (the targets were idle)"
    table.render(title, columns, rows, empty=empty)
