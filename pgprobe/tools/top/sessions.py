"""What `pgprobe top` reads of the server at each refresh, on one read-only session of its
own: pg_stat_activity (who the processes are, their state, transaction age, wait event and
statement now) and pg_stat_statements' counters (calls per statement over the window).
Two queries a refresh; the statements' texts are kept once seen (by query id, or by the
probe's text key where the server computes no ids). The server gone: said in one line,
the capture goes on with what /proc tells, and the session is tried again each refresh."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgprobe import discover
from pgprobe.errors import PgprobeError
from pgprobe.pgstats import statements as pgss
from pgprobe.tools.top.records import Session
from pgprobe.waitevents import statement

TEXT_CHARS = 400  # of each backend's statement: a row shows one line of it
SQL = f"""
SELECT pid, coalesce(backend_type, ''), coalesce(application_name, ''),
       coalesce(host(client_addr), CASE WHEN client_port = -1 THEN 'local' ELSE '' END),
       coalesce(state, ''), extract(epoch FROM clock_timestamp() - xact_start)::float8,
       coalesce(wait_event_type || ':' || wait_event, ''), left(coalesce(query, ''),
       {TEXT_CHARS}), query_id, coalesce(datname, ''), coalesce(usename, '')
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid()
"""


@dataclass
class Reading:
    """One refresh's read: the sessions, the statements' calls since the last read."""

    sessions: dict[int, Session]
    calls: dict[int, tuple[int, float, float]] | None  # query id -> calls, exec ms, plan ms
    error: str = ""  # the read failed: why, in one line


@dataclass
class Sessions:
    """The session top reads through, and what it has learnt: texts, the last counters."""

    conninfo: str | None
    texts: dict[int, str] = field(default_factory=dict)  # query id -> text
    text_keys: dict[int, str] = field(default_factory=dict)  # statement.text_key -> text
    own_pid: int = 0
    _conn: Any = None
    _counters: pgss.StatementCounters | None = None
    _known: dict[int, Session] = field(default_factory=dict)

    def read(self) -> Reading:
        """The sessions now; on failure the last ones seen, and why."""
        if self.conninfo is None:
            return Reading({}, None, "no SQL session (the server was found from /proc)")
        try:
            conn = self._connection()
            with conn.cursor() as cur:
                cur.execute(SQL)
                rows = cur.fetchall()
            counters = pgss.read_statements(conn)
        except (psycopg.Error, PgprobeError, OSError) as exc:
            self.close()
            return Reading(dict(self._known), None, _first_line(exc))
        sessions = {}
        for pid, btype, app, client, state, age, wait, query, qid, db, user in rows:
            sessions[pid] = Session(pid, btype, app, client, state, age, wait, query, db, user)
            if query and qid:
                self.texts.setdefault(int(qid), query)
            elif query and state == "active":
                self.text_keys.setdefault(statement.text_key(query.encode()), query)
        calls = pgss.statement_deltas(self._counters, counters) if self._counters else None
        self._counters = counters
        # a backend gone since keeps its last row (its time in the window is still shown)
        self._known = {**{p: s for p, s in self._known.items() if p not in sessions}, **sessions}
        return Reading(dict(self._known), calls)

    def statement_texts(self, ids: list[int]) -> dict[int, str]:
        """pg_stat_statements' texts of ids not seen in pg_stat_activity (once each)."""
        missing = [i for i in ids if i not in self.texts]
        if not missing or self._conn is None:
            return self.texts
        try:
            self.texts.update(pgss.statement_texts(self._conn, missing))
        except psycopg.Error:
            self.close()
        for qid in missing:  # asked once: no text there either
            self.texts.setdefault(qid, "")
        return self.texts

    def _connection(self) -> Any:
        if self._conn is None:
            assert self.conninfo is not None
            self._conn = discover.connect_conninfo(self.conninfo)
            self.own_pid = self._conn.info.backend_pid
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return f"the server's session failed: {str(text).splitlines()[0]}"
