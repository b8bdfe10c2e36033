"""Wait events sampled from pg_stat_activity: which causes take the backends' active time.

Wait events are grouped by cause (row locks, data file reads, WAL, ...), each with its
meaning and next step; backends with no wait event are on CPU. ``row_lock_pct`` is shared
with the LWLock rule (row-lock waits also keep the lock manager's LWLocks busy).
"""

from __future__ import annotations

from dataclasses import dataclass

from pgprobe import pgversions
from pgprobe.findings import fmt
from pgprobe.findings.base import Doc, Finding, at_most, rule, severity_of
from pgprobe.findings.document import (
    activity_samples,
    as_number,
    section,
)

# Fewer than ten samples of active backends (e.g. 10 s with one backend active a tenth of the
# time) make shares meaningless.
WAIT_MIN_SAMPLES = 10
# A family of wait events taking this share of the backends' active (non-idle) time.
WAIT_HIGH_PCT = 40.0
WAIT_MEDIUM_PCT = 20.0
WAIT_LOW_PCT = 10.0
# Fewer than 0.2 backends in the wait on average is not what slows a server down: at most low.
WAIT_MIN_BACKENDS = 0.2
# Backends on CPU (no wait event) for most of their active time: CPU-bound.
CPU_BOUND_PCT = 60.0
CPU_BOUND_BACKENDS = 1.0


@dataclass(frozen=True)
class _WaitFamily:
    label: str
    meaning: str
    next_step: str


def _wait_family(wtype: str, event: str) -> tuple[str, _WaitFamily]:
    if wtype == "Lock" and event in ("transactionid", "tuple"):
        return "row-locks", _WaitFamily(
            "row locks",
            "contention on hot rows",
            "sessions wait for the transactions that update or lock the same rows: find the "
            "blockers with pg_blocking_pids() and pg_locks, keep transactions that "
            "update hot rows short (commit early, no client round trips inside), avoid "
            "updating one row from many sessions (counters, balances), use SKIP LOCKED for "
            "queues",
        )
    if wtype == "Lock" and event == "extend":
        return "lock-extend", _WaitFamily(
            "relation extension locks",
            "many sessions extend the same table at once",
            "bulk inserts from many sessions into one table or index: fewer concurrent inserters "
            "into one table, larger batches (COPY); PostgreSQL 16+ "
            "extends relations in bigger steps",
        )
    if wtype == "Lock":
        return "locks", _WaitFamily(
            "heavyweight locks",
            "sessions wait for table-level or advisory locks",
            "DDL, LOCK TABLE or advisory locks: find the blockers with pg_blocking_pids() and "
            "pg_locks; DDL queued behind a long "
            "transaction blocks everything after it: set lock_timeout for DDL",
        )
    if wtype == "IO" and pgversions.is_data_file_read_wait(event):
        return "io-read", _WaitFamily(
            "data file reads",
            "the working set is larger than shared_buffers and the page cache"
            + (" (io workers read for the backends)" if event == "AioIoCompletion" else ""),
            "backends wait for pages read from disk: check the cache hit ratio and the statements "
            "with most shared_blks_read "
            "(pg_stat_statements), add the missing indexes that turn scans into look-ups, "
            "raise shared_buffers or the machine's memory, check disk latency",
        )
    if wtype == "IO" and pgversions.is_wal_io_wait(event):
        return "io-wal", _WaitFamily(
            "WAL writes and syncs",
            "commits wait on fsync latency",
            "measure the WAL disk (pg_test_fsync, iostat await), consider synchronous_commit = "
            "off where losing the last commits on a crash is acceptable, commit_delay for "
            "group commit, a faster pg_wal volume",
        )
    if wtype == "IO" and event.startswith("BufFile"):
        return "io-temp", _WaitFamily(
            "temporary files",
            "sorts and hashes spill to temporary files",
            "raise work_mem for the statements that spill (log_temp_files = 0 names them)",
        )
    if wtype == "IO":
        return "io", _WaitFamily(
            "I/O",
            "backends wait for disk I/O",
            "check disk latency and throughput (iostat), and which statements do the I/O "
            "(pg_stat_statements, pg_stat_io on 16+)",
        )
    if wtype == "LWLock":
        return "lwlock", _WaitFamily(
            "LWLocks",
            "backends wait on internal locks",
            "see the LWLock table for the tranches and their wait times",
        )
    if wtype == "IPC" and event == "SyncRep":
        return "syncrep", _WaitFamily(
            "synchronous replication",
            "commits wait for a synchronous standby to confirm",
            "check the standby's apply/flush lag and the network to it; synchronous_commit = "
            "local for transactions that need not wait",
        )
    if wtype == "BufferPin":
        return "bufferpin", _WaitFamily(
            "buffer pins",
            "a backend waits for others to unpin a page",
            "often VACUUM, waiting for open cursors or long scans: look for open cursors and "
            "long-running queries on the table",
        )
    key = wtype.lower() or "other"
    return key, _WaitFamily(
        f"{wtype} waits",
        f"backends wait on {wtype} events",
        "look up the events in PostgreSQL's wait event documentation",
    )


