"""pgprobe locks: each Lock sleep charged to its lock and mode, against pg_locks and each
waiter's own clock.

Per build, on a real cluster, one capture over three scenes, one after the other; every
blocked statement runs inside `timed()`, which reads the backend's wall clock and
/proc/self/schedstat around it (the truth: wall less CPU less runqueue, read by the server
itself, not by pgprobe):
1. A holds `LOCK TABLE t IN ACCESS EXCLUSIVE MODE` ~3 s; B `SELECT count(*) FROM t` waits.
   While B waits, what pgprobe reads from B's memory (lockwait.read: MyProc->waitLock's
   tag, waitLockMode, waitStart) is pg_locks' row for B, waitstart to the microsecond (the
   offsets per major, checked).
2. The migration queue: A holds m's AccessShareLock in an open transaction; B runs `ALTER
   TABLE m ADD COLUMN` (AccessExclusiveLock, behind A); C, D, E `SELECT count(*) FROM m`
   queue behind B (AccessShareLock).
3. Row locks: A updates row 1 of r and holds it; B updates it (waits on A's transaction
   id, ShareLock); C updates it (waits on the tuple, ExclusiveLock, behind B).
Beside it, bpf/waits.bt run by hand with MyProc's address (the "by hand" form of the same
read): each waiter's @lock_ns rows hold the lock pg_locks showed it queued on, and its
seconds are its truth +- 2 % too.
Then `pgprobe locks --by pid --json`: each waiter's rows are the locks and modes above (the
transaction id A's own), their seconds its truth +- 2 % (the deadlock check after
deadlock_timeout can sleep on LWLock:LockManager inside the statement: not a Lock sleep);
the locks add up to the time model's Lock rows of the same capture (lock_model_us) within
a microsecond, and no Lock sleep is left without its lock.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from byhand import SCRIPT_LOST_SHARE, ByHand, script_locks, script_lost
from helpers import CHECKOUT, WAITS_BT, cluster_for, stop_early, took_lost_path, until
from test_waits import wait_attached

from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster
from pgprobe.waitevents import address, lockwait

HOLD_S = 2.0
TABLE_HOLD_S = 3.0  # the first case: a table held 3 s
# A statement's own account, read inside the server around it only (test_waits' way).
TIMED = """
CREATE FUNCTION timed(q text, OUT wall_ns bigint, OUT cpu_ns bigint, OUT runq_ns bigint)
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; s0 text[]; s1 text[];
BEGIN
  t0 := clock_timestamp();
  s0 := string_to_array(pg_read_file('/proc/self/schedstat'), ' ');
  EXECUTE q;
  s1 := string_to_array(pg_read_file('/proc/self/schedstat'), ' ');
  wall_ns := (extract(epoch FROM clock_timestamp() - t0) * 1e9)::bigint;
  cpu_ns := s1[1]::bigint - s0[1]::bigint;
  runq_ns := s1[2]::bigint - s0[2]::bigint;
