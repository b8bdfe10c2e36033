"""`pgprobe backends --json` against a throwaway cluster of every build.

Sessions in known states (idle, active in pg_sleep, idle in transaction, aborted, waiting on
a lock), as two users in two databases so that a column swapped shows. Each printed value
is checked against what the test itself set up, read from pg_stat_activity, and from /proc
(the postmaster's children, their process titles), never against pgprobe's own code.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from helpers import cluster_for, need, run_pgprobe, until

from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

USER, DB = "probe_user", "probe_db"
ACTIVITY = """
SELECT pid, backend_type, coalesce(datname, ''), coalesce(usename, ''), application_name,
       coalesce(state, ''), coalesce(wait_event_type, ''), coalesce(wait_event, ''), query
  FROM pg_stat_activity ORDER BY pid"""
COLUMNS = ("pid", "backend_type", "datname", "usename", "application_name", "state",
           "wait_event_type", "wait_event", "query")  # fmt: skip


@dataclass(frozen=True)
class Session:
    """A session's known row, and the end of its process title (update_process_title)."""

    app: str
    user: str
    db: str
    state: str
    wait: tuple[str, str]
    query: str
    title: str


SESSIONS = (
    Session("t_idle", "postgres", "postgres", "idle", ("Client", "ClientRead"),
            "SELECT 1 AS idle_one", "idle"),
    Session("t_sleep", USER, DB, "active", ("Timeout", "PgSleep"),
            "SELECT pg_sleep(600)", "SELECT"),
    Session("t_holder", USER, DB, "idle in transaction", ("Client", "ClientRead"),
            "LOCK TABLE held IN ACCESS EXCLUSIVE MODE", "idle in transaction"),
    Session("t_aborted", "postgres", DB, "idle in transaction (aborted)",
            ("Client", "ClientRead"), "SELECT 1 / 0", "idle in transaction (aborted)"),
    Session("t_waiting", "postgres", DB, "active", ("Lock", "relation"),
            "SELECT count(*) FROM held", "SELECT waiting"),
)  # fmt: skip


@pytest.fixture
def scene(pg_build: PgBuild) -> Iterator[tuple[PgCluster, dict[str, int]]]:
    """A cluster (no autovacuum: no worker comes or goes) and the sessions: {app: pid}."""
    need(os.geteuid() == 0, "needs root to read the postmaster's /proc/PID/exe")
    with cluster_for(pg_build, {"autovacuum": "off"}, name="pgprobe-backends") as pg:
        pg.sql(f"CREATE ROLE {USER} LOGIN")
        pg.sql(f"CREATE DATABASE {DB} OWNER {USER}")
        with pg.connect(user=USER, dbname=DB) as owner:
            owner.execute("CREATE TABLE held (i int)")
        conns: dict[str, psycopg.Connection[Any]] = {}
        threads = []
        try:
            for s in SESSIONS:
                conns[s.app] = pg.connect(user=s.user, dbname=s.db, application_name=s.app)
            conns["t_idle"].execute(SESSIONS[0].query)
            for app in ("t_holder", "t_aborted"):
                conns[app].execute("BEGIN")
            conns["t_holder"].execute(SESSIONS[2].query)
            with contextlib.suppress(psycopg.errors.DivisionByZero):
                conns["t_aborted"].execute(SESSIONS[3].query)
            for s in (SESSIONS[1], SESSIONS[4]):  # they block: canceled at the end
                threads.append(threading.Thread(target=run_canceled, args=(conns[s.app], s)))
                threads[-1].start()
            pids = {app: int(c.info.backend_pid) for app, c in conns.items()}
            yield pg, pids
        finally:
            for conn in conns.values():
                conn.cancel()
            for thread in threads:
                thread.join(30)
            for conn in conns.values():
                conn.close()


def run_canceled(conn: psycopg.Connection[Any], s: Session) -> None:
    with contextlib.suppress(psycopg.errors.QueryCanceled):
        conn.execute(s.query)


def activity(conn: psycopg.Connection[Any]) -> dict[int, dict[str, Any]]:
    return {
        int(r[0]): dict(zip(COLUMNS, r, strict=True)) for r in conn.execute(ACTIVITY).fetchall()
    }


def ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def title(pid: int) -> str:
    """The process title ("postgres: checkpointer", "postgres: USER DB [local] idle")."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def children(postmaster: int) -> set[int]:
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if ppid(int(name)) == postmaster:
                    out.add(int(name))
    return out


def test_backends_rows_are_pg_stat_activity_and_the_postmasters_children(
    pg_build: PgBuild, scene: tuple[PgCluster, dict[str, int]]
) -> None:
    pg, pids = scene
    postmaster = pg.postmaster_pid  # postmaster.pid's first line
    with pg.connect(application_name="t_reader") as reader:
        mine = int(reader.info.backend_pid)

        def settled() -> dict[int, dict[str, Any]] | None:
            rows = activity(reader)
            ok = all(
                (rows[pids[s.app]]["state"], rows[pids[s.app]]["wait_event_type"],
                 rows[pids[s.app]]["wait_event"]) == (s.state, *s.wait)
                for s in SESSIONS
            )  # fmt: skip
            return rows if ok else None

        before = until(settled, "sessions in their states")
        # read before pgprobe runs: its own backend (left out) may outlive it a moment
        kids = children(postmaster)
        titles = {p: title(p) for p in kids}
        done = run_pgprobe(["backends", *pg.conn_args, "--json"])
        after = until(settled, "sessions still in their states")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    rows = {r["pid"]: r for r in doc["rows"]}
    assert len(rows) == len(doc["rows"]) and all(set(r) == set(COLUMNS) for r in rows.values())

    # The pid set: the postmaster's children that pg_stat_activity lists (14's stats
    # collector is not one).
    kids = {p for p in kids if not titles[p].endswith("stats collector")}
    assert set(rows) == kids == set(before), (rows, kids, before)
    assert set(pids.values()) | {mine} <= set(rows)
    meta = doc["meta"]
    assert meta["pids"] == sorted(rows) and meta["target"] == "cluster"
    assert meta["postmaster_pid"] == postmaster
    assert meta["server_binary"] == os.readlink(f"/proc/{postmaster}/exe")
    assert os.path.samefile(meta["server_binary"], pg_build.postgres)
    assert os.path.samefile(meta["data_directory"], pg.data)
    with pg.connect() as conn:
        version, num = conn.execute(
            "SELECT current_setting('server_version'), current_setting('server_version_num')"
        ).fetchone() or ("", "")
    assert (meta["postgres_version"], meta["postgres_version_num"]) == (version, int(str(num)))

    # The sessions: what the test made them, and their titles say so too.
    for s in SESSIONS:
        row = rows[pids[s.app]]
        known = dict(pid=pids[s.app], backend_type="client backend", datname=s.db,
                     usename=s.user, application_name=s.app, state=s.state,
                     wait_event_type=s.wait[0], wait_event=s.wait[1], query=s.query)  # fmt: skip
        assert row == known, (row, known)
        assert titles[row["pid"]] == f"postgres: {s.user} {s.db} [local] {s.title}"
    # The reader: idle, after the query it ran last before pgprobe.
    assert rows[mine]["state"] == "idle" and rows[mine]["query"] == ACTIVITY
    assert rows[mine]["application_name"] == "t_reader"

    # Every row as pg_stat_activity shows it (a background process may have been awake, on
    # CPU without a wait event, at pgprobe's read: then as before, after, or no event).
    for pid, row in rows.items():
        truth = before[pid]
        if pid == mine:
            truth = {**truth, "state": "idle", "wait_event_type": "Client",
                     "wait_event": "ClientRead"}  # fmt: skip
        fixed = ("backend_type", "datname", "usename", "application_name", "query")
        assert {k: row[k] for k in fixed} == {k: truth[k] for k in fixed}, (row, truth)
        if pid in pids.values() or pid == mine:
            assert (row["state"], row["wait_event_type"], row["wait_event"]) == (
                truth["state"], truth["wait_event_type"], truth["wait_event"])  # fmt: skip
            continue
        assert row["state"] == "" == after[pid]["state"], row  # not a client: no state
        seen = {(t[pid]["wait_event_type"], t[pid]["wait_event"]) for t in (before, after)}
        assert (row["wait_event_type"], row["wait_event"]) in seen | {("", "")}, (row, seen)
        # its title names it: "postgres: checkpointer", "postgres: io worker 0"
        assert titles[pid].startswith(f"postgres: {row['backend_type']}"), (row, titles[pid])
