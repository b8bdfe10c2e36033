"""pg_stat_slru over exactly one probe window (SlruStats, clog-reads' cross-check).

SlruStats' docstring says what its window can promise.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from pgprobe import discover
from pgprobe.errors import PgprobeError

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
SLRU_ORDER_SQL = "SELECT name FROM pg_stat_get_slru() WITH ORDINALITY AS s ORDER BY s.ordinality"


def slru_order(conninfo: str | None) -> list[str] | None:
    """pg_stat_slru's SLRUs (directories) in row order: row N is slru_index N, as
    pgstat_count_slru_page_read(slru_index) gets it. None: not readable (no
    connection, before 13)."""
    if conninfo is None:
        return None
    try:
        with discover.connect_conninfo(conninfo) as conn, conn.cursor() as cur:
            cur.execute(SLRU_ORDER_SQL)
            return [SLRU_DIRS.get(str(n), str(n)) for (n,) in cur.fetchall()]
    except Exception:  # noqa: BLE001 - the caller says why it cannot use the order
        return None


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
