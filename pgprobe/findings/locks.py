"""LWLocks: which tranche family holds the wait time, and what that family means.

Reads the ``lwlocks`` section (bpftrace/DTrace LWLock waits per tranche and mode). Tranches
are grouped into families (``LWLOCK_FAMILIES``: WALWrite, LockManager, the SLRU buffers, ...)
across the names they had in PostgreSQL 9.6 to 18; each family says what its waits mean and
what to do. The SLRU families take their remedies from pgprobe.findings.slru.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pgprobe.findings import fmt
from pgprobe.findings.base import Doc, Finding, rule, severity_of
from pgprobe.findings.document import (
    as_number,
    avg_active,
    doc_meta,
    duration_s,
    max_clients,
    section_rows,
)
from pgprobe.findings.slru import SLRU_ADVICE, SLRU_REMEDY
from pgprobe.findings.timemodel import db_share
from pgprobe.findings.waits import WAIT_LOW_PCT, row_lock_pct

# A tranche family is named when it holds at least this share of all LWLock wait time: below
# a fifth, it is one contributor among several and the table says enough.
LWLOCK_SHARE_PCT = 20.0
# Less than 10 ms of waiting per second of capture (0.01 backends waiting on average) is the
# background noise of any busy server: no finding however large its share.
LWLOCK_MIN_BACKENDS = 0.01
# Severity: the time waited on the family as a share of the time backends were active
# (pg_stat_activity sampling). A fifth of all active time on one lock is a bottleneck; a
# twentieth is worth fixing; less is worth knowing.
LWLOCK_HIGH_ACTIVE_PCT = 20.0
LWLOCK_MEDIUM_ACTIVE_PCT = 5.0
# Without activity samples: the average number of backends waiting on the family.
LWLOCK_HIGH_BACKENDS = 1.0
LWLOCK_MEDIUM_BACKENDS = 0.25


@dataclass(frozen=True)
class _Family:
    tranches: frozenset[str]
    meaning: str
    next_step: str


def _slru_family(slru: str, *tranches: str) -> _Family:
    meaning = SLRU_ADVICE[slru][0]
    return _Family(
        frozenset(tranches),
        "its buffers thrash, backends queue for pages being read in",
        f"{meaning}: the SLRU reads show which backends miss and how often; in short: "
        f"{SLRU_REMEDY[slru]}",
    )


LWLOCK_FAMILIES: dict[str, _Family] = {
    "WALWrite": _Family(
        frozenset({"WALWrite", "WALWriteLock"}),
        "commits wait on WAL flush",
        "one backend writes and syncs the WAL while the others queue: check the WAL disk's "
        "latency (pg_test_fsync on the pg_wal volume; iostat await), "
        "synchronous_commit (off for transactions that may lose their last milliseconds on a "
        "crash), commit_delay/commit_siblings (group commit), wal_buffers",
    ),
    "WALInsert": _Family(
        frozenset({"WALInsert", "WALInsertLock", "WALBufMapping", "WALBufMappingLock"}),
        "backends queue to insert WAL records",
        "many concurrent writers, or large records such as the full-page images after each "
        "checkpoint: fewer full-page images: spread checkpoints (max_wal_size, "
        "checkpoint_timeout), "
        "wal_compression; raise wal_buffers (WALBufMapping waits mean they are too small); "
        "batch small writes into fewer transactions",
    ),
    "LockManager": _Family(
        frozenset({"LockManager", "lock_manager", "LockFastPath", "LockMgrLock"}),
        "fast-path lock slots exhausted, queries lock many relations",
        "each backend has 16 fast-path slots for relation locks; queries touching more "
        "relations (partitions and their indexes) go to the shared lock table: touch fewer "
        "relations per query (partition pruning at plan time, fewer partitions or "
        "indexes on hot tables, no wide views on hot paths); a pooler lowers the number of "
        "concurrent lockers; on PostgreSQL 18+ max_locks_per_transaction also sizes the "
        "fast-path slots",
    ),
    "BufferContent": _Family(
        frozenset({"BufferContent", "buffer_content"}),
        "many backends lock the same hot pages",
        "hot pages are a small hot table, the right-most page of an index on an ever-growing "
        "key, counters: find the hot relation (pg_stat_statements, the flame graph: heap or index "
        "code), "
        "spread hot rows, lower fillfactor, drop unneeded indexes on hot tables, keep "
        "transactions short",
    ),
    "BufferMapping": _Family(
        frozenset({"BufferMapping", "buffer_mapping", "BufMappingLock"}),
        "the working set is larger than shared_buffers",
        "backends replace shared buffers at a high rate: raise shared_buffers, or cut the working "
        "set (sequential scans that an index would "
        "avoid: pg_stat_statements shared_blks_read)",
    ),
    "BufferIO": _Family(
        frozenset({"BufferIO", "buffer_io"}),
        "backends wait for another backend's I/O on the same pages",
        "the same hot pages are read from disk again and again: raise shared_buffers, check "
        "disk latency",
    ),
    "ProcArray": _Family(
        frozenset({"ProcArray", "ProcArrayLock"}),
        "snapshots and commits serialize: too many connections",
        "every snapshot scans all connections and every commit updates the array: use a "
        "connection pooler (pgbouncer) to keep active connections near the number of "
        "CPUs, lower max_connections, end idle-in-transaction sessions",
    ),
    "XidGen": _Family(
        frozenset({"XidGen", "XidGenLock"}),
        "xid assignment serializes: many short write transactions",
        "batch writes into fewer transactions; a pooler limits how many run at once",
    ),
    "pg_xact": _slru_family(
        "pg_xact", "XactSLRU", "XactBuffer", "CLogControlLock", "CLogBuffer", "clog"
    ),
    "pg_subtrans": _slru_family(
        "pg_subtrans", "SubtransSLRU", "SubtransBuffer", "SubtransControlLock", "subtrans"
    ),
    "pg_multixact": _slru_family(
        "pg_multixact",
        "MultiXactOffsetSLRU",
        "MultiXactOffsetBuffer",
        "MultiXactMemberSLRU",
        "MultiXactMemberBuffer",
        "MultiXactGen",
        "MultiXactOffsetControlLock",
        "MultiXactMemberControlLock",
        "multixact_offset",
        "multixact_member",
    ),
    "pg_commit_ts": _slru_family(
        "pg_commit_ts", "CommitTsSLRU", "CommitTsBuffer", "CommitTs", "CommitTsControlLock"
    ),
    "pg_serial": _slru_family("pg_serial", "SerialSLRU", "SerialBuffer", "SerialControlLock"),
    "pg_notify": _slru_family("pg_notify", "NotifySLRU", "NotifyBuffer", "NotifyQueue"),
}
_TRANCHE_FAMILY = {t: name for name, fam in LWLOCK_FAMILIES.items() for t in fam.tranches}


@rule
def lwlock_tranches(doc: Doc) -> list[Finding]:
    """A tranche (family) holding a large share of LWLock wait time, with its meaning."""
    rows = section_rows(doc, "lwlocks")
    duration = duration_s(doc, "lwlocks")
    grand = sum(as_number(r.get("total_us")) for r in rows)
    if not rows or grand <= 0 or duration <= 0:
        return []
    fams: dict[str, dict[str, float]] = {}
    for r in rows:
        tranche = str(r.get("tranche", "?"))
        fam = _TRANCHE_FAMILY.get(tranche, tranche)
        fams.setdefault(fam, {})
        fams[fam][tranche] = fams[fam].get(tranche, 0.0) + as_number(r.get("total_us"))
    waits: dict[str, float] = {}
    for r in rows:
        fam = _TRANCHE_FAMILY.get(str(r.get("tranche", "?")), str(r.get("tranche", "?")))
        waits[fam] = waits.get(fam, 0.0) + as_number(r.get("waits"))
    active = avg_active(doc)
    out = []
    for fam, tranches in fams.items():
        total_us = sum(tranches.values())
        share = 100 * total_us / grand
        backends = total_us / 1e6 / duration  # average number of backends waiting
        if share < LWLOCK_SHARE_PCT or backends < LWLOCK_MIN_BACKENDS:
            continue
        if active:
            of_active = 100 * backends / active
            severity = severity_of(of_active, LWLOCK_HIGH_ACTIVE_PCT, LWLOCK_MEDIUM_ACTIVE_PCT)
            active_text = f"{fmt.pct(min(of_active, 100))} of the time backends were active"
        else:
            severity = severity_of(backends, LWLOCK_HIGH_BACKENDS, LWLOCK_MEDIUM_BACKENDS)
            active_text = ""
        names = sorted(tranches, key=lambda t: -tranches[t])
        label = ", ".join(names) if len(names) <= 3 else ", ".join(names[:3]) + ", ..."
        family = LWLOCK_FAMILIES.get(fam)
        if family is None:
            meaning = f"backends wait on the {fam} LWLock"
            step = (
                f"look up {fam} in PostgreSQL's wait event documentation (LWLock wait "
                "events) for what it protects; the flame graph shows the code around it"
            )
        else:
            meaning, step = family.meaning, family.next_step
        row_locks = row_lock_pct(doc)
        if fam == "LockManager" and row_locks >= WAIT_LOW_PCT:
            # Waiting for a row lock is a wait on a transactionid/tuple lock in the shared
            # lock table: its partitions' LWLocks are then busy whatever the fast path does.
            meaning = (
                f"the lock table is busy with row-lock waits ({fmt.pct(row_locks)} of active "
                "time waits on Lock:transactionid/tuple)"
            )
            step = (
                "fix the row lock contention first (see the wait events); if LockManager "
                "waits remain, " + step
            )
        if fam.startswith("pg_") and fam not in tranches:
            subject = f"on {fam}'s SLRU ({label})"
        else:
            subject = label
        detail = []
        for t in names:
            modes = [r for r in rows if r.get("tranche") == t]
            worst = max((as_number(r.get("p99_us")) for r in modes), default=0.0)
            detail.append(
                f"{t}: {fmt.n(sum(as_number(r.get('waits')) for r in modes))} waits, "
                f"{fmt.secs(tranches[t] / 1e6)}, p99 {fmt.n(worst)} us"
            )
        if fam == "ProcArray":
            max_conn = int(as_number(doc_meta(doc).get("max_connections")))
            detail.append(
                f"{fmt.n(max_clients(doc) or 0)} client connections "
                f"(max_connections {fmt.n(max_conn)})"
            )
        evidence = fmt.join(
            [
                f"{fmt.pct(share)} of {fmt.secs(grand / 1e6)} of LWLock wait time in "
                f"{fmt.secs(duration)} traced",
                f"{fmt.n(backends)} backends waiting on average"
                + (f" ({active_text}, {fmt.n(active or 0)} active on average)" if active else ""),
                *detail,
            ]
        )
        out.append(
            Finding(
                id=f"lwlock.{fam}",
                severity=severity or "low",
                title=f"{fmt.pct(share)} of LWLock wait time is {subject}: {meaning}",
                evidence=evidence,
                next_step=step,
                magnitude=share,
                section="lwlocks",
            )
        )
    return [_with_share(doc, f) for f in out]


def _with_share(doc: Doc, f: Finding) -> Finding:
    """The family's share of DB time: the client backends' LWLock waits on its tranches."""
    fam = f.id.removeprefix("lwlock.")
    family = LWLOCK_FAMILIES.get(fam)
    names = family.tranches if family else frozenset({fam})
    share = db_share(doc, lambda c: c.wait_event_type == "LWLock" and c.wait_event in names)
    return replace(f, share=share)
