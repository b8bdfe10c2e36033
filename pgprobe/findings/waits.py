"""Wait events: which causes take the client backends' active time.

From the exact time model (``doc["waits"]``: the scheduler's on-CPU, runqueue and off-CPU
time per wait event, `pgprobe waits`' probe) when the document has one, else from the
pg_stat_activity samples (``doc["activity"]``: older documents, or a build where the time
model could not run). Wait events are grouped by cause (row locks, data file reads, WAL,
...), each with its meaning and next step. ``row_lock_pct`` is shared with the LWLock rule
(row-lock waits also keep the lock manager's LWLocks busy); ``time_model`` with the report
(the exact shares beside the sampled ones).
"""

from __future__ import annotations

from dataclasses import dataclass

from pgprobe import pgversions
from pgprobe.findings import fmt, lockwaits, statements, timemodel
from pgprobe.findings.base import Doc, Finding, at_most, rule, severity_of
from pgprobe.findings.document import activity_samples, as_number, section
from pgprobe.findings.timemodel import Component, TimeModel, time_model

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
# Exact time: under half a backend-second of active time in the window (e.g. one query of
# 0.4 s) is too little to call a share of it a problem of the server.
WAIT_MIN_ACTIVE_S = timemodel.MIN_ACTIVE_S


@dataclass(frozen=True)
class _WaitFamily:
    label: str
    meaning: str
    next_step: str
    at_most: str = "high"  # the highest severity its share can give


def _wait_family(wtype: str, event: str, state: str = "") -> tuple[str, _WaitFamily]:
    if (wtype, event) == ("Client", "ClientRead") and state.startswith("idle in transaction"):
        return "idle-in-transaction", _WaitFamily(
            "clients inside open transactions",
            "sessions keep their transactions open while the server waits for the client: "
            "their row locks and snapshot are held all that time",
            "find them in pg_stat_activity (state 'idle in transaction', xact_start, the last "
            "query): keep client-side work and round trips out of transactions, commit "
            "early; idle_in_transaction_session_timeout ends the forgotten ones",
        )
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
    if (wtype, event) == ("Timeout", "PgSleep"):
        return "pg-sleep", _WaitFamily(
            "pg_sleep()",
            "the statements themselves sleep (pg_sleep), not a server resource",
            "find the statements that call pg_sleep (pg_stat_activity.query, "
            "pg_stat_statements); inside a transaction the session keeps its locks while it "
            "sleeps",
            at_most="low",  # asked for by the application, not a resource of the server
        )
    if not wtype:
        return "no-wait-event", _WaitFamily(
            "sleeps outside PostgreSQL's wait events",
            "backends sleep with no wait event set (kernel I/O, page faults, memory)",
            "page faults and reads the server does not instrument: check memory pressure "
            "(vmstat si/so, major faults in /proc/PID/stat) and the disk latency",
        )
    key = wtype.lower()
    return key, _WaitFamily(
        f"{wtype} waits",
        f"backends wait on {wtype} events",
        "look up the events in PostgreSQL's wait event documentation",
    )


@rule
def wait_events(doc: Doc) -> list[Finding]:
    """The wait events (grouped by cause) that take a large share of active time."""
    model = time_model(doc)
    if model is not None:
        return _exact_findings(doc, model)
    return _sampled_findings(doc)


def _lwlock_step(doc: Doc, key: str, fam: _WaitFamily) -> str:
    if key != "lwlock" or doc.get("lwlocks") is not None:
        return fam.next_step
    return (
        "this report has no LWLock table (see the capture section): the wait event names "
        "above are the tranches; look them up in PostgreSQL's wait event documentation"
    )


def _exact_findings(doc: Doc, model: TimeModel) -> list[Finding]:
    """Shares of the client backends' exact active time, from the scheduler."""
    if model.active_s < WAIT_MIN_ACTIVE_S:
        return []
    window = model.window_s or 1.0
    families: dict[str, tuple[_WaitFamily, list[Component]]] = {}
    for c in model.components:
        if c.category == "wait":
            key, fam = _wait_family(c.wait_event_type, c.wait_event, c.state)
            families.setdefault(key, (fam, []))[1].append(c)
    out = []
    for key, (fam, events) in families.items():
        seconds = sum(c.seconds for c in events)
        events.sort(key=lambda c: -c.seconds)
        listing = ", ".join(
            f"{c.name} {fmt.pct(c.active_pct or 0.0)}, {fmt.secs(c.seconds)}" for c in events[:4]
        )
        backends = seconds / window
        sampled = sum(c.samples for c in events)
        evidence = [
            f"exact: {fmt.secs(seconds)} of the client backends' "
            f"{fmt.secs(model.active_s)} of active time over {fmt.secs(window)}",
            f"{fmt.n(backends)} backends in these waits on average",
            f"{fmt.n(sum(c.sleeps for c in events))} sleeps",
            _sampled_words(sampled, model.samples),
        ]
        share = 100 * seconds / model.active_s
        names = {(c.wait_event_type, c.wait_event) for c in events}
        whose = lockwaits.top_lock(doc, names, seconds) + statements.top_part(
            doc, statements.in_events(names), seconds
        )
        out += _family_finding(doc, key, fam, share, backends, listing, evidence, "timemodel",
                               whose)  # fmt: skip
    cpu_share = 100 * model.cpu_s / model.active_s
    cpu_backends = model.cpu_s / window
    runq = sum(c.seconds for c in model.components if c.category == "runqueue")
    out += _cpu_finding(
        cpu_share,
        cpu_backends,
        "on CPU or waiting for one",
        f"exact: {fmt.secs(model.cpu_s - runq)} on CPU and {fmt.secs(runq)} "
        f"runnable, waiting for a CPU, of {fmt.secs(model.active_s)} of active time; "
        f"{fmt.n(cpu_backends)} backends on or waiting for a CPU on average",
        " (time waiting for a CPU means more runnable backends than CPUs)",
        "timemodel",
        statements.top_part(doc, statements.cpu_seconds, model.cpu_s),
    )
    return out