END $$"""
WAITING = """
SELECT l.locktype, l.database::bigint, l.relation::bigint, l.mode,
       (extract(epoch FROM l.waitstart - '2000-01-01 00:00:00+00'::timestamptz) * 1e6)::bigint,
       l.page, l.tuple, l.transactionid::text::bigint
  FROM pg_locks l WHERE l.pid = %s AND NOT l.granted"""


@pytest.fixture(scope="module")
def locks_cluster(pg_build: PgBuild, tracing: None) -> Iterator[PgCluster]:
    with cluster_for(pg_build, name="pgprobe-locks") as pg:
        for table in ("t", "m", "r"):
            pg.sql(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
            pg.sql(f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 100) g")
        pg.sql(TIMED)
        yield pg


def start_locks(pg: PgCluster, *more: str) -> subprocess.Popen[str]:
    """`pgprobe locks --by pid --json`, attached (its window has begun)."""
    argv = [sys.executable, "-m", "pgprobe", "locks", *pg.conn_args, "--by", "pid", "--json",
            *more]  # fmt: skip
    probe = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=CHECKOUT)  # fmt: skip
    wait_attached(probe)
    return probe


class Scene:
    """Sessions of one capture: holders, and waiters whose statements run in timed()."""

    def __init__(self, pg: PgCluster) -> None:
        self.pg = pg
        self.conns: list[psycopg.Connection[Any]] = []
        self.watcher = self.session()
        self.truth: dict[int, float] = {}  # waiter pid -> off CPU and not runnable, s
        self.queued: dict[int, tuple[Any, ...]] = {}  # waiter pid -> its pg_locks row (WAITING)
        self.expected: dict[int, set[tuple[str, str, str]]] = {}  # pid -> (lock, type, mode)
        self.roots: dict[int, tuple[int, int]] = {}  # waiter -> (its root, the pid ahead)
        self.threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def session(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.pg.conninfo, autocommit=True)
        self.conns.append(conn)
        return conn

    @staticmethod
    def pid(conn: psycopg.Connection[Any]) -> int:
        return int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]

    def wait(self, sql: str, expected: set[tuple[str, str, str]]) -> int:
        """A waiter: sql in timed(), in a thread; returns once it is queued on a lock."""
        conn = self.session()
        pid = self.pid(conn)
        self.expected[pid] = expected

        def run() -> None:
            try:
                row = conn.execute("SELECT * FROM timed(%s)", (sql,)).fetchone()
                assert row is not None
                self.truth[pid] = (int(row[0]) - int(row[1]) - int(row[2])) / 1e9
            except Exception as exc:  # noqa: BLE001 - said by the test
                self.errors.append(f"{sql}: {exc}")

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)
        self.queued[pid] = until(lambda: self.watcher.execute(WAITING, (pid,)).fetchone(),
                                 f"{sql} queued")  # fmt: skip
        return pid

    def done(self) -> None:
        for thread in self.threads:
            thread.join(timeout=60)
        for conn in self.conns:
            conn.close()


def check_script_locks(scene: Scene, lines: list[str], major: int, engine: str) -> None:
    """Each waiter's rows in a script's lock maps: the lock pg_locks showed it queued on
    among them (type, OIDs, xid, mode), their seconds its truth +- 2 %; a waiter the
    script names in @unseen (events lost) at most its truth + 2 %, the run counted."""
    got, lost = script_locks(lines), script_lost(lines)
    took_lost_path(f"{engine} by hand: lock waits", bool(lost & set(scene.queued)),
                   SCRIPT_LOST_SHARE, WAITS_BT if engine == "waits.bt" else None)  # fmt: skip
    for pid, queued in scene.queued.items():
        mine = got.get(pid, {})
        seen = set()
        for (mode, kind, *fields), row in mine.items():
            tag = lockwait.LockTag(*fields, kind, 1)
            cols = tag.columns(major)
            seen.add((tag.locktype(major), cols.get("database"), cols.get("relation"),
                      lockwait.mode_name(mode), cols.get("page"), cols.get("tuple"),
                      cols.get("transactionid")))  # fmt: skip
            assert row.get("waits", 0) >= 1 and row["ns"] <= row["max"] * row["waits"], row
        total = sum(row["ns"] for row in mine.values()) / 1e9
        line = f"{engine} waiter {pid}: {total:.4f} s (truth {scene.truth.get(pid)}) on {mine}"
        print(line)
        assert (*queued[:4], *queued[5:]) in seen, f"{line}; pg_locks {queued}"
        if pid in lost:
            assert total <= 1.02 * scene.truth[pid], f"{line}; events lost"
        else:
            assert total == pytest.approx(scene.truth[pid], rel=0.02), line


def test_waiters_locks_against_pg_locks_and_their_own_clocks(
    locks_cluster: PgCluster, pg_build: PgBuild
) -> None:
    pg = locks_cluster
    by_hand = ByHand.waits_bt(pg, pg_build)
    probe, scene = start_locks(pg, "-d", "14"), Scene(pg)
    try:
        # 1. a table lock; the waiter's lock read from its memory against pg_locks
        holder = scene.session()
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        waiter = scene.wait("SELECT count(*) FROM t",
                            {("public.t", "relation", "AccessShareLock")})  # fmt: skip
        scene.roots[waiter] = (scene.pid(holder), scene.pid(holder))
        row = scene.watcher.execute(WAITING, (waiter,)).fetchone()
        assert row is not None
        major = int(scene.watcher.execute("SHOW server_version_num").fetchone()[0]) // 10000  # type: ignore[index]
        found = lockwait.find(address.find(pg.postmaster_pid, str(pg_build.postgres)), major)
        assert found is not None
        waited = lockwait.read(waiter, found)
        assert waited is not None
        columns = waited.tag.columns(major)
        seen = (waited.tag.locktype(major), columns.get("database"), columns.get("relation"),
                lockwait.mode_name(waited.mode))  # fmt: skip
        assert seen == tuple(row[:4]), (seen, row)
        assert waited.start == row[4], (waited.start, row[4])  # waitstart, to the microsecond
        time.sleep(TABLE_HOLD_S)
        holder.execute("COMMIT")

        # 2. the migration queue: A's open transaction, B's ALTER behind it, C-E behind B
        reader = scene.session()
        reader.execute("BEGIN")
        reader.execute("SELECT * FROM m LIMIT 1")
        alter = scene.wait("ALTER TABLE m ADD COLUMN x int",
                           {("public.m", "relation", "AccessExclusiveLock")})  # fmt: skip
        scene.roots[alter] = (scene.pid(reader), scene.pid(reader))
        for _ in range(3):
            pid = scene.wait("SELECT count(*) FROM m",
                             {("public.m", "relation", "AccessShareLock")})  # fmt: skip
            scene.roots[pid] = (scene.pid(reader), alter)
        time.sleep(HOLD_S)
        reader.execute("COMMIT")

        # 3. row locks: B waits on A's transaction, C on the row behind B
        updater = scene.session()
        updater.execute("BEGIN")
        xid = int(updater.execute("SELECT txid_current()").fetchone()[0]) & 0xFFFFFFFF  # type: ignore[index]
        updater.execute("UPDATE r SET v = v + 1 WHERE id = 1")
        update = "UPDATE r SET v = v + 1 WHERE id = 1"
        first = scene.wait(update, {(f"transaction {xid}", "transactionid", "ShareLock")})
        second = scene.wait(update, {("public.r (block 0, row 1)", "tuple", "ExclusiveLock")})
        scene.roots[first] = (scene.pid(updater), scene.pid(updater))
        scene.roots[second] = (scene.pid(updater), first)
        time.sleep(HOLD_S)
        updater.execute("COMMIT")
    finally:
        scene.done()
    stdout, stderr = stop_early(probe)
    assert not scene.errors, scene.errors
    check_script_locks(scene, by_hand.stop(), major, "waits.bt")
    assert probe.returncode == 0, stderr
    doc = json.loads(stdout)
    meta = doc["meta"]
    summary = f"meta {meta}; stderr {stderr}"
    for pid, expected in scene.expected.items():
        mine = [r for r in doc["rows"] if r["pid"] == pid]
        locks = {(r["lock"], r["locktype"], r["mode"]) for r in mine}
        total = sum(r["total_us"] for r in mine) / 1e6
        line = f"waiter {pid}: {total:.4f} s (truth {scene.truth.get(pid)}) on {mine}"
        print(line)
        # C's wait on the row may end in a short wait on B's transaction: the expected
        # locks are there, and nothing on another table
        assert expected <= locks, f"{line}; {summary}"
        assert total == pytest.approx(scene.truth[pid], rel=0.02), f"{line}; {summary}"
    assert meta["lock_wait_us"] == pytest.approx(meta["lock_model_us"], abs=1.0), summary
    assert meta["lock_not_read_us"] == 0, summary
    # The blocking trees: each waiter under its root and the pid ahead of it, the root's
    # session idle in its transaction; a tree's seconds are its waiters' exact ones.
    placed = {}
    for tree in meta["blocking"]["trees"]:
        root = tree["root"]
        assert root["state"] == "idle in transaction", tree
        for w in tree["waiters"]:
            placed[w["pid"]] = (root["pid"], w["behind"])
        waited = sum(w["waited_us"] for w in tree["waiters"])
        assert tree["waited_us"] == pytest.approx(waited, abs=0.01), tree
    assert placed == scene.roots, (placed, scene.roots, meta["blocking"])
    assert len(meta["blocking"]["trees"]) == 3, meta["blocking"]
    assert meta["blocking"]["unsampled_us"] == 0, meta["blocking"]


@pytest.mark.once
def test_interval_windows_add_up_to_the_wait(locks_cluster: PgCluster) -> None:
    """--interval 1: a wait of ~3 s spread over windows; the windows' seconds add up to the
    waiter's own account +- 2 %, each window's locks to its time model's Lock rows, and the
    wait is counted once (in the window it began)."""
    pg = locks_cluster
    probe, scene = start_locks(pg, "-d", "6", "--interval", "1"), Scene(pg)
    try:
        holder = scene.session()
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
        waiter = scene.wait("SELECT count(*) FROM t", set())
        time.sleep(1.5 * HOLD_S)
        holder.execute("COMMIT")
    finally:
        scene.done()
    stdout, stderr = probe.communicate(timeout=60)
    assert not scene.errors and probe.returncode == 0, (scene.errors, stderr)
    docs = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert len(docs) >= 5, stdout
    mine = [r for d in docs for r in d["rows"] if r["pid"] == waiter]
    total = sum(r["total_us"] for r in mine) / 1e6
    summary = f"{total:.4f} s over {len(mine)} windows, truth {scene.truth[waiter]}: {mine}"
    print(summary)
    assert len(mine) >= 3, summary  # the wait spans windows
    assert total == pytest.approx(scene.truth[waiter], rel=0.02), summary
    assert sum(r["waits"] for r in mine) == 1, summary
    for d in docs:
        assert d["meta"]["lock_wait_us"] == pytest.approx(d["meta"]["lock_model_us"], abs=1.0)
