"""Workloads that make PostgreSQL read SLRU pages from disk, with known counts.

Kept in one, long because each workload sits beside the buffer arithmetic it
depends on; splitting them would separate a count from the reason it is exact.

For the integration tests of `pgprobe clog-reads` (bpf/clog_reads.bt): each
workload makes one backend miss the SLRU buffers of one SLRU, so that the reads
the probe counts for that backend can be compared with the blks_read delta of
pg_stat_slru over the same window. They must be equal, not close.

Why the counts are exact: SimpleLruReadPage() counts one blks_read
(pgstat_count_slru_page_read) and then calls SlruPhysicalReadPage(), which is
one open(<dir>/<segment>), one pread of BLCKSZ at the page's offset and one
close. Hits are counted as blks_hit and do no I/O. So, over a window where no
other process reads that SLRU and no open fails, bpftrace's reads == the
blks_read delta, and bytes == reads * BLCKSZ. On a quiet test cluster nothing
else reads pg_xact or pg_subtrans: the checkpointer and the bgwriter only write
and fsync SLRU pages, autovacuum must be off (it reads pg_xact when it checks
tuples), and parallel query must be off so the reads are all in the one
backend (max_parallel_workers_per_gather = 0).

The cluster must have few SLRU buffers, or nothing misses (CLUSTER_SETTINGS):
shared_buffers = 128kB gives 4 pg_xact buffers on PostgreSQL 13-16
(Min(128, Max(4, shared_buffers / 512 pages))) and 16 on 17+ (the minimum of
transaction_buffers); pg_subtrans has 32 buffers on 13-16 (fixed) and 16 on
17+. xact_buffers(conn) reads the number the server uses, xact_burn_size(conn)
says how many xids to burn for provoke_xact_reads.

The stats side: a backend keeps its SLRU counters in local memory and adds
them to shared stats when it flushes (pgstat_report_stat(), when it goes idle
outside a transaction block, before it sends ReadyForQuery, at most once a
second unless forced). slru_stats(conn) forces the flush of `conn`'s own
backend first (pg_stat_force_next_flush(), 15+), so call it on the workload's
connection, before and after the workload. Other backends' reads reach the
shared counters whenever they flush: keep them out of the window (the
subtrans_holder stays in its transaction block during the window, so its own
counters are only flushed after it rolls back). On 13-14 the counters go
through the statistics collector: slru_stats sends them and waits for a stats
file the collector wrote after that.

What the counts are: provoke_xact_reads makes exactly len(xids) pg_xact reads
(every lookup misses); provoke_subtrans_reads makes exactly 2 * rows * scans
pg_subtrans lookups (hits + reads) of which about scans * pages miss. Other
statements of the same backend may add a read or two inside the window (the
first look at a catalog row whose xmin is not hinted yet, e.g. the holder's
table the first time it is scanned): the probe sees those too, so compare the
probe with the pg_stat_slru delta, and the workload's own number only as a
lower bound.

Timing on a 2-core VM (PostgreSQL 15, 128kB shared_buffers): burn_xids of
229 376 xids (7 pg_xact pages) 0.6-1.4 s; provoke_xact_reads 1-8 ms (20 to
2000 lookups); subtrans_holder of 102 400 subxacts 0.2-0.5 s;
provoke_subtrans_reads 10-25 ms a scan.

Typical use (a test cluster with CLUSTER_SETTINGS, pg_xact_status needs
PostgreSQL 13+; the tracer runs on conn.info.backend_pid over the window):

    with psycopg.connect(conninfo, autocommit=True) as conn:
        first, last = burn_xids(conninfo, xact_burn_size(conn))
        with subtrans_holder(conninfo) as holder:
            # start bpftrace here, wait for it to attach
            before = slru_stats(conn)
            xids = provoke_xact_reads(conn, first, last)
            lookups = provoke_subtrans_reads(conn, holder)
            after = slru_stats(conn)
            # stop bpftrace here
        delta = slru_delta(before, after)  # {"pg_xact": (hits, reads), "pg_subtrans": ...}
        # probe reads of pg_xact/* by conn's pid == delta["pg_xact"][1] >= len(xids)
        # probe reads of pg_subtrans/* == delta[SUBTRANS][1]; sum(delta[SUBTRANS]) == lookups
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg

from pgprobe import pgversions
from pgprobe.pgstats import SLRU_DIRS

BLCKSZ = 8192
# pg_xact keeps 2 status bits per xid: 4 xids a byte, 32768 per 8 kB page.
XACT_PAGE_XIDS = BLCKSZ * 4
# pg_subtrans keeps the 4-byte parent xid of each xid: 2048 per page.
SUBTRANS_PAGE_XIDS = BLCKSZ // 4
# SLRUs by directory: slru_stats() keys pg_stat_slru's rows so on every version
# (17 renamed the rows: "Xact" became "transaction"; pgversions.slru_stat_name).
XACT = "pg_xact"
SUBTRANS = "pg_subtrans"


# postgresql.conf settings under which these workloads miss, and the cluster
# stays quiet enough for exact counts.
CLUSTER_SETTINGS = {
    "shared_buffers": "128kB",  # 4 pg_xact buffers before 17, 16 from 17 on
    "autovacuum": "off",  # autovacuum workers read pg_xact too
    "max_parallel_workers_per_gather": "0",  # every read in the one backend
}


@contextmanager
def _connection(
    conn_or_conninfo: psycopg.Connection[Any] | str,
) -> Iterator[psycopg.Connection[Any]]:
    """The connection given, or a new autocommit one for a conninfo string (closed after)."""
    if isinstance(conn_or_conninfo, str):
        with psycopg.connect(conn_or_conninfo, autocommit=True) as conn:
            yield conn
    else:
        yield conn_or_conninfo


def _scalar(conn: psycopg.Connection[Any], sql: str, params: Sequence[Any] = ()) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def current_xid(conn: psycopg.Connection[Any]) -> int:
    """xmax of a new snapshot (64-bit): the latest completed xid + 1.

    On a quiet cluster (nothing in progress) that is the next xid to be assigned.
    """
    return int(_scalar(conn, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))


def burn_xids(conn_or_conninfo: psycopg.Connection[Any] | str, n: int) -> tuple[int, int]:
    """Assign and commit n xids, one top-level transaction each; return (first, last).

    One DO block that assigns an xid (pg_current_xact_id()) and COMMITs n times:
    real top-level transactions, committed in pg_xact, about 250 000 a second
    with synchronous_commit off (set for the session, reset after),
    no table touched. It cannot run inside a transaction block, so a connection
    given must be in autocommit mode. first..last are full (64-bit) xids; on a
    quiet cluster they are exactly n consecutive xids, all committed, which
    fill (last - first + 1) / XACT_PAGE_XIDS pages of pg_xact.
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    with _connection(conn_or_conninfo) as conn:
        if not conn.autocommit:
            raise ValueError("burn_xids needs an autocommit connection (the DO block COMMITs)")
        conn.execute("SET synchronous_commit = off")
        first = current_xid(conn)
        conn.execute(
            f"""DO $burn$
            BEGIN
                FOR i IN 1..{int(n)} LOOP
                    PERFORM pg_current_xact_id();
                    COMMIT;
                END LOOP;
            END
            $burn$"""
        )
        last = current_xid(conn) - 1
        conn.execute("RESET synchronous_commit")
    return first, last


