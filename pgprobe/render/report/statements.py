"""The report's statements section: the exact time model per statement (triage's
``waits.statements``, pgprobe queries' rows), beside what pg_stat_statements says."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgprobe.findings import as_number as num
from pgprobe.render.report.cells import Col, table
from pgprobe.render.report.sections import section

COLS = [
    Col("query", "Statement", "query"),
    Col("kind", "Kind"),
    Col("db_s", "DB time s", "dec"),
    Col("share_pct", "Share", "share"),
    Col("aas", "Active sessions", "dec"),
    Col("cpu_s", "On CPU s", "dec"),
    Col("runq_s", "Runqueue s", "dec"),
    Col("top_wait", "Top wait"),
    Col("calls", "Calls", "int"),
    Col("query_id", "Query id", "id"),
]
NOT_KEYED = (
    "the time model was not keyed by statement (it needs the compiled time model, "
    "bpf/build/waits.bpf.o, and PostgreSQL 14+)"
)


def _row(r: Mapping[str, Any]) -> dict[str, Any]:
    waits = [w for w in r.get("waits") or [] if isinstance(w, dict)]
    top = max(waits, key=lambda w: num(w.get("total_us")), default=None)
    text = str(r.get("query") or "")
    if r.get("kind") not in ("statement", "idle in transaction", "text"):
        text = f"({r.get('kind')})"
    return {
        "query": text or "(text not seen)",
        "kind": r.get("kind"),
        "db_s": num(r.get("db_time_us")) / 1e6,
        "share_pct": r.get("share_pct"),
        "aas": r.get("aas"),
        "cpu_s": num(r.get("cpu_us")) / 1e6,
        "runq_s": (num(r.get("runq_preempted_us")) + num(r.get("runq_woken_us"))) / 1e6,
        "top_wait": (
            f"{top.get('wait_event_type')}:{top.get('wait_event')} "
            f"{num(top.get('total_us')) / 1e6:.3f} s"
        )
        if top
        else "",  # fmt: skip
        "calls": r.get("calls"),
        "query_id": r.get("query_id"),
    }


def statements_section(doc: Mapping[str, Any]) -> dict[str, Any]:
    waits = section(doc, "waits")
    part = waits.get("statements") if waits is not None else None
    if not isinstance(part, dict):
        return {"unavailable": NOT_KEYED}
    rows = [r for r in part.get("rows") or [] if isinstance(r, dict)]
    db = num(part.get("db_time_us"))
    return {
        "unavailable": None,
        "db_s": f"{db / 1e6:,.3f}",
        "outside_pct": f"{100 * num(part.get('outside_statements_us')) / db:.1f}" if db else "0",
        "not_split_pct": f"{100 * num(part.get('not_split_us')) / db:.1f}" if db else "0",
        "ids": bool(part.get("query_ids", True)),
        "table": table(COLS, [_row(r) for r in rows], empty="no DB time in the window"),
    }
