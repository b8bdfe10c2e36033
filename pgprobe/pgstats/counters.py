"""Deltas of PostgreSQL's cumulative views over a window, read at its start and its end.

pg_stat_database, pg_stat_bgwriter or pg_stat_checkpointer, pg_stat_wal, pg_stat_io
(16+), pg_stat_slru and pg_stat_statements (when installed and readable): one
reading is a Counters; deltas(before, after) is what the window did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pgprobe.pgstats.slru import SLRU_DIRS

DATABASE_COLUMNS = (
    "xact_commit", "xact_rollback", "blks_read", "blks_hit", "tup_returned", "tup_fetched",
    "tup_inserted", "tup_updated", "tup_deleted", "temp_files", "temp_bytes", "deadlocks",
    "conflicts",
)  # fmt: skip
STATEMENTS_TOP = 10


@dataclass
class Counters:
    """One reading of the cumulative views; subtract two to get a window's deltas."""

    database: dict[str, int] = field(default_factory=dict)
    bgwriter: dict[str, float] = field(default_factory=dict)
    checkpointer: dict[str, float] | None = None
    wal: dict[str, float] | None = None
    io: dict[str, float] | None = None  # pg_stat_io (16+): relation writes per backend type
    slru: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (hit, read)
    statements: dict[tuple[Any, ...], dict[str, Any]] | None = None
    # pg_postmaster_start_time(): counters of two server lives cannot be subtracted.
    server_started: str = ""
    taken_at: float = 0.0  # time.monotonic() of the reading


def read_counters(conn: Any) -> Counters:
    """The cumulative counters now (a read-only connection; views missing are None)."""
    counters = Counters(taken_at=time.monotonic())
    # Pending statistics of other backends reach the views at most once a second.
    with conn.cursor() as cur:
        cur.execute("SELECT pg_postmaster_start_time()::text")
        counters.server_started = str(cur.fetchone()[0])
        cur.execute(
            "SELECT "
            + ", ".join(f"coalesce(sum({c}), 0)::bigint" for c in DATABASE_COLUMNS)
            + " FROM pg_stat_database"
        )
        counters.database = dict(zip(DATABASE_COLUMNS, map(int, cur.fetchone()), strict=True))
        counters.bgwriter = _numeric_row(cur, "pg_stat_bgwriter") or {}
        counters.checkpointer = _numeric_row(cur, "pg_stat_checkpointer")
        counters.wal = _numeric_row(cur, "pg_stat_wal")
        if _relation_exists(cur, "pg_stat_slru"):
            cur.execute("SELECT name, blks_hit, blks_read FROM pg_stat_slru")
            counters.slru = {str(n): (int(h), int(r)) for n, h, r in cur.fetchall()}
        counters.io = _io_writes(cur)
        counters.statements = _statements(cur)
    return counters


def _io_writes(cur: Any) -> dict[str, float] | None:
    """pg_stat_io (16+): buffer writes of relations per backend type, or None before 16.

    17 took buffers_backend out of pg_stat_bgwriter: this is where backends' own writes
    are counted now. `writes` counts on 16-18 (18 adds write_bytes, drops op_bytes).
    """
    if not _relation_exists(cur, "pg_stat_io"):
        return None
    cur.execute(
        "SELECT backend_type, coalesce(sum(writes), 0) FROM pg_stat_io "
        "WHERE object = 'relation' GROUP BY backend_type"
    )
    return {str(kind): float(n) for kind, n in cur.fetchall()}


def _relation_exists(cur: Any, name: str) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (name,))
    return bool(cur.fetchone()[0])


def _numeric_row(cur: Any, view: str) -> dict[str, float] | None:
    """The numeric columns of a one-row view, or None when the view does not exist."""
    if not _relation_exists(cur, view):
        return None
    cur.execute(f"SELECT * FROM {view}")  # view is one of our own literals
    row = cur.fetchone()
    names = [d.name for d in cur.description]
    return {
        n: float(v)
        for n, v in zip(names, row, strict=True)
        if isinstance(v, (int, float)) or type(v).__name__ == "Decimal"
    }


