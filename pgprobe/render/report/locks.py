"""The report's lock waits: each Lock sleep of the exact time model charged to its lock
(triage's ``waits.locks``, pgprobe locks' rows)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgprobe.findings import as_number as num
from pgprobe.render.report.cells import Col, table
from pgprobe.render.report.sections import section

COLS = [
    Col("lock", "Lock", "code"),
    Col("locktype", "Type"),
    Col("mode", "Mode wanted"),
    Col("waiters", "Waiters", "int"),
    Col("waits", "Waits", "int"),
    Col("total_s", "Total s", "dec"),
    Col("max_s", "Longest s", "dec"),
]
NOT_KEYED = (
    "the time model's Lock waits were not keyed by lock (it needs the compiled time model, "
    "bpf/build/waits.bpf.o, and PostgreSQL 14+)"
)


def _row(r: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "lock": r.get("lock"),
        "locktype": r.get("locktype"),
        "mode": r.get("mode"),
        "waiters": len(r.get("waiters") or []),
        "waits": r.get("waits"),
        "total_s": num(r.get("total_us")) / 1e6,
        "max_s": num(r.get("max_us")) / 1e6,
    }


def locks_section(doc: Mapping[str, Any]) -> dict[str, Any]:
    waits = section(doc, "waits")
    part = waits.get("locks") if waits is not None else None
    if not isinstance(part, dict):
        return {"unavailable": NOT_KEYED}
    rows = [r for r in part.get("rows") or [] if isinstance(r, dict)]
    return {
        "unavailable": None,
        "total_s": f"{num(part.get('lock_wait_us')) / 1e6:,.3f}",
        "not_read_s": f"{num(part.get('lock_not_read_us')) / 1e6:,.3f}",
        "more": int(num(part.get("more_locks"))),
        "table": table(COLS, [_row(r) for r in rows], empty="no heavyweight lock waits"),
    }
