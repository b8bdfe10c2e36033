"""Tables of the report as data: columns, cells with their numbers already written out.

``table(cols, rows)`` turns document rows into a ``Table`` that the ``table`` macro of
templates/macros.html draws. A ``Col``'s kind says how its values are written: ``int``
(``1,234``), ``dec`` and ``rate`` (one decimal), ``num`` (integers as integers, others with
sensible decimals, text as it is), ``bytes`` (``1.5 MB``), ``share`` (a percent with a bar),
``id`` (as it is), ``query`` (preformatted), ``code`` (monospace), ``text``. A cell without a
value shows a dash (``text`` None) in numeric columns, nothing in text columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pgprobe.findings import as_number as num

NUMERIC_KINDS = frozenset({"int", "dec", "num", "share", "bytes", "rate", "id"})


def int_text(value: Any) -> str:
    return f"{num(value):,.0f}"


def dec_text(value: Any, places: int = 1) -> str:
    return f"{num(value):,.{places}f}"


def num_text(value: Any) -> str | None:
    """A table cell's number: integers with separators, others with sensible decimals."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.3f}".rstrip("0").rstrip(".")


def bytes_text(value: Any) -> str:
    v = num(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(v) < 1024 or unit == "TB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.1f} {unit}"
        v /= 1024
    return f"{v:,.1f} TB"  # unreachable


@dataclass(frozen=True)
class Col:
    key: str
    head: str
    kind: str = "text"

    @property
    def numeric(self) -> bool:
        return self.kind in NUMERIC_KINDS


@dataclass(frozen=True)
class Cell:
    """One cell: ``css`` is its class ("num", "q", "code" or ""), ``text`` its content (None:
    a dash), ``bar`` the width in px of a share's bar (None: no bar)."""

    css: str
    text: str | None
    bar: str | None = None


@dataclass(frozen=True)
class Table:
    cols: Sequence[Col]
    rows: list[list[Cell]]
    cls: str = ""
    empty: str = "no rows"


def cell(col: Col, value: Any) -> Cell:
    kind = col.kind
    if kind == "share":
        bar = max(0.0, min(100.0, num(value))) * 0.6
        return Cell("num", f"{num(value):.1f}%", f"{bar:.1f}")
    if kind == "int":
        return Cell("num", None if value is None else int_text(value))
    if kind in ("dec", "rate"):
        return Cell("num", None if value is None else dec_text(value))
    if kind == "num":
        return Cell("num", num_text(value))
    if kind == "bytes":
        return Cell("num", bytes_text(value))
    text = "" if value is None else str(value)
    return Cell({"id": "num", "query": "q", "code": "code"}.get(kind, ""), text)


def table(
    cols: Sequence[Col], rows: Iterable[Mapping[str, Any]], cls: str = "", empty: str = ""
) -> Table:
    return Table(
        cols, [[cell(c, r.get(c.key)) for c in cols] for r in rows], cls, empty or "no rows"
    )


def kv_text(value: Any) -> str | None:
    """A value of the capture details (None: a dash)."""
    if isinstance(value, list):
        if len(value) > 12:
            return f"{len(value):,} items: " + ", ".join(str(x) for x in value[:12]) + ", ..."
        return ", ".join(str(x) for x in value) if value else None
    if isinstance(value, dict):
        return ", ".join(f"{k} {x}" for k, x in value.items()) if value else None
    if value is None or value == "":
        return None
    return num_text(value)


def kv(pairs: Iterable[tuple[str, Any]]) -> list[tuple[str, str | None]]:
    """Capture details as (key, text) pairs: pids, versions and ports as they are."""
    out: list[tuple[str, str | None]] = []
    for k, v in pairs:
        plain = isinstance(v, int) and any(w in k for w in ("pid", "version", "port"))
        out.append((k, str(v) if plain else kv_text(v)))
    return out
