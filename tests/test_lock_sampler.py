"""pgstats.locks: heavyweight lock waits sampled by SQL, against the test's own sessions.
Kept in one file (~410 lines): the scenes share one cluster per build (the module fixture)
and the Clients helper that holds and blocks sessions; the pure checks are short.

The truth is each session's own pg_backend_pid() (and, for row locks, its transaction id
and the row's ctid read before the update), never the code under test. Per build (a
cluster of its own, with pg_stat_statements):
- A holds ACCESS EXCLUSIVE on t, idle in transaction; B's SELECT waits: B on public.t in
  AccessShareLock, blocked by (A,), A idle in transaction, one tree rooted at A;
- the migration queue: A holds AccessShareLock in a transaction, B's ALTER TABLE waits
  on A in AccessExclusiveLock, C-E's SELECTs queue behind B: one tree, root A;
- row locks: A updated a row and holds it; B waits on A's transactionid (owner A), C on
  the tuple lock B holds, on public.r at the row's ctid: root A.
Once: with no lock waits the sampler never reads pg_locks (pg_stat_statements' calls
of the sampler's statements, read by the test), and does once there is a wait; the
server stopped mid-capture leaves a one-line error and the samples taken before.
Pure: labels of every lock type, trees of queues, cycles and several roots.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from helpers import cluster_for

from pgprobe.pgbuilds import PgBuild
from pgprobe.pgstats.locks import (
    MAX_DUTY,
    LockSampler,
    LockTarget,
    Sample,
    Waiter,
    blocking_tree,
)
from pgprobe.sandbox import PgCluster
from pgprobe.tools.locks.trees import Tree

# room for LARGE_TABLE locks in the shared lock table (max_locks_per_transaction x backends)
STATEMENTS = {"shared_preload_libraries": "'pg_stat_statements'", "compute_query_id": "on",
              "max_locks_per_transaction": "256"}  # fmt: skip
LARGE_TABLE = 20000
# A test session never hangs the suite: a wait left behind by a failed test ends here.
SESSION_OPTIONS = "-c statement_timeout=120s -c lock_timeout=120s"
DEADLINE_S = 60


@pytest.fixture(scope="module")
def pg(pg_build: PgBuild) -> Iterator[PgCluster]:
    """A cluster of each build with pg_stat_statements (tests marked once: the ONCE build)."""
    with cluster_for(pg_build, STATEMENTS, name="pgprobe-lock-sampler") as cluster:
        cluster.sql("CREATE EXTENSION pg_stat_statements")
        yield cluster


class Clients:
    """The test's sessions: holders (idle in their transaction) and blocked statements,
    each run in a thread; all ended at close, holders first so that the waits end."""

    def __init__(self, pg: PgCluster) -> None:
        self.pg = pg
        self.holders: list[psycopg.Connection[tuple[object, ...]]] = []
        self.waiters: list[tuple[psycopg.Connection[tuple[object, ...]], threading.Thread]] = []
        self.errors: list[BaseException] = []

    def _connect(self, autocommit: bool) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.pg.conninfo, autocommit=autocommit, options=SESSION_OPTIONS)

    def hold(self, *statements: str) -> int:
        """Run statements in a transaction left open (idle in transaction); its pid."""
        conn = self._connect(autocommit=False)
        self.holders.append(conn)
        for statement in statements:
            conn.execute(statement.encode())
        return pid_of(conn)

    def block(self, statement: str, wait_event: str | None = None) -> int:
        """Run statement in a thread; return its pid once the server shows it in a Lock
        wait (its own pg_stat_activity row, read by the test)."""
        conn = self._connect(autocommit=True)
        pid = pid_of(conn)

        def run() -> None:
            try:
                conn.execute(statement.encode())
            except psycopg.Error as exc:
                self.errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.waiters.append((conn, thread))
        self.wait_for(pid, wait_event)
        return pid

    def wait_for(self, pid: int, wait_event: str | None) -> None:
        query = b"SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s"
        with self.pg.connect() as conn:

            def waiting() -> bool:
                row = conn.execute(query, (pid,)).fetchone()
                return row is not None and row[0] == "Lock" and wait_event in (None, row[1])

            poll(waiting, f"pid {pid} never waited on a lock ({wait_event})")

    def close(self) -> None:
        for conn in self.holders:
            conn.close()  # rolls back: the waits end
        for conn, thread in self.waiters:
            thread.join(timeout=30)
            if thread.is_alive():
                conn.cancel()
                thread.join(timeout=10)
            conn.close()


@pytest.fixture
def clients(pg: PgCluster) -> Iterator[Clients]:
    made = Clients(pg)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def sampler(pg: PgCluster) -> Iterator[LockSampler]:
    running = LockSampler(pg.conninfo, interval=0.2)
    running.start()
    yield running
    running.stop()


def pid_of(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute(b"SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(str(row[0]))


def poll(done: Callable[[], bool], message: str, deadline_s: float = DEADLINE_S) -> None:
    """Until done() or the deadline (no fixed sleep that a loaded machine could outrun)."""
    deadline = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def sample_with(sampler: LockSampler, ok: Callable[[Sample], bool], what: str) -> Sample:
    """The first sample for which ok() holds, polled for until the deadline."""
    found: list[Sample] = []

    def seen() -> bool:
        assert sampler.error is None, sampler.error
        found.extend(s for s in list(sampler.samples) if ok(s))
        return bool(found)

    poll(seen, f"no sample shows {what}; last: {sampler.samples[-1:]}")
    return found[0]


def waiter(sample: Sample, pid: int) -> Waiter:
    return next(w for w in sample.waiters if w.pid == pid)


def fresh_table(pg: PgCluster, name: str) -> None:
    pg.sql(f"DROP TABLE IF EXISTS {name}; CREATE TABLE {name} (id int PRIMARY KEY, v int);"
           f"INSERT INTO {name} SELECT g, 0 FROM generate_series(1, 10) g")  # fmt: skip


# -- every build -------------------------------------------------------------------------------


def test_select_waits_behind_access_exclusive(
    pg: PgCluster, clients: Clients, sampler: LockSampler
) -> None:
    fresh_table(pg, "t")
    a = clients.hold("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
    started = time.monotonic()
    b = clients.block("SELECT count(*) FROM t", "relation")
    sample = sample_with(
        sampler,
        lambda s: any(w.pid == b and w.waited_from == "waitstart" for w in s.waiters),
        f"B ({b}) waiting with its waitstart",
    )
    elapsed = time.monotonic() - started
    w = waiter(sample, b)
    assert w.target.locktype == "relation" and w.target.label() == "public.t"
    assert w.mode == "AccessShareLock"
    assert w.blocking_pids == (a,)
    assert w.waited_s is not None and 0 <= w.waited_s <= elapsed + 0.5, (w, elapsed)
    assert sample.sessions[a].state == "idle in transaction"
    xact_age_s = sample.sessions[a].xact_age_s
    assert xact_age_s is not None and xact_age_s > 0
    assert (sample.sessions[b].wait_event_type, sample.sessions[b].wait_event) == (
        "Lock", "relation")  # fmt: skip
    assert sample.sessions[b].query == "SELECT count(*) FROM t"
    # compute_query_id = on: A's last statement has its id; B has none yet: a statement's
    # id is computed after parse analysis, and B waits in it (opening t for the parser)
    assert sample.sessions[a].query_id is not None
    assert sample.sessions[b].query_id is None
    assert any(h.pid == a and h.mode == "AccessExclusiveLock" for h in sample.holders)
    trees = blocking_tree(sample)
    assert [(t.pid, t.pids()) for t in trees] == [(a, [a, b])]
    assert trees[0].waiter is None  # A waits on nothing
    doc = json.loads(json.dumps(sampler.document()))
    waits = [w for s in doc["samples"] for w in s["waiters"] if w["pid"] == b]
    assert waits and waits[-1]["target"]["label"] == "public.t"


def test_migration_queue_is_one_tree_rooted_at_the_reader(
    pg: PgCluster, clients: Clients, sampler: LockSampler
) -> None:
    fresh_table(pg, "t")
    a = clients.hold("SELECT * FROM t LIMIT 1")
    b = clients.block("ALTER TABLE t ADD COLUMN x int", "relation")
    queued = [clients.block("SELECT count(*) FROM t", "relation") for _ in range(3)]
    everyone = {b, *queued}
    sample = sample_with(sampler, lambda s: everyone <= {w.pid for w in s.waiters},
                         f"B ({b}) and C-E ({queued}) waiting")  # fmt: skip
    assert waiter(sample, b).mode == "AccessExclusiveLock"
    assert waiter(sample, b).blocking_pids == (a,)
    assert waiter(sample, b).target.label() == "public.t"
    for pid in queued:
        assert waiter(sample, pid).mode == "AccessShareLock"
        assert b in waiter(sample, pid).blocking_pids
    trees = blocking_tree(sample)
    assert len(trees) == 1 and trees[0].pid == a, trees
    assert sorted(trees[0].pids()) == sorted([a, b, *queued])
    [behind_a] = trees[0].behind
    assert behind_a.pid == b and sorted(n.pid for n in behind_a.behind) == sorted(queued)
    assert sample.sessions[a].state == "idle in transaction"


def test_row_locks_transactionid_owner_and_tuple(
    pg: PgCluster, clients: Clients, sampler: LockSampler
) -> None:
    fresh_table(pg, "r")
    ctid = str(pg.sql("SELECT ctid FROM r WHERE id = 1")[0][0])  # "(0,1)"
    block, row = (int(x) for x in ctid.strip("()").split(","))
    a = clients.hold("UPDATE r SET v = v + 1 WHERE id = 1")
    xid_row = clients.holders[-1].execute(b"SELECT txid_current()").fetchone()
    assert xid_row is not None
    xid = int(str(xid_row[0])) % (1 << 32)  # txid_current() carries the epoch above
    b = clients.block("UPDATE r SET v = v + 1 WHERE id = 1", "transactionid")
    c = clients.block("UPDATE r SET v = v + 1 WHERE id = 1", "tuple")
    sample = sample_with(sampler, lambda s: {b, c} <= {w.pid for w in s.waiters},
                         f"B ({b}) and C ({c}) waiting")  # fmt: skip
    on_xact, on_tuple = waiter(sample, b), waiter(sample, c)
    assert on_xact.target.locktype == "transactionid"
    assert on_xact.target.transactionid == xid
    assert on_xact.target.label() == f"transaction {xid}"
    assert on_xact.mode == "ShareLock" and on_xact.blocking_pids == (a,)
    assert sample.xact_owners[xid] == a
    assert on_tuple.target.locktype == "tuple"
    assert on_tuple.target.label() == f"public.r (block {block}, row {row})"
    assert b in on_tuple.blocking_pids
    assert any(h.pid == b and h.target == on_tuple.target for h in sample.holders)
    trees = blocking_tree(sample)
    assert [t.pid for t in trees] == [a] and sorted(trees[0].pids()) == sorted([a, b, c])
    assert sample.sessions[a].state == "idle in transaction"


# -- once --------------------------------------------------------------------------------------


def statement_calls(pg: PgCluster) -> tuple[int, int]:
    """pg_stat_statements' calls of statements that read pg_locks, and of the others that
    read pg_stat_activity (the probe): the server's own count of what the sampler ran.
    The patterns are parameters, so this query's own text never matches them."""
    query = (b"SELECT coalesce(sum(calls) FILTER (WHERE query LIKE %s), 0),"
             b" coalesce(sum(calls) FILTER (WHERE query NOT LIKE %s AND query LIKE %s), 0)"
             b" FROM pg_stat_statements")  # fmt: skip
    with pg.connect() as conn:
        row = conn.execute(query, ("%pg_locks%", "%pg_locks%", "%pg_stat_activity%")).fetchone()
    assert row is not None
    return int(str(row[0])), int(str(row[1]))


