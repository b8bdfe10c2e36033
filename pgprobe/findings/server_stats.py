"""Statistics deltas over the window: pg_stat_database, pg_stat_bgwriter/checkpointer,
pg_stat_wal, pg_stat_statements and the client connections of pg_stat_activity.
"""

from __future__ import annotations

from typing import Any

from pgprobe import pgversions
from pgprobe.findings import fmt
from pgprobe.findings.base import Doc, Finding, rule, severity_of
from pgprobe.findings.document import (
    as_number,
    avg_active,
    doc_meta,
    duration_s,
    max_clients,
    section,
    stats_view,
)

# Checkpoints requested (max_wal_size reached, or CHECKPOINT commands) in a window of seconds
# mean the WAL volume outruns max_wal_size; four a minute (one every 15 s) is back to back.
CHECKPOINT_REQ_HIGH_PER_MIN = 4.0


@rule
def checkpoints_requested(doc: Doc) -> list[Finding]:
    """Checkpoints requested in the window: WAL volume outruns max_wal_size."""
    bg = stats_view(doc, "bgwriter") or {}
    cp = stats_view(doc, "checkpointer") or {}
    if "num_requested" in cp or "num_timed" in cp:  # PostgreSQL 17+
        req, timed = as_number(cp.get("num_requested")), as_number(cp.get("num_timed"))
        written = as_number(cp.get("buffers_written"))
    else:
        req, timed = as_number(bg.get("checkpoints_req")), as_number(bg.get("checkpoints_timed"))
        written = as_number(bg.get("buffers_checkpoint"))
    duration = duration_s(doc)
    if req <= 0 or duration <= 0:
        return []
    per_min = 60 * req / duration
    wal = stats_view(doc, "wal") or {}
    wal_bytes, fpi, records = (
        as_number(wal.get("wal_bytes")),
        as_number(wal.get("wal_fpi")),
        as_number(wal.get("wal_records")),
    )
    evidence = [
        f"{fmt.n(req)} requested and {fmt.n(timed)} timed checkpoints in {fmt.secs(duration)} "
        f"({fmt.n(per_min)} a minute)",
        f"{fmt.n(written)} buffers written by checkpoints" if written else "",
    ]
    if wal_bytes:
        evidence.append(f"WAL: {fmt.size(wal_bytes / duration)}/s")
    if records and fpi:
        evidence.append(
            f"full-page images: {fmt.n(fpi)} of {fmt.n(records)} WAL records "
            f"({fmt.pct(100 * fpi / records)})"
        )
    return [
        Finding(
            id="stats.checkpoints",
            severity="high" if per_min >= CHECKPOINT_REQ_HIGH_PER_MIN else "medium",
            title=f"{fmt.n(req)} checkpoint{'s' if req != 1 else ''} requested in "
            f"{fmt.secs(duration)}: the WAL volume outruns max_wal_size",
            evidence=fmt.join(evidence),
            next_step="raise max_wal_size so that checkpoints come from checkpoint_timeout "
            "(log_checkpoints shows 'checkpoint starting: wal'); each checkpoint restarts "
            "full-page images, so frequent ones also multiply WAL volume; requested "
            "checkpoints also count CHECKPOINT commands and base backups",
            magnitude=min(100.0, per_min * 10),
            section="sql",
        )
    ]


# Temporary files at 10 MB/s are a disk load of their own; any temp file is worth knowing.
TEMP_BYTES_MEDIUM_PER_S = 10 * 1024 * 1024


@rule
def temp_files(doc: Doc) -> list[Finding]:
    """Temporary files written: sorts or hashes larger than work_mem."""
    db = stats_view(doc, "database") or {}
    files, size = as_number(db.get("temp_files")), as_number(db.get("temp_bytes"))
    duration = duration_s(doc)
    if files <= 0 and size <= 0:
        return []
    rate = size / duration if duration else 0.0
    return [
        Finding(
            id="stats.temp-files",
            severity="medium" if rate >= TEMP_BYTES_MEDIUM_PER_S else "low",
            title=f"{fmt.n(files)} temporary file{'s' if files != 1 else ''} "
            f"({fmt.size(size)}) written: sorts or hashes spill beyond work_mem",
            evidence=f"pg_stat_database: temp_files {fmt.n(files)}, temp_bytes {fmt.size(size)} in "
            f"{fmt.secs(duration)} ({fmt.size(rate)}/s)",
            next_step="set log_temp_files = 0 to name the statements, then raise work_mem for "
            "them (SET in the session or ALTER ROLE; hash_mem_multiplier for hashes) or give "
            "them an index that avoids the sort",
            magnitude=min(100.0, 100 * rate / TEMP_BYTES_MEDIUM_PER_S),
            section="sql",
        )
    ]


