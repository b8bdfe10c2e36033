"""Heavyweight lock waits sampled by SQL: who waits on which lock, in which mode, behind whom.
Kept in one module (~420 lines, ~90 of them SQL): the statement, the records it is parsed
into and the trees built from them change together, field by field.

`LockSampler` samples, every `interval` seconds on its own read-only session, the waiters
(pg_locks rows not granted, each with pg_blocking_pids), the blockers' granted rows on the
same lock objects (the holders; a transactionid's holder in ExclusiveLock is its owner), and
pg_stat_activity for every pid involved. `blocking_tree` turns a sample into trees, root
blockers first. The exact seconds per lock come from the kernel side (bpf/); `pgprobe
locks` joins the two.

The cost rule: pg_lock_status copies the whole lock table under all 16 lock-partition
LWLocks, and each pg_blocking_pids call takes ProcArrayLock and the 16 partitions again:
meanwhile no backend takes or releases a lock outside the fast path (with 20,000 locks, a
pg_locks read took ~30 ms here, a pg_blocking_pids call ~1 ms). So a sample first asks
pg_stat_activity (read without any lock-manager LWLock) whether any backend is in a Lock
wait; only then does one statement read pg_locks once and call pg_blocking_pids for at
most `max_waiters` waiters (the rest counted in `more_waiters`), and a sample that took
long spaces the next ones out (MAX_DUTY). At most two statements per sample; no writes;
no user text in SQL.

`Waiter.waited_s` is by the server's clock, from pg_locks.waitstart, or, in the moment
after the wait began when waitstart is not set yet, from pg_stat_activity.state_change
(the statement's start: longer than the wait); `waited_from` says which. PostgreSQL 14
and later (waitstart, query_id).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pgprobe import discover
from pgprobe.errors import PgprobeError
from pgprobe.pgstats.activity import first_line

# At most this share of the time in pgprobe's sampling statements: a sample that took 70 ms
# (20,000 locks, 30 waiters) waits 3.5 s for the next one, not 0.5 s (the lock table is
# held while it is copied: backends cannot take a lock meanwhile).
MAX_DUTY = 0.02

# pg_stat_activity only: the backend status array is read without any lock-manager LWLock.
PROBE_SQL = """
SELECT count(*) FROM pg_stat_activity
 WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()
"""


def _target_json(x: str) -> str:
    """A pg_locks row's lock object as JSON. Names are resolved only where they can be:
    pg_class is per database, so a relation of another database keeps its OID."""
    here = f"{x}.database IN (0, (SELECT oid FROM here))"
    return f"""json_build_object(
        'locktype', {x}.locktype, 'database', {x}.database::bigint,
        'relation', {x}.relation::bigint, 'page', {x}.page, 'tuple', {x}.tuple,
        'virtualxid', {x}.virtualxid, 'transactionid', {x}.transactionid::text::bigint,
        'classid', {x}.classid::bigint, 'objid', {x}.objid::bigint, 'objsubid', {x}.objsubid,
        'local', coalesce({here}, true),
        'relname', CASE WHEN {here} THEN (
            SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname)
              FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE c.oid = {x}.relation) END,
        'catalog', CASE WHEN {x}.locktype = 'object' THEN {x}.classid::regclass::text END,
        'datname', (SELECT datname FROM pg_database WHERE oid = {x}.database))"""


LOCKS_SQL = f"""
WITH locks AS MATERIALIZED (  -- the lock table read once
    SELECT * FROM pg_locks WHERE mode <> 'SIReadLock'  -- predicate locks never block
),
waiting AS MATERIALIZED (
    SELECT * FROM locks WHERE NOT granted AND pid IS NOT NULL
     ORDER BY waitstart NULLS LAST, pid LIMIT %(max_waiters)s
),
blocked AS MATERIALIZED (
    SELECT pid, pg_blocking_pids(pid) AS blockers FROM waiting
),
waited AS MATERIALIZED (
    SELECT DISTINCT locktype, database, relation, page, tuple, virtualxid, transactionid,
           classid, objid, objsubid FROM waiting
),
-- the blockers' granted rows (and prepared transactions', pid NULL), by pid first: the
-- lock objects cannot be hash-joined (NULLs), so only these few rows are compared
candidates AS MATERIALIZED (
    SELECT * FROM locks
     WHERE granted AND (pid IS NULL OR pid IN (SELECT unnest(blockers) FROM blocked))
),
holding AS MATERIALIZED (
    SELECT * FROM candidates c WHERE EXISTS (
        SELECT FROM waited w
         WHERE (c.locktype, c.database, c.relation, c.page, c.tuple, c.virtualxid,
                c.transactionid, c.classid, c.objid, c.objsubid)
               IS NOT DISTINCT FROM (w.locktype, w.database, w.relation, w.page, w.tuple,
                w.virtualxid, w.transactionid, w.classid, w.objid, w.objsubid))
),
involved AS (
    SELECT pid FROM waiting
    UNION SELECT pid FROM holding WHERE pid IS NOT NULL
    UNION SELECT unnest(blockers) FROM blocked
),
here AS (SELECT oid FROM pg_database WHERE datname = current_database())
SELECT
  (SELECT count(*) FROM locks WHERE NOT granted AND pid IS NOT NULL)
    - (SELECT count(*) FROM waiting),
  (SELECT json_agg(json_build_object(
       'pid', w.pid, 'mode', w.mode, 'target', {_target_json("w")}, 'blockers', b.blockers,
       'waited_s', extract(epoch FROM clock_timestamp()
                                      - coalesce(w.waitstart, a.state_change))::float8,
       'waited_from', CASE WHEN w.waitstart IS NULL THEN 'state_change' ELSE 'waitstart' END))
     FROM waiting w JOIN blocked b USING (pid) LEFT JOIN pg_stat_activity a USING (pid)),
  (SELECT json_agg(json_build_object(
       'pid', h.pid, 'mode', h.mode, 'target', {_target_json("h")}))
     FROM holding h),
  (SELECT json_agg(json_build_object(
       'pid', a.pid, 'leader_pid', a.leader_pid, 'state', a.state,
       'backend_type', a.backend_type, 'application_name', a.application_name,
       'client_addr', host(a.client_addr), 'usename', a.usename, 'datname', a.datname,
       -- clock_timestamp: now() is the sampler's own statement start, not the present
       'xact_age_s', extract(epoch FROM clock_timestamp() - a.xact_start)::float8,
       'state_age_s', extract(epoch FROM clock_timestamp() - a.state_change)::float8,
       'query', a.query, 'query_id', a.query_id,
       'wait_event_type', a.wait_event_type, 'wait_event', a.wait_event))
     FROM pg_stat_activity a WHERE a.pid IN (SELECT pid FROM involved))
