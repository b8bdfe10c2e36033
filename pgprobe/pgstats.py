"""What PostgreSQL's own views say over a capture window (read-only SQL).

Long because the SQL cross-checks are kept in one module with the other SQL (see below).

Two kinds of evidence, both independent of the kernel probes:
- deltas of cumulative views (pg_stat_database, pg_stat_bgwriter or
  pg_stat_checkpointer, pg_stat_wal, pg_stat_slru, pg_stat_statements), read at
  the start and at the end of the window;
- pg_stat_activity sampled every second: how many backends were active and what
  they waited on (a wait-event profile, like pg_wait_sampling), with idle and
  client waits left out since they are not the server's time;
- pg_stat_slru over exactly one probe window (SlruStats, clog-reads' cross-check).

About 440 lines, over the ~400 of issue 12 on purpose: the SQL cross-checks live
together, once; SlruStats' long docstring says what its window can promise.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pgprobe import discover
from pgprobe.errors import PgprobeError

# Wait event types that are not server work: a backend waiting for its client or
# idling in its main loop (Activity) says nothing about the server's trouble.
IDLE_WAIT_TYPES = ("Client", "Activity")

DATABASE_COLUMNS = (
    "xact_commit", "xact_rollback", "blks_read", "blks_hit", "tup_returned", "tup_fetched",
    "tup_inserted", "tup_updated", "tup_deleted", "temp_files", "temp_bytes", "deadlocks",
    "conflicts",
)  # fmt: skip
STATEMENTS_TOP = 10

# pg_stat_slru names: PostgreSQL 17 renamed them; both map to the directory names.
SLRU_DIRS = {
    "Xact": "pg_xact", "transaction": "pg_xact",
    "Subtrans": "pg_subtrans", "subtransaction": "pg_subtrans",
    "MultiXactOffset": "pg_multixact/offsets", "multixact_offset": "pg_multixact/offsets",
    "MultiXactMember": "pg_multixact/members", "multixact_member": "pg_multixact/members",
    "CommitTs": "pg_commit_ts", "commit_timestamp": "pg_commit_ts",
    "Serial": "pg_serial", "serializable": "pg_serial",
    "Notify": "pg_notify", "notify": "pg_notify",
    "other": "other",
}  # fmt: skip


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
        cur.execute(
            "SELECT userid, dbid, queryid, query, calls, total_exec_time, rows,"
            " shared_blks_read FROM pg_stat_statements"
        )
    except Exception:  # the view exists but the library is not preloaded
        cur.connection.rollback()
        return None
    return {
        (u, d, q): {
            "query": text,
            "calls": int(calls),
            "total_ms": float(total),
            "rows": int(rows),
            "shared_blks_read": int(blks),
        }
        for u, d, q, text, calls, total, rows, blks in cur.fetchall()
    }


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
                "query": now["query"],
                "calls": calls,
                "total_ms": round(total, 3),
                "mean_ms": round(total / calls, 3),
                "rows": now["rows"] - then["rows"],
                "shared_blks_read": now["shared_blks_read"] - then["shared_blks_read"],
            }
        )
    rows.sort(key=lambda r: -float(r["total_ms"]))
    return rows[:STATEMENTS_TOP]


ACTIVITY_SQL = """
SELECT coalesce(wait_event_type, ''), coalesce(wait_event, ''), state
  FROM pg_stat_activity
 WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
