"""Tables: rich on a terminal, plain aligned text when piped (stable for grep/awk)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class Column:
    key: str
    header: str
    numeric: bool = False


def render(
    title: str,
    columns: Sequence[Column],
    rows: Sequence[dict[str, str]],
    empty: str = "no rows",
    file: TextIO | None = None,
) -> None:
    out = file or sys.stdout
    if not rows:
        print(f"{title}\n{empty}", file=out)
        return
    if out.isatty():
        _render_rich(title, columns, rows)
    else:
        print(plain(title, columns, rows), file=out, flush=True)


def plain(title: str, columns: Sequence[Column], rows: Sequence[dict[str, str]]) -> str:
    widths = [max(len(c.header), *(len(r.get(c.key, "")) for r in rows)) for c in columns]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(w) if col.numeric else cell.ljust(w)
            for cell, w, col in zip(cells, widths, columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    body = [line([c.header for c in columns])]
    body += [line([r.get(c.key, "") for c in columns]) for r in rows]
    return "\n".join([title, *body])


def _render_rich(title: str, columns: Sequence[Column], rows: Sequence[dict[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for col in columns:
        table.add_column(col.header, justify="right" if col.numeric else "left")
    for row in rows:
        table.add_row(*(row.get(c.key, "") for c in columns))
    Console().print(table)