"""


@dataclass(frozen=True)
class LockTarget:
    """A heavyweight lock object, as pg_locks gives its fields (None where they do not apply).

    Equal targets are the same lock; the resolved names do not take part."""

    locktype: str
    database: int | None = None
    relation: int | None = None
    page: int | None = None
    tuple: int | None = None
    transactionid: int | None = None
    virtualxid: str | None = None
    classid: int | None = None
    objid: int | None = None
    objsubid: int | None = None
    # the session's database, a shared object, or no database at all
    local: bool = field(default=True, compare=False)
    relname: str | None = field(default=None, compare=False)  # schema.table
    catalog: str | None = field(default=None, compare=False)  # an object lock's catalog
    datname: str | None = field(default=None, compare=False)

    def label(self) -> str:
        """The lock named for a DBA: "public.t", "public.t (block 0, row 3)", "transaction 1234"."""
        kind, named = self.locktype, f" ({self.datname})" if self.datname else ""
        database = f"database {self.database}{named}"
        rel = self.relname or f"relation {self.relation} in {database}"
        elsewhere = "" if self.local else f" in {database}"
        sub = f".{self.objsubid}" if self.objsubid else ""
        xact = f"transaction {self.transactionid}"
        return {
            "relation": rel,
            "extend": f"{rel} (extension)",
            "page": f"{rel} (block {self.page})",
            "tuple": f"{rel} (block {self.page}, row {self.tuple})",
            "frozenid": f"frozen ids of {database}",
            "transactionid": xact,
            "virtualxid": f"virtual transaction {self.virtualxid}",
            "spectoken": f"speculative insertion {self.objid} of {xact}",
            "object": f"{self.catalog or f'class {self.classid}'} {self.objid}{sub}{elsewhere}",
            "advisory": f"advisory lock {self._advisory_key()}{elsewhere}",
            "applytransaction": f"remote {xact} of subscription {self.classid}",
        }.get(kind, f"{kind} lock [{self.classid}, {self.objid}, {self.objsubid}]{elsewhere}")

    def _advisory_key(self) -> str:
        # objsubid 1: one bigint key split in two oids; 2: two int4 keys (signed)
        high, low = self.classid or 0, self.objid or 0
        if self.objsubid == 1:
            key = (high << 32) | low
            return str(key - (1 << 64) if key >= 1 << 63 else key)
        signed = [v - (1 << 32) if v >= 1 << 31 else v for v in (high, low)]
        return f"({signed[0]}, {signed[1]})"


@dataclass(frozen=True)
class Waiter:
    """A backend queued on a lock: what it wants, and who is ahead of it."""

    pid: int
    target: LockTarget
    mode: str  # wanted: AccessShareLock ... AccessExclusiveLock
    # pg_blocking_pids, duplicates dropped: holders in a conflicting mode and waiters queued
    # ahead in one (soft blockers); a parallel group's leader pid; 0 is a prepared transaction
    blocking_pids: tuple[int, ...]
    waited_s: float | None  # by the server's clock, at the sample
    waited_from: str  # "waitstart" (pg_locks) or "state_change" (pg_stat_activity)


@dataclass(frozen=True)
class Holder:
    """A blocker's granted lock on an object that someone waits on (holders that block no
    one are left out); pid None: a prepared transaction."""

    pid: int | None
    target: LockTarget
    mode: str


@dataclass(frozen=True)
class Session:
    """pg_stat_activity of one pid involved in a wait (waiter, holder or queued ahead)."""

    pid: int
    leader_pid: int | None
    state: str | None  # "idle in transaction", "active", ...
    backend_type: str | None
    application_name: str | None
    client_addr: str | None
    usename: str | None
    datname: str | None
    xact_age_s: float | None  # clock_timestamp() - xact_start
    state_age_s: float | None  # in this state for that long
    query: str | None
    query_id: int | None  # None unless compute_query_id
    wait_event_type: str | None
    wait_event: str | None


@dataclass(frozen=True)
class Sample:
    """One sample: empty when nobody was in a Lock wait (pg_locks was not read)."""

    t: float  # seconds since the sampler's start (monotonic), when the sample began
    waiters: tuple[Waiter, ...] = ()
    holders: tuple[Holder, ...] = ()
    sessions: Mapping[int, Session] = field(default_factory=dict)
    # transactionid -> the pid holding its ExclusiveLock (None: a prepared transaction)
    xact_owners: Mapping[int, int | None] = field(default_factory=dict)
    more_waiters: int = 0  # waiters past max_waiters, not read


@dataclass(frozen=True)
class BlockingNode:
    """A pid in a blocking tree and the waiters behind it (waiting on it directly)."""

    pid: int
    waiter: Waiter | None  # what this pid waits on; None for a root that waits on nothing
    behind: tuple[BlockingNode, ...] = ()

    def edges(self) -> list[tuple[int, int]]:
        """(pid, the pid it waits behind) for every pid in the tree, parents first."""
        out: list[tuple[int, int]] = []
        stack = [self]
        while stack:
            node = stack.pop()
            out.extend((n.pid, node.pid) for n in node.behind)
            stack.extend(reversed(node.behind))
        return out

    def pids(self) -> list[int]:
        """This pid and every pid behind it."""
        return [self.pid, *(pid for pid, _ in self.edges())]


def blocking_tree(sample: Sample) -> list[BlockingNode]:
    """The sample's blocking trees, the largest first: each root blocker (a blocker that
    waits on nothing) with every waiter behind it, transitively, from pg_blocking_pids.

    Each waiter is placed once per tree, under the blocker nearest the root (a queue of
    AccessExclusiveLock waiters each blocked by all ahead would otherwise repeat
    exponentially); a waiter blocked from two roots is in both trees. A cycle (a deadlock
    until the detector breaks it) has no such root: it is rooted at its lowest pid."""
    waiting = {w.pid: w for w in sample.waiters}
    behind: dict[int, list[int]] = {}
    for w in sample.waiters:
        for blocker in w.blocking_pids:
            behind.setdefault(blocker, []).append(w.pid)
    blocked = {w.pid for w in sample.waiters if w.blocking_pids}
    trees = [_grow(root, behind, waiting) for root in sorted(set(behind) - blocked)]
    reached = {pid for tree in trees for pid in tree.pids()}
    for start in sorted(blocked - reached):
        if start in reached:
            continue
        # every blocker of an unreached waiter is an unreached waiter: the walk must loop
        path: list[int] = []
        pid: int | None = start
        while pid is not None and pid not in path:
            path.append(pid)
            pid = next((b for b in waiting[pid].blocking_pids if b in waiting), None)
        tree = _grow(min(path[path.index(pid) :]) if pid is not None else start, behind, waiting)
        trees.append(tree)
        reached.update(tree.pids())
    return sorted(trees, key=lambda tree: (-len(tree.pids()), tree.pid))


def _grow(root: int, behind: dict[int, list[int]], waiting: dict[int, Waiter]) -> BlockingNode:
    # breadth first, so that each waiter hangs under its blocker nearest the root; the
    # nodes are built leaves first (no recursion: a chain can be thousands long)
    order, parent_of, seen = [root], {}, {root}
    queue = deque([root])
    while queue:
        pid = queue.popleft()
        for waiter in sorted(behind.get(pid, ())):
            if waiter not in seen:
                seen.add(waiter)
                parent_of[waiter] = pid
                order.append(waiter)
                queue.append(waiter)
    children: dict[int, list[BlockingNode]] = {}
    for pid in reversed(order[1:]):
        node = BlockingNode(pid, waiting.get(pid), tuple(reversed(children.pop(pid, []))))
        children.setdefault(parent_of[pid], []).append(node)
    return BlockingNode(root, waiting.get(root), tuple(reversed(children.pop(root, []))))


class LockSampler(threading.Thread):
    """Lock waits every `interval` seconds until stopped, on its own connection."""

    def __init__(self, conninfo: str, interval: float = 0.5, max_waiters: int = 200) -> None:
        super().__init__(name="pg_locks sampler", daemon=True)
        self.conninfo = conninfo
        self.interval = interval
        self.max_waiters = max_waiters
        self.samples: list[Sample] = []
        self.error: str | None = None
        self.lost_at: float | None = None  # time.monotonic() when the session failed
        self.backend_pid = 0  # its session's backend, once connected (a tool leaves it out)
        self._done = threading.Event()
        self._start = time.monotonic()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=15)

    def run(self) -> None:
        try:
            with discover.connect_conninfo(self.conninfo) as conn, conn.cursor() as cur:
                self.backend_pid = int(conn.info.backend_pid)
                self._start = time.monotonic()
                while not self._done.is_set():
                    began = time.monotonic()
                    self.samples.append(self._sample(cur, began - self._start))
                    # a steady rate: the interval counts from the sample's start; a
                    # costly sample (a large lock table) spaces the next ones out
                    took = time.monotonic() - began
                    self._done.wait(max(self.interval, took / MAX_DUTY) - took)
        except Exception as exc:  # the server may go away mid-capture: say so, keep the rest
            self.lost_at = time.monotonic()
            text = exc.message if isinstance(exc, PgprobeError) else first_line(exc)
            self.error = (
                f"locks: pg_locks sampling stopped after {self.lost_at - self._start:.1f} s: {text}"
            )

    def _sample(self, cur: Any, t: float) -> Sample:
        cur.execute(PROBE_SQL)
        if not cur.fetchone()[0]:
            return Sample(round(t, 3))  # nobody waits: pg_locks left alone
        cur.execute(LOCKS_SQL, {"max_waiters": self.max_waiters})
        more, waiters, holders, sessions = cur.fetchone()
        return parse_sample(round(t, 3), waiters or [], holders or [], sessions or [], more)

    def document(self) -> dict[str, Any]:
        """The `locks` section: every sample with its waiters, holders, sessions and trees."""
        doc: dict[str, Any] = {
            "interval_s": self.interval,
            "max_waiters": self.max_waiters,
            "samples": [sample_document(s) for s in list(self.samples)],
        }
        if self.lost_at is not None:
            doc["cut_at_s"] = round(self.lost_at - self._start, 3)
            doc["error"] = self.error
        return doc


def parse_sample(
    t: float, waiters: list[Any], holders: list[Any], sessions: list[Any], more_waiters: int = 0
) -> Sample:
    """A Sample from LOCKS_SQL's JSON columns (lists of dicts)."""
    held = tuple(Holder(h["pid"], LockTarget(**h["target"]), h["mode"]) for h in holders)
    return Sample(
        t=t,
        waiters=tuple(
            Waiter(
                w["pid"],
                LockTarget(**w["target"]),
                w["mode"],
                tuple(dict.fromkeys(w["blockers"] or ())),
                w["waited_s"],
                w["waited_from"],
            )
            for w in waiters
        ),  # fmt: skip
        holders=held,
        sessions={s["pid"]: Session(**s) for s in sessions},
        xact_owners={
            h.target.transactionid: h.pid
            for h in held
            if h.target.transactionid is not None
            and (h.target.locktype, h.mode) == ("transactionid", "ExclusiveLock")
        },
        more_waiters=int(more_waiters),
    )


def sample_document(sample: Sample) -> dict[str, Any]:
    """A sample as plain JSON-serialisable dicts; each target with its label."""

    def target(t: LockTarget) -> dict[str, Any]:
        return {"label": t.label(), **{k: v for k, v in asdict(t).items() if v is not None}}

    return {
        "t": sample.t,
        "waiters": [
            {**asdict(w), "target": target(w.target), "blocking_pids": list(w.blocking_pids)}
            for w in sample.waiters
        ],
        "holders": [{**asdict(h), "target": target(h.target)} for h in sample.holders],
        "sessions": [asdict(s) for _, s in sorted(sample.sessions.items())],
        "xact_owners": [
            {"transactionid": xid, "pid": pid} for xid, pid in sorted(sample.xact_owners.items())
        ],
        "more_waiters": sample.more_waiters,
        # flat [pid, the pid it waits behind] pairs: a long chain nests no JSON
        "trees": [
            {"root": root.pid, "behind": [list(e) for e in root.edges()]}
            for root in blocking_tree(sample)
        ],
    }
