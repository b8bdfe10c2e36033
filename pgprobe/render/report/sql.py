"""The SQL statistics section as data (templates/sql.html): deltas of pg_stat_database,
pg_stat_bgwriter/checkpointer and pg_stat_wal over the window, and the top statements."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgprobe import findings
from pgprobe.findings import as_number as num
from pgprobe.render.report.cells import Col, Table, bytes_text, table
from pgprobe.render.report.sections import meta_of, section

STATEMENT_COLS = [
    Col("query", "Query", "query"),
    Col("calls", "Calls", "int"),
    Col("total_ms", "Total ms", "dec"),
    Col("mean_ms", "Mean ms", "num"),
    Col("rows", "Rows", "int"),
    Col("shared_blks_read", "Shared blocks read", "int"),
]
DELTA_COLS = [Col("name", "Counter", "code"), Col("delta", "Delta", "num")]
DELTA_RATE_COLS = [*DELTA_COLS, Col("rate", "Per second", "rate")]
STATEMENTS_MISSING = (
    "pg_stat_statements is not installed (CREATE EXTENSION pg_stat_statements, "
    "with shared_preload_libraries = 'pg_stat_statements')"
)
VIEWS = (
    ("bgwriter", "pg_stat_bgwriter"),
    ("checkpointer", "pg_stat_checkpointer"),
    ("wal", "pg_stat_wal"),
    ("io", "pg_stat_io: relation writes by backend type"),
)


def delta_table(values: Mapping[str, Any], duration: float, units: Mapping[str, str]) -> Table:
    """One counter a row: its delta and, for counts (not times), its rate per second."""
    rows = []
    for k, v in values.items():
        row: dict[str, Any] = {"name": k, "delta": v}
        if duration and isinstance(v, (int, float)) and not k.endswith("_time"):
            row["rate"] = v / duration
        if units.get(k) == "bytes":
            row["delta"] = bytes_text(v)
            row["rate"] = None
        rows.append(row)
    return table(DELTA_RATE_COLS if duration else DELTA_COLS, rows, cls="delta")


def sql(doc: Mapping[str, Any]) -> dict[str, Any]:
    stats = section(doc, "stats")
    if stats is None:
        return {"unavailable": findings.section_reason(doc, "stats")}
    duration = num(meta_of(doc).get("duration_s"))
    db = stats.get("database") if isinstance(stats.get("database"), dict) else None
    database: dict[str, Any] = {"unavailable": "pg_stat_database was not read"}
    if db is not None:
        hit, read = num(db.get("blks_hit")), num(db.get("blks_read"))
        facts = []
        if duration:
            facts.append(f"{num(db.get('xact_commit')) / duration:,.1f} commits/s")
        if hit + read:
            facts.append(f"cache hit ratio {100 * hit / (hit + read):.2f} %")
        database = {
            "unavailable": None,
            "facts": "; ".join(facts),
            "table": delta_table(db, duration, {"temp_bytes": "bytes"}),
        }
    views = []
    for key, title in VIEWS:
        values = stats.get(key)
        if isinstance(values, dict):
            views.append(
                {
                    "title": title,
                    "unavailable": None,
                    "table": delta_table(values, duration, {"wal_bytes": "bytes"}),
                }
            )
        elif key == "wal":
            major = int(num(meta_of(doc).get("postgres_version_num"))) // 10000
            reason = (
                "pg_stat_wal does not exist before PostgreSQL 14"
                if major and major < 14
                else "pg_stat_wal was not read"
            )
            views.append({"title": title, "unavailable": reason})
    statements = stats.get("statements")
    return {
        "unavailable": None,
        "database": database,
        "views": views,
        "statements": table(
            STATEMENT_COLS,
            [s for s in statements if isinstance(s, dict)],
            cls="statements",
            empty="no statement ran in the window",
        )
        if isinstance(statements, list)
        else None,
        "statements_missing": STATEMENTS_MISSING,
    }