"""


class ActivitySampler(threading.Thread):
    """pg_stat_activity every `interval` seconds until stopped, on its own connection.

    With keep_counters, the cumulative counters are read at each sample too: if
    the server goes away (stopped, crashed, restarted), the last good reading
    still closes a window, cut at that moment (lost_at says when it went away).
    """

    def __init__(self, conninfo: str, interval: float = 1.0, keep_counters: bool = False) -> None:
        super().__init__(name="pg_stat_activity sampler", daemon=True)
        self.conninfo = conninfo
        self.interval = interval
        self.keep_counters = keep_counters
        self.samples: list[dict[str, Any]] = []
        self.error: str | None = None
        self.last_counters: Counters | None = None
        self.lost_at: float | None = None  # time.monotonic() when the session failed
        self._done = threading.Event()
        self._start = time.monotonic()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)

    def run(self) -> None:
        try:
            with discover.connect_conninfo(self.conninfo) as conn, conn.cursor() as cur:
                self._start = time.monotonic()
                while not self._done.is_set():
                    cur.execute(ACTIVITY_SQL)
                    self.samples.append(self._sample(cur.fetchall()))
                    if self.keep_counters:
                        self.last_counters = read_counters(conn)
                    self._done.wait(self.interval)
        except Exception as exc:  # the server may go away mid-capture: say so, keep the rest
            self.lost_at = time.monotonic()
            text = exc.message if isinstance(exc, PgprobeError) else first_line(exc)
            self.error = (
                f"activity: pg_stat_activity sampling stopped after "
                f"{self.lost_at - self._start:.1f} s: {text}"
            )

    def _sample(self, rows: list[tuple[str, str, str]]) -> dict[str, Any]:
        waits: Counter[str] = Counter()
        active = 0
        for wait_type, wait_event, state in rows:
            if state != "active":
                continue
            active += 1
            if wait_type in IDLE_WAIT_TYPES:
                continue
            waits[f"{wait_type}:{wait_event}" if wait_type else "CPU"] += 1
        return {
            "t": round(time.monotonic() - self._start, 3),
            "active": active,
            "total": len(rows),
            "waits": dict(waits),
        }

    def document(self) -> dict[str, Any]:
        """The `activity` section: the samples and the wait profile over them."""
        totals: Counter[str] = Counter()
        for sample in self.samples:
            totals.update(sample["waits"])
        all_waits = sum(totals.values())
        profile = []
        for name, count in totals.most_common():
            wait_type, _, event = name.partition(":")
            profile.append(
                {
                    "wait_event_type": wait_type,
                    "wait_event": event,
                    "samples": count,
                    "pct": round(100 * count / all_waits, 2) if all_waits else 0.0,
                }
            )
        doc: dict[str, Any] = {
            "interval_s": self.interval,
            "samples": self.samples,
            "wait_profile": profile,
        }
        if self.lost_at is not None:
            doc["cut_at_s"] = round(self.lost_at - self._start, 3)
        return doc


def first_line(exc: BaseException) -> str:
    """A psycopg error in one line (libpq's messages span several)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines[:2]) if lines else type(exc).__name__


# -- pg_stat_slru over one probe window (clog-reads) ---------------------------------------

SLRU_COLUMNS = (
    "blks_zeroed",
    "blks_hit",
    "blks_read",
    "blks_written",
    "blks_exists",
    "flushes",
    "truncates",
)
SLRU_SQL = f"SELECT name, {', '.join(SLRU_COLUMNS)} FROM pg_stat_slru"


@dataclass
class SlruStats:
    """pg_stat_slru read through pgprobe's read-only session, before and after the capture.

    What the cross-check can promise: pg_stat_slru counts a blks_read in
    SimpleLruReadPage just before the physical read the probe sees (one open,
    one pread of BLCKSZ, one close), and a blks_hit for a page found in the
    SLRU buffers (no I/O). So the probe's reads of an SLRU equal its
    blks_read delta exactly over a window whose edges no unflushed count
    crosses (failed opens aside: pg_stat_slru counts them as reads, the
    probe as open errors).

    What it cannot: the counters are cluster-wide (a --pid capture sees only
    some of the backends that add to them), and they are not live. A backend
    keeps its counts in local memory and adds them to the shared stats when
    it flushes: on PostgreSQL 15+ when it goes idle outside a transaction
    block, at most once a second (PGSTAT_MIN_INTERVAL), never in the middle
    of a long query or transaction, and a backend that goes idle less than a
    second after its last flush keeps its counts until its idle timeout
    (PGSTAT_IDLE_INTERVAL, 10 s) or its next transaction a second later; on
    13-14 it sends them to the statistics collector at most every 500 ms,
    and readers see the collector's file. pg_stat_force_next_flush() acts on the calling
    session only, so pgprobe cannot make the other backends flush.

    One window: with bpftrace, pgprobe reads "before" when "@@live" arrives
    (every probe attached), then sends bpftrace signal 0, from which the
    script counts; it reads "after", then sends the SIGINT at which the script
    stops counting (bpftrace 0.17 stops its syscall tracepoints on SIGINT and
    runs END a second or more later under load: ending at END lost 11-18 %
    of the reads). Both windows agree within the milliseconds a query takes.
    With DTrace (and triage), "before" at "@@live" and "after" at END's first line.
    What remains is PostgreSQL's own lag: reads made shortly before the
    window and flushed inside it are in the delta but not traced, reads near
    its end not flushed yet are traced but not in the delta; on a steady
    load these nearly cancel out, and on a quiet window (every backend that
    read had flushed its counts before the end, and had nothing pending at
    the start) the two agree exactly. Waiting for the counts to settle after
    the capture was tried and dropped: it lets every read made during the
    wait into the delta without tracing it, a bias that does not cancel.
    """

    conn: Any = None
    pid: int | None = None  # the session's backend: not a target
    unavailable: str | None = None
    before: dict[str, dict[str, Any]] | None = None
    before_at: float = 0.0
    last: dict[str, dict[str, Any]] | None = None
    window_s: float = 0.0

    @classmethod
    def open(cls, cluster: discover.Cluster) -> SlruStats:
        if cluster.version_num and cluster.major < 13:
            return cls(
                unavailable=f"PostgreSQL {cluster.version.split()[0]} has no pg_stat_slru "
                "(13 and later): the cross-check is unavailable; tracing anyway"
            )
        if cluster.conninfo is None:
            return cls(
                unavailable="no connection to PostgreSQL (targets found from /proc): "
                "the pg_stat_slru cross-check is unavailable"
            )
        stats = cls()
        try:
            stats.conn = discover.connect_conninfo(cluster.conninfo)
            stats.pid = int(stats.conn.info.backend_pid)
            stats._query()  # warms the session's caches before the window
        except Exception as exc:  # noqa: BLE001 - one line, and tracing goes on
            stats._give_up(exc)
        return stats

    def _give_up(self, exc: BaseException) -> None:
        text = exc.message if isinstance(exc, PgprobeError) else str(exc).splitlines()[0]
        self.unavailable = f"cannot read pg_stat_slru ({text}): the cross-check is unavailable"
        self.close()

    def _query(self) -> dict[str, dict[str, Any]]:
        with self.conn.cursor() as cur:
            cur.execute(SLRU_SQL)
            rows = cur.fetchall()
        out: dict[str, dict[str, Any]] = {}
        for name, *values in rows:
            slru = SLRU_DIRS.get(str(name), str(name))
            out[slru] = {
                "name": str(name),
                **{c: int(v) for c, v in zip(SLRU_COLUMNS, values, strict=True)},
            }
        return out

    def read(self) -> dict[str, dict[str, Any]] | None:
        if self.conn is None:
            return None
        try:
            return self._query()
        except Exception as exc:  # noqa: BLE001
            self._give_up(exc)
            return None

    def start(self) -> None:
        """The window's start: read right after the probes attached."""
        self.before = self.read()
        self.before_at = time.monotonic()
        self.last = self.before

    def delta(self) -> dict[str, dict[str, Any]] | None:
        """The deltas since the last read (the window's start, or the previous interval)."""
        if self.last is None:
            if self.conn is not None and self.unavailable is None:
                self.unavailable = "the capture ended before pg_stat_slru was first read"
            return None
        now = self.read()
        if now is None:
            return None
        out: dict[str, dict[str, Any]] = {}
        for slru, row in now.items():
            old = self.last.get(slru, {})
            d = {c: row[c] - int(old.get(c, 0)) for c in SLRU_COLUMNS}
            accesses = d["blks_hit"] + d["blks_read"]
            out[slru] = {
                "name": row["name"],
                **d,
                "hit_ratio_pct": round(100 * d["blks_hit"] / accesses, 2) if accesses else None,
            }
        self.window_s = time.monotonic() - self.before_at
        self.before_at = time.monotonic()
        self.last = now
        return out

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None