@rule
def wait_events(doc: Doc) -> list[Finding]:
    """The wait events (grouped by cause) that take a large share of active time."""
    act = section(doc, "activity")
    profile = act.get("wait_profile") if act else None
    if not isinstance(profile, list):
        return []
    entries = [p for p in profile if isinstance(p, dict)]
    total = sum(as_number(p.get("samples")) for p in entries)
    n_samples = len(activity_samples(doc))
    if total < WAIT_MIN_SAMPLES:
        return []
    interval = as_number(act.get("interval_s") if act else 0) or 1.0
    families: dict[str, tuple[_WaitFamily, dict[str, float]]] = {}
    cpu = 0.0
    for p in entries:
        wtype, event = str(p.get("wait_event_type") or ""), str(p.get("wait_event") or "")
        if wtype in ("CPU", ""):
            cpu += as_number(p.get("samples"))
            continue
        key, fam = _wait_family(wtype, event)
        events = families.setdefault(key, (fam, {}))[1]
        name = f"{wtype}:{event}"
        events[name] = events.get(name, 0.0) + as_number(p.get("samples"))
    out = []
    for key, (fam, events) in families.items():
        samples = sum(events.values())
        share = 100 * samples / total
        severity = severity_of(share, WAIT_HIGH_PCT, WAIT_MEDIUM_PCT, WAIT_LOW_PCT)
        if severity is None:
            continue
        backends = samples / n_samples if n_samples else 0.0
        if backends < WAIT_MIN_BACKENDS:
            severity = at_most(severity, "low")
        names = sorted(events, key=lambda e: -events[e])
        listing = ", ".join(f"{e} {fmt.pct(100 * events[e] / total)}" for e in names[:4])
        out.append(
            Finding(
                id=f"wait.{key}",
                severity=severity,
                title=f"{fmt.pct(share)} of active time waits on {fam.label} ({listing}): "
                f"{fam.meaning}",
                evidence=fmt.join(
                    [
                        f"{fmt.n(samples)} of {fmt.n(total)} samples of active backends in "
                        f"{fmt.n(n_samples)} pg_stat_activity snapshots "
                        f"({fmt.n(interval)} s apart)",
                        f"{fmt.n(backends)} backends in these waits on average",
                    ]
                ),
                next_step=fam.next_step
                if key != "lwlock" or doc.get("lwlocks") is not None
                else "this report has no LWLock table (see the capture section): the wait "
                "event names above are the tranches; look them up in PostgreSQL's wait "
                "event documentation",
                magnitude=share,
                section="waits",
            )
        )
    cpu_share = 100 * cpu / total
    cpu_backends = cpu / n_samples if n_samples else 0.0
    if cpu_share >= CPU_BOUND_PCT and cpu_backends >= CPU_BOUND_BACKENDS:
        out.append(
            Finding(
                id="wait.cpu",
                severity="medium",
                title=f"{fmt.pct(cpu_share)} of active time is on CPU (no wait event): the "
                "backends are CPU-bound",
                evidence=f"{fmt.n(cpu)} of {fmt.n(total)} samples of active backends had no wait "
                f"event; {fmt.n(cpu_backends)} backends on CPU on average",
                next_step="the flame graph and the top functions show where the CPU goes; "
                "compare the active backends with the number of CPUs",
                magnitude=cpu_share,
                section="waits",
            )
        )
    return out


def row_lock_pct(doc: Doc) -> float:
    """Share of the sampled active time spent waiting on row locks (Lock:transactionid/tuple)."""
    act = section(doc, "activity")
    profile = act.get("wait_profile") if act else None
    if not isinstance(profile, list):
        return 0.0
    entries = [p for p in profile if isinstance(p, dict)]
    total = sum(as_number(p.get("samples")) for p in entries)
    rows = sum(
        as_number(p.get("samples"))
        for p in entries
        if p.get("wait_event_type") == "Lock" and p.get("wait_event") in ("transactionid", "tuple")
    )
    return 100 * rows / total if total >= WAIT_MIN_SAMPLES else 0.0
