"""The lead of each finding's next step: what to do, in at most twelve words.

A finding's ``next_step`` says what to check or change and why (often 40 words or more);
its lead, shown first in the report and the summary, says the action alone. Leads are looked
up by the finding's id (``lead_of``): an exact id of ``LEADS``, else the longest prefix of
``PREFIX_LEADS`` (ids with a name in them: ``cpu.function.<name>``, ``lwlock.<tranche>``,
``wait.<class>``), else ``DEFAULT_LEAD``. A new finding id gets its lead here;
tests/test_findings.py checks that every lead has at most twelve words.
"""

from __future__ import annotations

LEADS: dict[str, str] = {
    # wait events (pgprobe.findings.waits), by family
    "wait.cpu": "Add CPUs or cut concurrent work; see the flame graph.",
    "wait.idle-in-transaction": "Commit sooner: keep client work out of open transactions.",
    "wait.row-locks": "Find the blocking sessions; shorten transactions that update hot rows.",
    "wait.lock-extend": "Fewer concurrent inserters per table; batch the inserts (COPY).",
    "wait.locks": "Find the lock holders with pg_blocking_pids(); set lock_timeout for DDL.",
    "wait.io-read": "Cut disk reads: add indexes, or more shared_buffers and memory.",
    "wait.io-wal": "Speed up WAL syncs: faster pg_wal disk, or group commits.",
    "wait.io-temp": "Raise work_mem for the statements that spill to temporary files.",
    "wait.io": "Check disk latency and which statements do the I/O.",
    "wait.lwlock": "Read the LWLock table: which tranche the backends wait on.",
    "wait.syncrep": "Check the synchronous standby's lag and the network to it.",
    "wait.bufferpin": "Look for open cursors and long scans on the table.",
    "wait.pg-sleep": "The application calls pg_sleep(): find those statements.",
    "wait.no-wait-event": "Check memory pressure (page faults) and disk latency.",
    # on-CPU patterns (pgprobe.findings.cpu)
    "cpu.snapshots": "Put a connection pooler in front; lower max_connections.",
    "cpu.spinlocks": "Find the spinning lock in the flame graph (s_lock callers).",
    "cpu.hashing": "See the hash look-ups' callers in the flame graph.",
    "cpu.sorting": "Add indexes matching ORDER BY, or raise work_mem.",
    "cpu.jit": "Raise jit_above_cost, or set jit = off for short queries.",
    "cpu.parse-plan": "Use prepared statements for the hot queries.",
    "cpu.client-io": "Fewer round trips: batch statements or use pipeline mode.",
    # LWLock tranche families (pgprobe.findings.locks)
    "lwlock.WALWrite": "Speed up WAL flushes: a faster pg_wal disk, fewer commits.",
    "lwlock.WALInsert": "Write less WAL, or raise wal_buffers; consider fewer writers.",
    "lwlock.LockManager": "Touch fewer relations per query; fix row-lock waits first.",
    "lwlock.BufferContent": "Spread writes away from hot pages (one row, one index end).",
    "lwlock.BufferMapping": "Raise shared_buffers so the working set fits.",
    "lwlock.BufferIO": "Many backends read the same pages: check disk latency.",
    "lwlock.ProcArray": "Put a connection pooler in front; fewer connections.",
    "lwlock.XidGen": "Fewer transaction ids: batch writes into fewer transactions.",
    # server statistics (pgprobe.findings.server_stats)
    "stats.checkpoints": "Raise max_wal_size so that checkpoints come from the timeout.",
    "stats.temp-files": "Set log_temp_files = 0, then raise work_mem for those.",
    "stats.deadlocks": "Read the deadlocks in the server log; lock rows in one order.",
    "stats.cache-hit": "Raise shared_buffers, or add indexes that avoid large scans.",
    "stats.backend-writes": "Raise shared_buffers; make the background writer write more.",
    "stats.wal-buffers-full": "Raise wal_buffers.",
    "stats.rollbacks": "Read the errors in the server log; fix the failing transactions.",
    "stats.connections": "Put a connection pooler in front of the server.",
    "stats.statement": "EXPLAIN (ANALYZE, BUFFERS) this statement.",
    # the capture itself (pgprobe.findings.capture)
    "capture.losses": "Capture again shorter, or with a lower sampling rate.",
    "capture.server_gone": "Read the server log around the time it went away.",
    "capture.unresolved": "Install the server's debug symbols, then capture again.",
    "capture.missing.lwlocks": "Use the LWLock wait events of the time model instead.",
    "nothing": "Capture again while users see slowness; check the client side.",
}
PREFIX_LEADS: dict[str, str] = {
    "wait.": "Look up these wait events in PostgreSQL's documentation.",
    "cpu.function.": "Search the flame graph for this function's callers.",
    "cpu.": "See where the CPU goes in the flame graph.",
    "lwlock.pg_": "Raise this SLRU's buffers, or find what misses them.",
    "lwlock.": "Look up this LWLock; see its callers in the flame graph.",
    "slru.": "See the SimpleLruReadPage callers in the flame graph.",
    "stats.": "See the SQL statistics section.",
    "capture.missing.": "Run pgprobe doctor to see what this machine can trace.",
    "capture.": "See the capture details.",
    "rule-error.": "Report this to pgprobe's maintainers with the --json document.",
}
DEFAULT_LEAD = "See the evidence and the next step below."


def lead_of(finding_id: str) -> str:
    """The lead of a finding id: exact, else the longest matching prefix, else the default."""
    if finding_id in LEADS:
        return LEADS[finding_id]
    prefixes = [p for p in PREFIX_LEADS if finding_id.startswith(p)]
    return PREFIX_LEADS[max(prefixes, key=len)] if prefixes else DEFAULT_LEAD


def all_leads() -> list[str]:
    """Every lead text (for the test that each has at most twelve words)."""
    return [*LEADS.values(), *PREFIX_LEADS.values(), DEFAULT_LEAD]