# One deadlock is a bug to fix; ten in a triage window is an outage in the making.
DEADLOCKS_HIGH = 10


@rule
def deadlocks(doc: Doc) -> list[Finding]:
    db = stats_view(doc, "database") or {}
    n = as_number(db.get("deadlocks"))
    if n <= 0:
        return []
    return [
        Finding(
            id="stats.deadlocks",
            severity="high" if n >= DEADLOCKS_HIGH else "medium",
            title=f"{fmt.n(n)} deadlock{'s' if n != 1 else ''} in {fmt.secs(duration_s(doc))}",
            evidence=f"pg_stat_database.deadlocks rose by {fmt.n(n)}",
            next_step="the server log has each deadlock with both statements ('deadlock "
            "detected'): make the transactions take their locks in the same order (e.g. update "
            "rows sorted by key), keep them short",
            magnitude=min(100.0, 10 * n),
            section="sql",
        )
    ]


# Cache hit ratio over enough block accesses to mean something (10,000 in the window). OLTP
# servers run above 99 %; below 95 % reads from outside shared_buffers are a large part of the
# work, below 90 % the working set clearly does not fit.
CACHE_MIN_BLOCKS = 10_000
CACHE_HIT_MEDIUM_PCT = 90.0
CACHE_HIT_LOW_PCT = 95.0
BLCKSZ = 8192


@rule
def cache_hit_ratio(doc: Doc) -> list[Finding]:
    db = stats_view(doc, "database") or {}
    hit, read = as_number(db.get("blks_hit")), as_number(db.get("blks_read"))
    if hit + read < CACHE_MIN_BLOCKS or read <= 0:
        return []
    ratio = 100 * hit / (hit + read)
    if ratio >= CACHE_HIT_LOW_PCT:
        return []
    duration = duration_s(doc)
    evidence = [
        f"pg_stat_database: {fmt.n(read)} blocks read, {fmt.n(hit)} hit in {fmt.secs(duration)}"
        + (f" ({fmt.size(read * BLCKSZ / duration)}/s from the OS or disk)" if duration else "")
    ]
    statements = (section(doc, "stats") or {}).get("statements")
    if isinstance(statements, list):
        readers = [
            s for s in statements if isinstance(s, dict) and as_number(s.get("shared_blks_read"))
        ]
        if readers:
            top = max(readers, key=lambda s: as_number(s.get("shared_blks_read")))
            evidence.append(
                f"most blocks read: {_short(str(top.get('query', '')))} "
                f"({fmt.n(as_number(top.get('shared_blks_read')))} blocks)"
            )
    return [
        Finding(
            id="stats.cache-hit",
            severity="medium" if ratio < CACHE_HIT_MEDIUM_PCT else "low",
            title=f"Cache hit ratio {fmt.pct(ratio)}: the working set does not fit in "
            "shared_buffers",
            evidence=fmt.join(evidence),
            next_step="raise shared_buffers (a quarter of RAM is the usual start), add the "
            "indexes that turn large scans into look-ups (pg_stat_statements shared_blks_read), "
            "check IO:DataFileRead waits and disk latency",
            magnitude=100 - ratio,
            section="sql",
        )
    ]