@pytest.mark.once
def test_no_waits_no_pg_locks(pg: PgCluster, clients: Clients) -> None:
    pg.sql("SELECT pg_stat_statements_reset()")
    quiet = LockSampler(pg.conninfo, interval=0.1)
    quiet.start()
    poll(lambda: len(quiet.samples) >= 5, f"5 samples: {quiet.error}")
    quiet.stop()
    assert quiet.error is None and not any(s.waiters for s in quiet.samples)
    # one cheap statement per sample, pg_locks never read
    assert statement_calls(pg) == (0, len(quiet.samples))

    fresh_table(pg, "t")
    a = clients.hold("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
    b = clients.block("SELECT count(*) FROM t", "relation")
    pg.sql("SELECT pg_stat_statements_reset()")
    busy = LockSampler(pg.conninfo, interval=0.1)
    busy.start()
    poll(lambda: sum(1 for s in busy.samples if s.waiters) >= 3, f"3 samples: {busy.error}")
    busy.stop()
    assert all(waiter(s, b).blocking_pids == (a,) for s in busy.samples)
    # B waited throughout: each sample read pg_locks, once
    assert statement_calls(pg) == (len(busy.samples), len(busy.samples))


@pytest.mark.once
def test_a_costly_sample_spaces_the_next_ones_out(pg: PgCluster, clients: Clients) -> None:
    """With 20,000 locks in the table each read of pg_locks takes tens of ms: asked for a
    sample every 0.1 s, the sampler waits its sample's time / MAX_DUTY before the next, so
    that its pg_locks statements take at most MAX_DUTY of the time (their time by the
    server's own count, pg_stat_statements; every 0.1 s they would take a fifth or more)."""
    clients.hold(f"SELECT count(pg_advisory_xact_lock(g)) FROM generate_series(1, {LARGE_TABLE}) g")
    clients.block("SELECT pg_advisory_lock(1)", "advisory")
    pg.sql("SELECT pg_stat_statements_reset()")
    costly = LockSampler(pg.conninfo, interval=0.1)
    started = time.monotonic()
    costly.start()
    time.sleep(4)
    costly.stop()
    elapsed = time.monotonic() - started
    query = (b"SELECT coalesce(sum(calls), 0), coalesce(sum(total_exec_time), 0)"
             b" FROM pg_stat_statements WHERE query LIKE %s")  # fmt: skip
    with pg.connect() as conn:
        row = conn.execute(query, ("%pg_locks%",)).fetchone()
    assert row is not None and costly.error is None, costly.error
    calls, spent_s = int(str(row[0])), float(str(row[1])) / 1000
    print(f"{calls} reads of pg_locks, {spent_s * 1000:.1f} ms in {elapsed:.2f} s")
    assert calls >= 1 and spent_s / calls > 0.005, (calls, spent_s)  # costly indeed
    # the last read's own time is not followed by its pause within the elapsed time
    assert spent_s <= MAX_DUTY * elapsed + spent_s / calls, (calls, spent_s, elapsed)


@pytest.mark.once
def test_server_stopped_mid_capture(pg_build: PgBuild) -> None:
    with cluster_for(pg_build, name="pgprobe-lock-sampler-stop") as pg:
        fresh_table(pg, "t")
        clients = Clients(pg)
        try:
            a = clients.hold("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            b = clients.block("SELECT count(*) FROM t", "relation")
            running = LockSampler(pg.conninfo, interval=0.1)
            running.start()
            sample_with(running, lambda s: any(w.pid == b for w in s.waiters), "B waiting")
            before = list(running.samples)
            pg.stop()
            running.join(timeout=30)
            assert not running.is_alive()
        finally:
            for conn in clients.holders:
                conn.close()
            for conn, thread in clients.waiters:
                thread.join(timeout=30)
                conn.close()
    assert running.error is not None and "\n" not in running.error
    assert running.error.startswith("locks: pg_locks sampling stopped after"), running.error
    assert running.samples[: len(before)] == before
    assert any(waiter(s, b).blocking_pids == (a,) for s in before if s.waiters)
    doc = json.loads(json.dumps(running.document()))
    assert doc["error"] == running.error and len(doc["samples"]) == len(running.samples)


# -- pure --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "label"),
    [
        (LockTarget("relation", 5, 16384, relname="public.t"), "public.t"),
        (LockTarget("relation", 7, 16384, local=False, datname="app"),
         "relation 16384 in database 7 (app)"),
        (LockTarget("extend", 5, 16384, relname="public.t"), "public.t (extension)"),
        (LockTarget("page", 5, 16384, page=2, relname="public.t"), "public.t (block 2)"),
        (LockTarget("tuple", 5, 16384, page=0, tuple=3, relname="public.t"),
         "public.t (block 0, row 3)"),
        (LockTarget("frozenid", 5), "frozen ids of database 5"),
        (LockTarget("transactionid", transactionid=1234), "transaction 1234"),
        (LockTarget("virtualxid", virtualxid="3/12"), "virtual transaction 3/12"),
        (LockTarget("spectoken", transactionid=900, objid=4),
         "speculative insertion 4 of transaction 900"),
        (LockTarget("object", 0, classid=1262, objid=5, objsubid=0, catalog="pg_database"),
         "pg_database 5"),
        (LockTarget("advisory", 5, classid=0, objid=42, objsubid=1), "advisory lock 42"),
        (LockTarget("advisory", 5, classid=0xFFFFFFFF, objid=0xFFFFFFFF, objsubid=1),
         "advisory lock -1"),
        (LockTarget("advisory", 5, classid=1, objid=0xFFFFFFFE, objsubid=2),
         "advisory lock (1, -2)"),
        (LockTarget("applytransaction", 5, classid=16400, transactionid=77, objsubid=0),
         "remote transaction 77 of subscription 16400"),
    ],
)  # fmt: skip
def test_labels(target: LockTarget, label: str) -> None:
    assert target.label() == label


def waits(pid: int, *blockers: int) -> Waiter:
    return Waiter(pid, LockTarget("relation", 5, 1), "AccessShareLock", blockers, 1.0, "waitstart")


def test_tree_of_a_queue_places_each_waiter_once_nearest_the_root() -> None:
    # ALTERs queued behind A each conflict with every one ahead (20: 2**20 paths)
    queue = [waits(100 + i, 1, *range(100, 100 + i)) for i in range(20)]
    [tree] = blocking_tree(Sample(0.0, tuple(queue)))
    assert tree.pid == 1 and tree.waiter is None
    assert sorted(n.pid for n in tree.behind) == list(range(100, 120))
    assert sorted(tree.pids()) == [1, *range(100, 120)]


def test_trees_largest_first_and_cycles_rooted_at_their_lowest_pid() -> None:
    sample = Sample(0.0, (waits(11, 10), waits(21, 20), waits(22, 21), waits(23, 21),
                          waits(31, 32), waits(32, 31), waits(33, 32)))  # fmt: skip
    trees = blocking_tree(sample)
    assert [(t.pid, sorted(t.pids())) for t in trees] == [
        (20, [20, 21, 22, 23]), (31, [31, 32, 33]), (10, [10, 11])]  # fmt: skip
    assert trees[1].waiter is not None  # a cycle's root waits too


def test_a_window_tree_lists_each_waiter_right_under_the_pid_it_waited_behind() -> None:
    # two branches under root 1: 10 <- 12 and 11 <- 13; 14 behind a pid of no row (its own
    # samples put that one in another tree) and a loop 15 <-> 16: under the root
    tree = Tree(1, None, behind={10: 1, 11: 1, 12: 10, 13: 11, 14: 99, 15: 16, 16: 15})
    assert tree.depth_first() == [(1, 0), (10, 1), (12, 2), (11, 1), (13, 2), (14, 1),
                                  (15, 1), (16, 1)]  # fmt: skip
