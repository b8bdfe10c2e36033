"""What the server says about its statements over a window: ids, calls, times and texts.

- `QueryIds`: whether backends compute query ids (`compute_query_id`, and `auto` with a
  module that asks for them loaded), and the one-line fix when they do not.
- `read_statements` / `statement_deltas`: pg_stat_statements' calls, execution and
  planning time per query id (top-level rows, summed over users and databases).
- `TextSampler`: pg_stat_activity's texts, sampled through the window, by query id and by
  the probe's text key (statements without an id, `statement.text_key`).
Read-only, on pgprobe's own session settings (connection.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import psycopg

from pgprobe.waitevents import statement

FIX = "ALTER SYSTEM SET compute_query_id = on; SELECT pg_reload_conf();"


@dataclass(frozen=True)
class QueryIds:
    """compute_query_id and what it means for this capture."""

    setting: str  # off, on, auto, regress (or "" before 14)
    statements_loaded: bool  # pg_stat_statements in shared_preload_libraries

    @property
    def computed(self) -> bool:
        if self.setting in ("on", "regress"):
            return True
        return self.setting == "auto" and self.statements_loaded

    def why_none(self) -> str:
        """Why backends publish no ids ("" when they do)."""
        if self.computed:
            return ""
        return (f"compute_query_id = {self.setting}" + (" and pg_stat_statements is not loaded"
                if self.setting == "auto" else ""))  # fmt: skip

    def note(self) -> str | None:
        """One line when backends publish no query ids, with the fix (no restart)."""
        if self.computed:
            return None
        return (
            f"no query ids ({self.why_none()}): statements are grouped by their text instead "
            f"(read from pg_stat_activity); to get ids: {FIX}"
        )


def query_ids(conn: Any) -> QueryIds:
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('compute_query_id', true), "
                    "current_setting('shared_preload_libraries', true)")  # fmt: skip
        setting, preload = cur.fetchone()
    libraries = {part.strip().strip('"') for part in str(preload or "").split(",")}
    return QueryIds(str(setting or ""), "pg_stat_statements" in libraries)


@dataclass
class StatementCounters:
    """pg_stat_statements per query id (top level, summed), or None where not readable."""

    by_id: dict[int, tuple[int, float, float]] | None  # id -> calls, exec ms, plan ms
    track_planning: bool = False


def read_statements(conn: Any) -> StatementCounters:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT to_regclass('pg_stat_statements') IS NOT NULL, "
            "coalesce(current_setting('pg_stat_statements.track_planning', true), '')"
        )
        exists, planning = cur.fetchone()
        if not exists:
            return StatementCounters(None)
        try:
            cur.execute("SELECT queryid, sum(calls), sum(total_exec_time), sum(total_plan_time) "
                        "FROM pg_stat_statements(false) WHERE toplevel AND queryid IS NOT NULL "
                        "GROUP BY queryid")  # fmt: skip
        except psycopg.Error:  # the view exists but the library is not loaded
            conn.rollback()
            return StatementCounters(None)
        rows = {int(q): (int(c), float(e), float(p)) for q, c, e, p in cur.fetchall()}
    return StatementCounters(rows, planning == "on")


def statement_deltas(
    before: StatementCounters, after: StatementCounters
) -> dict[int, tuple[int, float, float]] | None:
    """id -> (calls, exec ms, plan ms) over the window (None: no pg_stat_statements)."""
    if before.by_id is None or after.by_id is None:
        return None
    out = {}
    for qid, (calls, exec_ms, plan_ms) in after.by_id.items():
        c0, e0, p0 = before.by_id.get(qid, (0, 0.0, 0.0))
        if calls > c0:
            out[qid] = (calls - c0, exec_ms - e0, plan_ms - p0)
    return out


def statement_texts(conn: Any, ids: list[int]) -> dict[int, str]:
    """pg_stat_statements' normalised texts of these ids ({} without it)."""
    if not ids:
        return {}
    with conn.cursor() as cur:
        try:
            cur.execute("SELECT DISTINCT ON (queryid) queryid, query FROM pg_stat_statements "
                        "WHERE queryid = ANY(%s)", (ids,))  # fmt: skip
        except psycopg.Error:
            conn.rollback()
            return {}
        return {int(q): str(t or "") for q, t in cur.fetchall()}


class TextSampler(threading.Thread):
    """pg_stat_activity's texts every `interval` s until stop(): the first text seen per
    query id, and per text key (statements without an id), on a connection of its own."""

    def __init__(self, conninfo: str, interval: float = 0.5) -> None:
        super().__init__(name="pgprobe-texts", daemon=True)
        self.conninfo = conninfo
        self.interval = interval
        self.by_id: dict[int, str] = {}
        self.by_key: dict[int, str] = {}
        self.error = ""
        self.own_pid = 0  # its backend: pgprobe's, not the server's work
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

    def run(self) -> None:
        try:
            with psycopg.connect(self.conninfo, autocommit=True) as conn:
                self.own_pid = conn.info.backend_pid
                while True:
                    self._sample(conn)
                    if self._stop_event.wait(self.interval):
                        self._sample(conn)
                        return
        except psycopg.Error as e:
            self.error = str(e).splitlines()[0] if str(e) else type(e).__name__

    def _sample(self, conn: Any) -> None:
        rows = conn.execute(
            "SELECT query_id, query FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND query <> ''"
        ).fetchall()
        for qid, text in rows:
            if qid:
                self.by_id.setdefault(int(qid), str(text))
            else:
                self.by_key.setdefault(statement.text_key(str(text).encode()), str(text))