def _family_finding(
    doc: Doc,
    key: str,
    fam: _WaitFamily,
    share: float,
    backends: float,
    listing: str,
    evidence: list[str],
    section_id: str,
    whose: str = "",
) -> list[Finding]:
    """The finding of one family of wait events (exact or sampled), if its share calls for it;
    whose: "; N % of it is <statement>" where the time model is keyed by statement."""
    severity = severity_of(share, WAIT_HIGH_PCT, WAIT_MEDIUM_PCT, WAIT_LOW_PCT)
    if severity is None:
        return []
    if backends < WAIT_MIN_BACKENDS:
        severity = at_most(severity, "low")
    severity = at_most(severity, fam.at_most)
    return [
        Finding(
            id=f"wait.{key}",
            severity=severity,
            title=f"{fmt.pct(share)} of active time waits on {fam.label} ({listing}): "
            f"{fam.meaning}{whose}",
            evidence=fmt.join(evidence),
            next_step=_lwlock_step(doc, key, fam),
            magnitude=share,
            section=section_id,
            share=share,
        )
    ]


def _cpu_finding(
    share: float,
    backends: float,
    what: str,
    evidence: str,
    step_tail: str,
    section_id: str,
    whose: str = "",
) -> list[Finding]:
    """CPU-bound backends (exact or sampled), if most of their active time is CPU."""
    if share < CPU_BOUND_PCT or backends < CPU_BOUND_BACKENDS:
        return []
    return [
        Finding(
            id="wait.cpu",
            severity="medium",
            title=f"{fmt.pct(share)} of active time is {what}: the backends are CPU-bound{whose}",
            evidence=evidence,
            next_step="the flame graph and the top functions show where the CPU goes; "
            f"compare the active backends with the number of CPUs{step_tail}",
            magnitude=share,
            section=section_id,
            share=share,
        )
    ]


def _sampled_words(samples: int, total: int) -> str:
    if not total:
        return "no pg_stat_activity samples to compare"
    return (
        f"pg_stat_activity sampling saw {fmt.pct(100 * samples / total)} "
        f"({fmt.n(samples)} of {fmt.n(total)} samples of active backends)"
    )


def _sampled_findings(doc: Doc) -> list[Finding]:
    """Shares of the pg_stat_activity samples of active backends (no time model)."""
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
        names = sorted(events, key=lambda e: -events[e])
        listing = ", ".join(f"{e} {fmt.pct(100 * events[e] / total)}" for e in names[:4])
        backends = samples / n_samples if n_samples else 0.0
        evidence = [
            f"{fmt.n(samples)} of {fmt.n(total)} samples of active backends in "
            f"{fmt.n(n_samples)} pg_stat_activity snapshots ({fmt.n(interval)} s apart)",
            f"{fmt.n(backends)} backends in these waits on average",
        ]
        share = 100 * samples / total
        out += _family_finding(doc, key, fam, share, backends, listing, evidence, "waits")
    cpu_backends = cpu / n_samples if n_samples else 0.0
    out += _cpu_finding(
        100 * cpu / total,
        cpu_backends,
        "on CPU (no wait event)",
        f"{fmt.n(cpu)} of {fmt.n(total)} samples of active backends had no wait "
        f"event; {fmt.n(cpu_backends)} backends on CPU on average",
        "",
        "waits",
    )
    return out


def row_lock_pct(doc: Doc) -> float:
    """Share of the active time spent waiting on row locks (Lock:transactionid/tuple).

    Exact from the time model when the document has one, else from the samples.
    """
    model = time_model(doc)
    if model is not None:
        rows = sum(
            c.seconds
            for c in model.components
            if c.category == "wait"
            and c.wait_event_type == "Lock"
            and c.wait_event in ("transactionid", "tuple")
        )
        return 100 * rows / model.active_s if model.active_s >= WAIT_MIN_ACTIVE_S else 0.0
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