def _statements(cur: Any) -> dict[tuple[Any, ...], dict[str, Any]] | None:
    if not _relation_exists(cur, "pg_stat_statements"):
        return None
    try:
        # Without the texts (showtext false): counters are read every second during triage,
        # and the texts of the few statements shown are read once, at the end.
        cur.execute(
            "SELECT userid, dbid, queryid, calls, total_exec_time, rows,"
            " shared_blks_read FROM pg_stat_statements(false)"
        )
    except Exception:  # the view exists but the library is not preloaded
        cur.connection.rollback()
        return None
    return {
        (u, d, q): {
            "queryid": q,
            "calls": int(calls),
            "total_ms": float(total),
            "rows": int(rows),
            "shared_blks_read": int(blks),
        }
        for u, d, q, calls, total, rows, blks in cur.fetchall()
    }


def fill_statement_texts(conn: Any, rows: list[dict[str, Any]]) -> None:
    """Each statement row's `query`: pg_stat_statements' text, read for these ids only."""
    ids = sorted({r["queryid"] for r in rows if r.get("queryid") is not None})
    texts: dict[int, str] = {}
    if ids:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT DISTINCT ON (queryid) queryid, query FROM pg_stat_statements"
                " WHERE queryid = ANY(%s)",
                (ids,),
            )
            texts = {int(q): str(text or "") for q, text in cur.fetchall()}
    for row in rows:
        row["query"] = texts.get(row["queryid"], "")


def deltas(before: Counters, after: Counters) -> dict[str, Any]:
    """The window's deltas, in the triage document's `stats` layout."""
    out: dict[str, Any] = {
        "database": {k: after.database.get(k, 0) - v for k, v in before.database.items()},
        "bgwriter": _diff(before.bgwriter, after.bgwriter),
        "checkpointer": _diff(before.checkpointer, after.checkpointer),
        "wal": _diff(before.wal, after.wal),
        "io": _diff(before.io, after.io),
        "slru": slru_deltas(before.slru, after.slru),
        "statements": _statement_deltas(before.statements, after.statements),
    }
    return out


def _diff(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    if a is None or b is None:
        return None
    return {k: _round(b[k] - v) for k, v in a.items() if k in b}


def _round(value: float) -> float:
    return int(value) if float(value).is_integer() else round(value, 3)


def slru_deltas(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> list[dict[str, Any]]:
    rows = []
    for name, (hit0, read0) in before.items():
        hit1, read1 = after.get(name, (hit0, read0))
        hits, reads = hit1 - hit0, read1 - read0
        rows.append(
            {
                "slru": SLRU_DIRS.get(name, name),
                "name": name,
                "blks_hit": hits,
                "blks_read": reads,
                "hit_pct": round(100 * hits / (hits + reads), 2) if hits + reads else None,
            }
        )
    return rows


def _statement_deltas(
    before: dict[tuple[Any, ...], dict[str, Any]] | None,
    after: dict[tuple[Any, ...], dict[str, Any]] | None,
) -> list[dict[str, Any]] | None:
    if before is None or after is None:
        return None
    rows = []
    for key, now in after.items():
        then = before.get(key, {"calls": 0, "total_ms": 0.0, "rows": 0, "shared_blks_read": 0})
        calls = now["calls"] - then["calls"]
        if calls <= 0:
            continue
        total = now["total_ms"] - then["total_ms"]
        rows.append(
            {
                "queryid": now["queryid"],
                "query": "",  # filled for the rows kept (fill_statement_texts)
                "calls": calls,
                "total_ms": round(total, 3),
                "mean_ms": round(total / calls, 3),
                "rows": now["rows"] - then["rows"],
                "shared_blks_read": now["shared_blks_read"] - then["shared_blks_read"],
            }
        )
    rows.sort(key=lambda r: -float(r["total_ms"]))
    return rows[:STATEMENTS_TOP]
