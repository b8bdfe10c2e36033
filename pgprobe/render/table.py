"""Tables: rich on a terminal, plain aligned text when piped (stable for grep/awk).

Titles and cells hold names from the server and from binaries (application names, roles,
queries, function names, paths): both are shown as text (pgprobe.literal), and rich
gets them as ``rich.text.Text``, so ``[/x]`` or ``[link=...]`` in a name is never markup.
A cell is one line; a title may be several (its own newlines are kept).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from pgprobe.literal import literal, literal_lines


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
    title = literal_lines(title)
    if not rows:
        print(f"{title}\n{literal(empty)}", file=out)
        return
    cells = [[literal(r.get(c.key, "")) for c in columns] for r in rows]
    if out.isatty():
        _render_rich(title, columns, cells)
    else:
        print(_plain(title, columns, cells), file=out, flush=True)


def _plain(title: str, columns: Sequence[Column], cells: Sequence[Sequence[str]]) -> str:
    widths = [max(len(c.header), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]

    def line(texts: Sequence[str]) -> str:
        parts = [
            text.rjust(w) if col.numeric else text.ljust(w)
            for text, w, col in zip(texts, widths, columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    body = [line([c.header for c in columns])]
    body += [line(row) for row in cells]
    return "\n".join([title, *body])


def _render_rich(title: str, columns: Sequence[Column], cells: Sequence[Sequence[str]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title, style="table.title"), title_justify="left", header_style="bold")
    for col in columns:
        table.add_column(Text(col.header), justify="right" if col.numeric else "left")
    for row in cells:
        table.add_row(*(Text(text) for text in row))
    Console().print(table)
