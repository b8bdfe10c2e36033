"""The report's time-model section: where the client backends' time went, exactly.

From pgprobe.findings.waits.time_model (the document's ``waits`` section): the active time
(on CPU, runqueue, each wait event) as a table with a bar per line and, beside each line,
the share pg_stat_activity's sampling saw (the cross-check), the lines under
``FOLD_BELOW_PCT`` folded into one "N more rows" line; idle time apart; the whole cluster's
model (background processes too) folded away below.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgprobe import findings
from pgprobe.findings import as_number as num
from pgprobe.findings.timemodel import Component, time_model
from pgprobe.render.report.cells import Col, table

ACTIVE_COLS = [
    Col("where", "Where"),
    Col("name", "Wait event", "code"),
    Col("seconds", "Seconds", "num"),
    Col("active_pct", "Share of active time", "share"),
    Col("sleeps", "Sleeps", "int"),
    Col("sampled_pct", "Sampled share", "dec"),
    Col("samples", "Samples", "int"),
]
IDLE_COLS = [
    Col("where", "Where"),
    Col("name", "Wait event", "code"),
    Col("seconds", "Seconds", "num"),
    Col("backend_pct", "Share of backend time", "share"),
]
CLUSTER_COLS = [
    Col("category", "Where"),
    Col("name", "Wait event", "code"),
    Col("seconds", "Seconds", "num"),
    Col("share_pct", "Share of process time", "share"),
    Col("sleeps", "Sleeps", "int"),
]


# Lines of the active time under this share show as 0.0 %: folded under one line.
FOLD_BELOW_PCT = 0.05


def _secs(value: float) -> float:
    return round(value, 3)


def _active_row(c: Component) -> dict[str, Any]:
    return {
        "where": c.category,
        "name": c.name,
        "seconds": _secs(c.seconds),
        "active_pct": c.active_pct,
        "sleeps": c.sleeps or None,
        "sampled_pct": c.sampled_pct,
        "samples": c.samples if c.sampled_pct is not None else None,
    }


def _cluster_row(row: Mapping[str, Any]) -> dict[str, Any]:
    wtype, event = str(row.get("wait_event_type") or ""), str(row.get("wait_event") or "")
    return {
        "category": row.get("category"),
        "name": (event if wtype in ("", "CPU") else f"{wtype}:{event}")
        + (f" ({row['state']})" if row.get("state") else ""),
        "seconds": _secs(num(row.get("total_us")) / 1e6),
        "share_pct": row.get("share_pct"),
        "sleeps": row.get("sleeps") or None,
    }


def time_model_section(doc: Mapping[str, Any]) -> dict[str, Any]:
    model = time_model(doc)
    if model is None:
        reason = (
            findings.section_reason(doc, "waits")
            if "waits" in doc
            else "this document predates the time model (pg_stat_activity sampling below)"
        )
        return {"unavailable": reason}
    sec: Mapping[str, Any] = doc.get("waits") or {}
    meta: Mapping[str, Any] = sec.get("meta") or {}
    active = [c for c in model.components if c.active_pct is not None]
    small = [c for c in active if (c.active_pct or 0.0) < FOLD_BELOW_PCT]
    shown = [c for c in active if c not in small]
    rest = [c for c in model.components if c.active_pct is None]
    backend_s = model.backend_s or 1.0
    cluster = [r for r in sec.get("cluster_rows") or [] if isinstance(r, dict)]
    return {
        "unavailable": None,
        "window_s": f"{model.window_s:,.1f}",
        "backends": len(meta.get("client_pids") or []),
        "backend_s": f"{model.backend_s:,.1f}",
        "active_s": f"{model.active_s:,.2f}",
        "idle_s": f"{model.idle_s:,.2f}",
        "avg_active": f"{model.active_s / model.window_s:,.2f}" if model.window_s else "0",
        "samples": model.samples,
        "active": table(
            ACTIVE_COLS,
            [_active_row(c) for c in shown],
            empty="no client backend was seen in the window"
            if not active
            else f"every line is under {FOLD_BELOW_PCT} % of the active time",
        ),
        "folded": len(small),
        "fold_below": FOLD_BELOW_PCT,
        "small": table(ACTIVE_COLS, [_active_row(c) for c in small], empty=""),
        "idle": table(
            IDLE_COLS,
            [
                {
                    "where": c.category,
                    "name": c.name,
                    "seconds": _secs(c.seconds),
                    "backend_pct": 100 * c.seconds / backend_s,
                }
                for c in rest
            ],
            empty="no idle time",
        ),
        "cluster": table(
            CLUSTER_COLS,
            [_cluster_row(r) for r in cluster if num(r.get("total_us")) > 0],
            empty="no PostgreSQL process was seen in the window",
        ),
        "processes": meta.get("processes"),
    }
