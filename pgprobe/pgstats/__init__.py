"""What PostgreSQL's own views say over a capture window (read-only SQL), the SQL
cross-checks in one place:

- counters.py: deltas of cumulative views (pg_stat_database, pg_stat_bgwriter or
  pg_stat_checkpointer, pg_stat_wal, pg_stat_io, pg_stat_slru, pg_stat_statements),
  read at the start and at the end of the window;
- activity.py: pg_stat_activity sampled every second (a wait-event profile, like
  pg_wait_sampling), with idle and client waits left out since they are not the
  server's time;
- slru.py: pg_stat_slru over exactly one probe window (SlruStats, clog-reads'
  cross-check);
- statements.py: compute_query_id, pg_stat_statements per query id over a window, and
  statement texts (pgprobe queries, triage's statements);
- locks.py: who waits on which heavyweight lock behind whom (pg_locks and
  pg_blocking_pids, sampled only while some backend is in a Lock wait; pgprobe locks);
- relnames.py: database and relation names for the OIDs a lock carries.

Every session is read-only (pgprobe.connection).
"""

from pgprobe.pgstats.activity import IDLE_WAIT_TYPES, ActivitySampler, first_line
from pgprobe.pgstats.counters import (
    DATABASE_COLUMNS,
    STATEMENTS_TOP,
    Counters,
    deltas,
    fill_statement_texts,
    read_counters,
    slru_deltas,
)
from pgprobe.pgstats.slru import SLRU_COLUMNS, SLRU_DIRS, SLRU_SQL, SlruStats, slru_order
from pgprobe.pgstats.statements import TextSampler, statement_texts

__all__ = [
    "DATABASE_COLUMNS",
    "IDLE_WAIT_TYPES",
    "SLRU_COLUMNS",
    "SLRU_DIRS",
    "SLRU_SQL",
    "STATEMENTS_TOP",
    "ActivitySampler",
    "Counters",
    "SlruStats",
    "TextSampler",
    "deltas",
    "fill_statement_texts",
    "first_line",
    "read_counters",
    "slru_deltas",
    "slru_order",
    "statement_texts",
]
