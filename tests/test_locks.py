"""pgprobe locks: each Lock sleep charged to its lock and mode, against pg_locks and the
waiter's own clock.

Per build, on a real cluster: session A holds `LOCK TABLE t IN ACCESS EXCLUSIVE MODE` about
3 s while session B runs `SELECT count(*) FROM t` inside a function that reads its own wall
clock and /proc/self/schedstat around it (the truth: wall less CPU less runqueue).
- While B waits, what pgprobe reads from B's memory (lockwait.read: MyProc->waitLock's tag,
  waitLockMode, waitStart) is pg_locks' row for B: locktype, database, relation, mode and
  waitstart, to the microsecond (the offsets per major, checked).
- `pgprobe locks --by pid --json` over the window: B's row is `public.t`, relation,
  AccessShareLock, one wait, its seconds = the truth +- 2 % (the deadlock check at
  deadlock_timeout can sleep on LWLock:LockManager inside the statement: not a Lock sleep);
  the locks add up to the time model's Lock rows of the same capture (lock_model_us), and
  nothing is left without a lock.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import CHECKOUT, cluster_for
from test_waits import wait_attached

from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster
from pgprobe.waitevents import address, lockwait

HOLD_S = 3.0
# The blocked statement's own account, read inside the server around it (test_waits' way).
BLOCKED_SELECT = """
CREATE FUNCTION blocked_select(OUT wall_ns bigint, OUT cpu_ns bigint, OUT runq_ns bigint)
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; s0 text[]; s1 text[];
BEGIN
  t0 := clock_timestamp();
  s0 := string_to_array(pg_read_file('/proc/self/schedstat'), ' ');
  PERFORM count(*) FROM t;
  s1 := string_to_array(pg_read_file('/proc/self/schedstat'), ' ');
  wall_ns := (extract(epoch FROM clock_timestamp() - t0) * 1e9)::bigint;
  cpu_ns := s1[1]::bigint - s0[1]::bigint;
  runq_ns := s1[2]::bigint - s0[2]::bigint;
END $$"""
WAITER_SQL = """
SELECT l.locktype, l.database::bigint, l.relation::bigint, l.mode,
       (extract(epoch FROM l.waitstart - '2000-01-01 00:00:00+00'::timestamptz) * 1e6)::bigint
  FROM pg_locks l WHERE l.pid = %s AND NOT l.granted"""


@pytest.fixture(scope="module")
def locks_cluster(pg_build: PgBuild, tracing: None) -> Iterator[PgCluster]:
    with cluster_for(pg_build, name="pgprobe-locks") as pg:
        pg.sql("CREATE TABLE t (id int PRIMARY KEY, v int)")
        pg.sql("INSERT INTO t SELECT g, 0 FROM generate_series(1, 100) g")
        pg.sql(BLOCKED_SELECT)
        yield pg


def until(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    pytest.fail(f"not within {timeout} s: {what}")


def test_a_waiter_lock_against_pg_locks_and_its_own_clock(
    locks_cluster: PgCluster, pg_build: PgBuild
) -> None:
    pg = locks_cluster
    argv = [sys.executable, "-m", "pgprobe", "locks", *pg.conn_args, "-d", "8", "--by", "pid",
            "--json"]  # fmt: skip
    probe = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=CHECKOUT)  # fmt: skip
    wait_attached(probe)
    truth: list[tuple[int, int, int]] = []
    with pg.connect() as holder, pg.connect() as waiter, pg.connect() as watcher:
        holder.autocommit = waiter.autocommit = watcher.autocommit = True
        waiter_pid = int(waiter.execute("SELECT pg_backend_pid()").fetchone()[0])
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        holder_pid = int(holder.execute("SELECT pg_backend_pid()").fetchone()[0])

        def blocked() -> None:
            row = waiter.execute("SELECT * FROM blocked_select()").fetchone()
            truth.append((int(row[0]), int(row[1]), int(row[2])))

        thread = threading.Thread(target=blocked)
        thread.start()
        row = until(lambda: watcher.execute(WAITER_SQL, (waiter_pid,)).fetchone(),
                    "the waiter queued on the lock")  # fmt: skip
        # the lock as pgprobe reads it from the waiter's memory: pg_locks' row
        major = int(watcher.execute("SHOW server_version_num").fetchone()[0]) // 10000
        found = lockwait.find(address.find(pg.postmaster_pid, str(pg_build.postgres)), major)
        assert found is not None
        waited = lockwait.read(waiter_pid, found)
        assert waited is not None
        columns = waited.tag.columns(major)
        seen = (
            waited.tag.locktype(major),
            columns.get("database"),
            columns.get("relation"),
            lockwait.mode_name(waited.mode),
        )
        assert seen == tuple(row[:4]), (seen, row)
        assert waited.start == row[4], (waited.start, row[4])  # waitstart, to the microsecond
        time.sleep(HOLD_S)
        holder.execute("COMMIT")
        thread.join(timeout=30)
    stdout, stderr = probe.communicate(timeout=60)
    assert probe.returncode == 0, stderr
    doc = json.loads(stdout)
    mine = [r for r in doc["rows"] if r["pid"] == waiter_pid]
    wall_ns, cpu_ns, runq_ns = truth[0]
    expected = (wall_ns - cpu_ns - runq_ns) / 1e9
    summary = (f"waiter {waiter_pid} (holder {holder_pid}): {mine}; truth {wall_ns / 1e9:.4f} s "
               f"less CPU {cpu_ns / 1e6:.3f} ms and runqueue {runq_ns / 1e6:.3f} ms = "
               f"{expected:.4f} s; meta {doc['meta']}; stderr {stderr}")  # fmt: skip
    print(summary)
    assert len(mine) == 1, summary
    got = mine[0]
    assert (got["lock"], got["locktype"], got["mode"]) == (
        "public.t", "relation", "AccessShareLock"), summary  # fmt: skip
    assert got["waits"] == 1, summary
    assert got["total_us"] / 1e6 == pytest.approx(expected, rel=0.02), summary
    assert got["max_us"] == got["total_us"], summary
    meta = doc["meta"]
    assert meta["lock_wait_us"] == pytest.approx(meta["lock_model_us"], abs=1.0), summary
    assert meta["lock_not_read_us"] == 0, summary
