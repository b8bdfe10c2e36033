"""The times pgprobe reads from a backend's status entry (PgBackendStatus, *MyBEEntry), at
the offsets it uses per major (pgprobe.waitevents.statement), are the ones pg_stat_activity
shows, to the microsecond, on every build: st_activity_start_timestamp (query_start: where
a run's part before its statement began is counted) and st_state_start_timestamp
(state_change: where the part of a run after a statement's idle report is split off)."""

from __future__ import annotations

from pgprobe.sandbox import PgCluster
from pgprobe.waitevents import address, backend_state, statement

AS_MICROSECONDS_SINCE_2000 = "((extract(epoch FROM {}) - 946684800) * 1000000)::bigint"


def test_query_start_and_state_change_at_their_offsets(build_cluster: PgCluster) -> None:
    pg = build_cluster
    ((version,),) = pg.sql("SHOW server_version_num")
    major = int(str(version)) // 10000
    wait_event = address.find(pg.postmaster_pid, str(pg.bindir / "postgres"))
    where = statement.find(backend_state.find(wait_event, major), major)
    assert where is not None, major
    columns = ", ".join(
        AS_MICROSECONDS_SINCE_2000.format(c) for c in ("query_start", "state_change")
    )
    with pg.connect() as watched, pg.connect() as watcher:
        for text in ("SELECT 1", "SELECT pg_sleep(0.01)"):
            row = watched.execute(f"{text}, pg_backend_pid()").fetchone()
            assert row is not None
            pid = row[-1]
            read = statement.read(int(str(pid)), where, text_hash=False)
            ((query_start, state_change),) = watcher.execute(
                f"SELECT {columns} FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchall()
            assert (read.activity_start_us, read.state_start_us) == (query_start, state_change)
            assert query_start < state_change, text  # idle reported after the statement began