def _setting(conn: psycopg.Connection[Any], name: str) -> int:
    return int(_scalar(conn, "SELECT setting FROM pg_settings WHERE name = %s", (name,)))


def xact_buffers(conn: psycopg.Connection[Any]) -> int:
    """The number of pg_xact buffers of the server (CLOGShmemBuffers())."""
    if pgversions.has_transaction_buffers(conn.info.server_version):
        # transaction_buffers = 0 (auto) shows the value the server computed
        return _setting(conn, "transaction_buffers")
    nbuffers = _setting(conn, "shared_buffers")  # in 8 kB blocks
    return min(128, max(4, nbuffers // 512))


def xact_burn_size(conn: psycopg.Connection[Any]) -> int:
    """How many xids to burn so that provoke_xact_reads misses every time.

    The lookups cycle over more whole pages than there are pg_xact buffers,
    plus a partial page at each end (the latest page is never used): buffers
    + 3 pages. 229 376 xids at 4 buffers (13-16 at 128kB), 622 592 at 16 (17+).
    """
    return (xact_buffers(conn) + 3) * XACT_PAGE_XIDS


def xact_lookup_xids(first: int, last: int, next_xid: int, rounds: int = 4) -> list[int]:
    """The xids provoke_xact_reads looks up: one per pg_xact page, pages in turn.

    Only whole pages inside first..last are used, and never the page of
    next_xid (PostgreSQL keeps the latest page in its buffers, so a lookup
    there would hit). The pages are visited in ascending order, `rounds` times
    round; inside a page the xid moves on by one each round, so no lookup
    repeats an xid (the backend caches the status of the last xid it fetched).
    """
    first_page = -(-first // XACT_PAGE_XIDS)  # first whole page
    last_page = (last + 1) // XACT_PAGE_XIDS - 1  # last whole page
    last_page = min(last_page, next_xid // XACT_PAGE_XIDS - 1)
    pages = list(range(first_page, last_page + 1))
    xids = []
    for r in range(rounds):
        for page in pages:
            xids.append(page * XACT_PAGE_XIDS + 1000 + r)
    return xids


def provoke_xact_reads(
    conn: psycopg.Connection[Any], first: int, last: int, rounds: int = 4
) -> list[int]:
    """Look up the status of xids spread over the pg_xact pages of first..last.

    first..last: a range of committed xids, e.g. from burn_xids; it must hold
    more whole pages, before the latest one, than the server has pg_xact
    buffers (burn xact_burn_size(conn) xids). One statement, pg_xact_status()
    over xact_lookup_xids(): each lookup is the first use of an xid (no
    backend-local cache hit) on a page that is not among the last B used.
    With P pages cycled in turn through the B pg_xact buffers of the server,
    every lookup misses when P > B (the buffers are replaced least recently
    used first; from 17 within a bank of 16, the same here with 16 buffers;
    the latest page, never replaced, is not in the cycle), and a committed
    xid's status is exactly one lookup (TransactionIdDidCommit). So each
    lookup is one SLRU read: pg_xact's blks_read grows by len(returned list)
    in this statement, blks_hit by 0, and the probe sees as many reads of
    pg_xact/* by this backend, 8192 bytes each. Returns the xids looked up,
    in order. Raises ValueError when the range is too short.
    """
    next_xid = current_xid(conn)
    xids = xact_lookup_xids(first, last, next_xid, rounds)
    pages = len(xids) // rounds if rounds > 0 else 0
    need = xact_buffers(conn) + 1
    if pages < need:
        raise ValueError(
            f"xids {first}..{last} give {pages} whole pg_xact pages before the latest one, "
            f"need {need}: burn more xids (xact_burn_size(conn))"
        )
    rows = conn.execute(
        "SELECT x::text::bigint, pg_xact_status(x) FROM unnest(%s::text[]::xid8[]) AS x",
        ([str(x) for x in xids],),
    ).fetchall()
    bad = [(x, s) for x, s in rows if s != "committed"]
    if bad:
        raise RuntimeError(f"xids not committed (not from burn_xids?): {bad[:5]}")
    return xids


@dataclass(frozen=True)
class SubtransHolder:
    """An open transaction whose subtransactions inserted `rows` rows into `table`."""

    table: str
    top_xid: int
    first_subxid: int
    last_subxid: int
    rows: int
    backend_pid: int

    @property
    def pages(self) -> range:
        """The pg_subtrans pages of the subxids (2048 xids a page)."""
        return range(
            self.first_subxid // SUBTRANS_PAGE_XIDS, self.last_subxid // SUBTRANS_PAGE_XIDS + 1
        )


@contextmanager
def subtrans_holder(
    conninfo: str, n: int = 50 * SUBTRANS_PAGE_XIDS, table: str = "slru_workload_subtrans"
) -> Iterator[SubtransHolder]:
    """Keep open a transaction with n subtransactions that each inserted a row.

    Creates the unlogged table `table` (dropped first if it exists), then on a
    connection of its own: BEGIN, and a DO block inserting rows 1..n, each in
    its own subtransaction (a PL/pgSQL block with an EXCEPTION clause), so each
    row's xmin is a different subxid, in insert order, and pg_subtrans maps
    each to the top-level xid. Past 64 subxids the transaction's subxid cache
    in PGPROC overflows, so every snapshot other backends take while it is
    open is 'suboverflowed'. Then it commits one more xid on another
    connection: a snapshot's xmax is the latest completed xid + 1, and without
    a completed xid above the subxids every snapshot would call them in
    progress (>= xmax) without asking pg_subtrans.

    Yields a SubtransHolder while the transaction stays open; rolls back and
    drops the table on exit. About 0.3-0.5 s for n = 102 400 (50 pages of
    pg_subtrans) on a 2-core VM.
    """
    if n < 65:
        raise ValueError("n must be above 64 (PGPROC_MAX_CACHED_SUBXIDS) to overflow")
    with psycopg.connect(conninfo, autocommit=True) as holder:
        holder.execute(f"DROP TABLE IF EXISTS {table}")
        holder.execute(f"CREATE UNLOGGED TABLE {table} (i int) WITH (autovacuum_enabled = off)")
        try:
            holder.autocommit = False
            top = int(_scalar(holder, "SELECT pg_current_xact_id()::text::bigint"))
            holder.execute(
                f"""DO $sub$
                BEGIN
                    FOR i IN 1..{int(n)} LOOP
                        BEGIN
                            INSERT INTO {table} VALUES (i);
                        EXCEPTION WHEN division_by_zero THEN NULL;
                        END;
                    END LOOP;
                END
                $sub$"""
            )
            # xmin is 32 bits; the subxids are in the top xid's epoch or the next.
            last32 = int(_scalar(holder, f"SELECT max(xmin::text::bigint) FROM {table}"))
            last = (top & ~0xFFFFFFFF) | last32
            if last < top:
                last += 1 << 32
            burn_xids(conninfo, 1)
            yield SubtransHolder(table, top, top + 1, last, n, holder.info.backend_pid)
        finally:
            holder.rollback()
            holder.autocommit = True
            holder.execute(f"DROP TABLE IF EXISTS {table}")


def provoke_subtrans_reads(
    conn: psycopg.Connection[Any], holder: SubtransHolder, scans: int = 2
) -> int:
    """Scan the holder's table `scans` times; return the pg_subtrans lookups made.

    Call it on the workload connection (not the holder's) while the
    subtrans_holder is open. Every row was inserted by a subxid of the open
    transaction, so in a sequential scan HeapTupleSatisfiesMVCC finds each
    xmin neither hinted nor ours, and XidInMVCCSnapshot, the snapshot being
    suboverflowed and the xmin between its xmin and xmax, calls
    SubTransGetTopmostTransaction(xmin): exactly two pg_subtrans lookups per
    row, the row's subxid (parent: the top xid) and the top xid (no parent).
    So blks_hit + blks_read of pg_subtrans grow by exactly the returned number,
    2 * rows * scans.

    Misses: the top xid's page is used for every row and stays in its buffer;
    the rows are in xid order, so a scan walks the other pages in order, 2048
    rows each, and misses at most once per page. With more pages than
    pg_subtrans buffers (50 pages vs 32 before 17, 16 at the minimum of 17+),
    a repeated scan misses once on every page it walks (least recently used
    replacement over a cycle longer than the buffers): blks_read grows by
    about scans * pages. Each miss is one open + pread(8192) + close of
    pg_subtrans/<segment>, and no other backend asks pg_subtrans about these
    xids (no pruning on an insert-only table, parallel query off here), so
    the probe's pg_subtrans reads for this backend equal the blks_read delta
    exactly.
    """
    conn.execute("SET max_parallel_workers_per_gather = 0")
    try:
        for _ in range(scans):
            visible = int(_scalar(conn, f"SELECT count(*) FROM {holder.table}"))
            if visible != 0:
                raise RuntimeError(f"{visible} rows of {holder.table} visible: holder committed?")
    finally:
        conn.execute("RESET max_parallel_workers_per_gather")
    return 2 * holder.rows * scans


def slru_stats(conn: psycopg.Connection[Any]) -> dict[str, tuple[int, int]]:
    """pg_stat_slru as directory -> (blks_hit, blks_read), this backend's counts included.

    Keyed by SLRU directory ("pg_xact", "pg_subtrans"; "other" for the rest),
    the same on every version whatever pg_stat_slru calls the row.

    First flushes this backend's pending SLRU counters (PostgreSQL 15+:
    pg_stat_force_next_flush(), and the flush happens before the statement's
    ReadyForQuery, so it is done when execute() returns), then reads the
    shared stats with a fresh stats snapshot. `conn` must be in autocommit
    mode: a backend only flushes when idle outside a transaction block.
    On 13-14 it sends them to the statistics collector instead, and waits for
    a stats file the collector wrote after that (a second or so).
    """
    if not conn.autocommit:
        raise ValueError("slru_stats needs an autocommit connection (stats flush when idle)")
    version = conn.info.server_version
    if version >= 150000:
        conn.execute("SELECT pg_stat_force_next_flush()")
    else:
        time.sleep(0.7)  # PGSTAT_STAT_INTERVAL (500 ms) since its last report, then ...
        conn.execute("SELECT 1")  # ... this statement's end sends its counts
        sent = _scalar(conn, "SELECT clock_timestamp()")
        # A reader takes a stats file up to 500 ms old, which another session's read may
        # have had written before the counts came: wait for a newer one.
        deadline = time.monotonic() + 30
        while not _scalar(conn, "SELECT pg_stat_get_snapshot_timestamp() > %s", (sent,)):
            if time.monotonic() > deadline:
                raise RuntimeError("the statistics collector wrote no stats file for 30 s")
            time.sleep(0.05)
    conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = conn.execute("SELECT name, blks_hit, blks_read FROM pg_stat_slru").fetchall()
    return {SLRU_DIRS.get(str(name), str(name)): (int(hit), int(read)) for name, hit, read in rows}


def slru_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """after - before for each SLRU: name -> (blks_hit delta, blks_read delta)."""
    return {
        name: (hit - before.get(name, (0, 0))[0], read - before.get(name, (0, 0))[1])
        for name, (hit, read) in after.items()
    }


def xact_lookup_pgbench_script(first: int, last: int, per_transaction: int = 1) -> str:
    """A pgbench script that looks up the status of random xids in first..last.

    With more pg_xact pages in the range than buffers, most look-ups miss: a
    steady pg_xact thrashing load for many clients (the demo and the triage test).
    per_transaction look-ups in one statement (1: one xid from pgbench's random()).
    """
    if per_transaction == 1:
        return f"\\set x random({first}, {last})\nSELECT pg_xact_status(:x::text::xid8);\n"
    return (
        f"SELECT pg_xact_status(({first} + floor(random() * {last - first + 1}))::bigint"
        f"::text::xid8) FROM generate_series(1, {per_transaction});\n"
    )