def _short(query: str, limit: int = 90) -> str:
    one = " ".join(query.split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


# Backends writing dirty buffers themselves (instead of the bgwriter or the checkpointer): a
# quarter of all buffer writes, over at least 1,000 writes, means shared_buffers is short or
# the background writer cannot keep up; half is a clear problem.
BACKEND_WRITES_MIN = 1000
BACKEND_WRITES_LOW_PCT = 25.0
BACKEND_WRITES_MEDIUM_PCT = 50.0


@rule
def backend_writes(doc: Doc) -> list[Finding]:
    bg = stats_view(doc, "bgwriter") or {}
    if "buffers_backend" not in bg:  # PostgreSQL 17 moved it to pg_stat_io (16+)
        return _backend_writes_io(stats_view(doc, "io"))
    backend = as_number(bg.get("buffers_backend"))
    written = (
        backend
        + as_number(bg.get("buffers_clean"))
        + as_number(bg.get("buffers_checkpoint"))
        + as_number((stats_view(doc, "checkpointer") or {}).get("buffers_written"))
    )
    if backend < BACKEND_WRITES_MIN or written <= 0:
        return []
    share = 100 * backend / written
    severity = severity_of(share, 101.0, BACKEND_WRITES_MEDIUM_PCT, BACKEND_WRITES_LOW_PCT)
    if severity is None:
        return []
    maxwritten = as_number(bg.get("maxwritten_clean"))
    return [
        Finding(
            id="stats.backend-writes",
            severity=severity,
            title=f"Backends wrote {fmt.pct(share)} of dirty buffers themselves: shared_buffers "
            "is short or the background writer lags",
            evidence=fmt.join(
                [
                    f"pg_stat_bgwriter: buffers_backend {fmt.n(backend)}, buffers_clean "
                    f"{fmt.n(as_number(bg.get('buffers_clean')))}, buffers_checkpoint "
                    f"{fmt.n(as_number(bg.get('buffers_checkpoint')))}",
                    f"buffers_alloc {fmt.n(as_number(bg.get('buffers_alloc')))}",
                    f"bgwriter stopped at bgwriter_lru_maxpages {fmt.n(maxwritten)} times"
                    if maxwritten
                    else "",
                ]
            ),
            next_step=BACKEND_WRITES_NEXT,
            magnitude=share,
            section="sql",
        )
    ]


BACKEND_WRITES_NEXT = (
    "raise shared_buffers; make the background writer do more "
    "(bgwriter_lru_maxpages, bgwriter_lru_multiplier, bgwriter_delay)"
)


def _backend_writes_io(io: dict[str, Any] | None) -> list[Finding]:
    """The same finding from pg_stat_io's relation writes per backend type (16+)."""
    if not io:
        return []
    writes = {str(k): as_number(v) for k, v in io.items()}
    backend = sum(v for k, v in writes.items() if k not in pgversions.BACKGROUND_WRITERS)
    written = sum(writes.values())
    if backend < BACKEND_WRITES_MIN or written <= 0:
        return []
    share = 100 * backend / written
    severity = severity_of(share, 101.0, BACKEND_WRITES_MEDIUM_PCT, BACKEND_WRITES_LOW_PCT)
    if severity is None:
        return []
    listing = ", ".join(
        f"{k} {fmt.n(v)}" for k, v in sorted(writes.items(), key=lambda kv: -kv[1]) if v > 0
    )
    return [
        Finding(
            id="stats.backend-writes",
            severity=severity,
            title=f"Backends wrote {fmt.pct(share)} of dirty buffers themselves: shared_buffers "
            "is short or the background writer lags",
            evidence=f"pg_stat_io writes of relations by backend type: {listing}",
            next_step=BACKEND_WRITES_NEXT,
            magnitude=share,
            section="sql",
        )
    ]


# WAL buffers full: a backend had to write WAL itself because wal_buffers were full. Any is
# worth knowing; ten a second means wal_buffers is clearly too small for the write rate.
WAL_BUFFERS_FULL_MEDIUM_PER_S = 10.0


@rule
def wal_buffers_full(doc: Doc) -> list[Finding]:
    wal = stats_view(doc, "wal") or {}
    n = as_number(wal.get("wal_buffers_full"))
    if n <= 0:
        return []
    duration = duration_s(doc)
    rate = n / duration if duration else 0.0
    return [
        Finding(
            id="stats.wal-buffers-full",
            severity="medium" if rate >= WAL_BUFFERS_FULL_MEDIUM_PER_S else "low",
            title=f"WAL buffers were full {fmt.n(n)} times: backends wrote WAL themselves",
            evidence=f"pg_stat_wal.wal_buffers_full rose by {fmt.n(n)} in {fmt.secs(duration)} "
            f"({fmt.n(rate)}/s); WAL {fmt.size(as_number(wal.get('wal_bytes')))} in the window",
            next_step="raise wal_buffers (the default, 1/32 of shared_buffers, stops at 16MB; "
            "64MB suits heavy writers; needs a restart)",
            magnitude=min(100.0, 10 * rate),
            section="sql",
        )
    ]


# Rollbacks: a tenth of all transactions, over at least 100, is an application erroring out.
ROLLBACK_PCT = 10.0
ROLLBACK_MIN = 100


@rule
def rollbacks(doc: Doc) -> list[Finding]:
    db = stats_view(doc, "database") or {}
    commits, rb = as_number(db.get("xact_commit")), as_number(db.get("xact_rollback"))
    if rb < ROLLBACK_MIN or commits + rb <= 0:
        return []
    share = 100 * rb / (commits + rb)
    if share < ROLLBACK_PCT:
        return []
    return [
        Finding(
            id="stats.rollbacks",
            severity="low",
            title=f"{fmt.pct(share)} of transactions rolled back",
            evidence=f"pg_stat_database: {fmt.n(rb)} rollbacks, {fmt.n(commits)} commits in "
            f"{fmt.secs(duration_s(doc))}",
            next_step="errors are in the server log (statement errors, serialization "
            "failures, lock timeouts); some drivers roll back on purpose (e.g. read-only "
            "transactions ended with ROLLBACK)",
            magnitude=share,
            section="sql",
        )
    ]


# Client backends near max_connections: new connections will soon be refused.
CONNECTIONS_NEAR_LIMIT_PCT = 90.0


@rule
def connections(doc: Doc) -> list[Finding]:
    clients = max_clients(doc)
    max_conn = as_number(doc_meta(doc).get("max_connections"))
    if clients is None or max_conn <= 0:
        return []
    share = 100 * clients / max_conn
    if share < CONNECTIONS_NEAR_LIMIT_PCT:
        return []
    active = avg_active(doc) or 0.0
    return [
        Finding(
            id="stats.connections",
            severity="medium",
            title=f"{fmt.n(clients)} client connections of max_connections {fmt.n(max_conn)}: "
            "new connections will be refused soon",
            evidence=f"at most {fmt.n(clients)} client backends in pg_stat_activity, "
            f"{fmt.n(active)} active on average",
            next_step="put a connection pooler in front (few active connections serve many "
            "clients); find idle sessions that hold connections (pg_stat_activity state, "
            "idle_session_timeout, idle_in_transaction_session_timeout)",
            magnitude=share,
            section="waits",
        )
    ]


# One statement taking half of all statement time in the window is where to look first.
STATEMENT_DOMINANT_PCT = 50.0


@rule
def dominant_statement(doc: Doc) -> list[Finding]:
    statements = (section(doc, "stats") or {}).get("statements")
    if not isinstance(statements, list):
        return []
    rows = [s for s in statements if isinstance(s, dict)]
    total = sum(as_number(s.get("total_ms")) for s in rows)
    if total <= 0:
        return []
    top = max(rows, key=lambda s: as_number(s.get("total_ms")))
    share = 100 * as_number(top.get("total_ms")) / total
    if share < STATEMENT_DOMINANT_PCT:
        return []
    return [
        Finding(
            id="stats.statement",
            severity="low",
            title=f"One statement takes {fmt.pct(share)} of statement time: "
            f"{_short(str(top.get('query', '')), 70)}",
            evidence=f"{fmt.n(as_number(top.get('calls')))} calls, "
            f"{fmt.n(as_number(top.get('total_ms')))} ms in total, "
            f"{fmt.n(as_number(top.get('mean_ms')))} ms each "
            f"(pg_stat_statements, top {len(rows)} statements of the window)",
            next_step="EXPLAIN (ANALYZE, BUFFERS) it; if its time is waiting rather than "
            "running (see the wait events), look for the rows or locks it shares",
            magnitude=share,
            section="sql",
        )
    ]
