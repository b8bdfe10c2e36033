"""Findings: the rules that turn a triage document into plain advice a DBA can act on.

Input is the document `pgprobe triage --json` prints (see the README of `pgprobe triage`):
``meta``, ``lwlocks``, ``clog_reads``, ``hot``, ``flame``, ``activity`` and ``stats``, any of
which may be null when that part could not run (``meta.warnings`` then says why).

API
---

``evaluate(doc) -> list[Finding]``
    Run every rule of ``RULES`` on ``doc`` and return the findings, most severe first (then by
    magnitude). A rule that raises on unexpected data becomes an "info" finding naming the rule
    instead of failing the report. When no rule finds anything about the server (capture
    quality aside), the list holds one "info" finding saying that nothing stands out.

``Finding(id, severity, title, evidence, next_step, magnitude=0.0, section="")``
    ``severity`` is one of ``SEVERITIES`` ("high", "medium", "low", "info"); ``title`` is the
    one-line diagnosis, ``evidence`` the numbers behind it, ``next_step`` what to check or
    change. ``magnitude`` orders findings of equal severity (a percent-like size of the
    problem); ``section`` names the report section holding the data ("lwlocks", "slru",
    "waits", "cpu", "sql", "capture"). ``as_json()`` gives the dict stored in
    ``doc["findings"]``.

``findings(doc) -> list[Finding]``
    The same as ``evaluate(doc)``.

``findings_json(doc) -> list[dict]``
    ``[f.as_json() for f in evaluate(doc)]``: what goes into the document's ``findings``.

``render_text(findings) -> str``
    The findings as plain text for a terminal, one block each.

``section_reason(doc, name) -> str``
    Why the section ``name`` of ``doc`` is null: the warnings of ``meta.warnings`` that mention
    it, or "no reason was recorded".

Rules
-----
Each rule is a function ``doc -> list[Finding]`` registered with ``@rule`` in ``RULES``; they
read the document only through the small accessors below, which treat missing keys and null
sections as "no data". Thresholds are named constants next to the rule, with the reason for
the value. ``RULES`` order does not matter: ``evaluate`` sorts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pgprobe.render.flamegraph import strip_offset

SEVERITIES = ("high", "medium", "low", "info")
_RANK = {s: i for i, s in enumerate(SEVERITIES)}

SECTIONS = ("lwlocks", "clog_reads", "hot", "flame", "activity", "stats")
SECTION_TITLES = {
    "lwlocks": "LWLock waits",
    "clog_reads": "SLRU reads",
    "hot": "top functions (CPU)",
    "flame": "flame graph (CPU)",
    "activity": "wait-event sampling",
    "stats": "statistics deltas",
}
# What a warning about a section is likely to say (warnings are free text): whole words.
_SECTION_WORDS = {
    "lwlocks": re.compile(r"\b(lwlocks?|lwlock__wait\w*|usdt)\b", re.I),
    "clog_reads": re.compile(r"\b(clog[_-]reads?|clog|slru|pg_xact)\b", re.I),
    "hot": re.compile(r"\b(hot|profile|profiling|cpu sampl\w*|perf_event\w*)\b", re.I),
    "flame": re.compile(r"\b(flame|profile|profiling|cpu sampl\w*|perf_event\w*)\b", re.I),
    "activity": re.compile(r"\b(pg_stat_activity|activity|sampler)\b", re.I),
    "stats": re.compile(
        r"\b(stats|statistics|counters|pg_stat_(database|bgwriter|checkpointer|wal|slru|"
        r"statements))\b",
        re.I,
    ),
}


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what, the numbers that show it, and what to do next."""

    id: str
    severity: str
    title: str
    evidence: str
    next_step: str
    magnitude: float = 0.0
    section: str = ""

    def __post_init__(self) -> None:
        if self.severity not in _RANK:
            raise ValueError(f"severity must be one of {SEVERITIES}: {self.severity!r}")

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["magnitude"] = round(self.magnitude, 2)
        return data

    @property
    def about_capture(self) -> bool:
        """A note on the capture itself rather than on the server."""
        return self.id.startswith("capture.") or self.id.startswith("rule-error.")


Doc = Mapping[str, Any]
Rule = Callable[[Doc], list[Finding]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    """Register a rule (decorator)."""
    RULES.append(fn)
    return fn


# ---------------------------------------------------------------------------------------------
# Reading the document: missing keys and null sections are "no data", never an error.


def _section(doc: Doc, name: str) -> dict[str, Any] | None:
    value = doc.get(name)
    return value if isinstance(value, dict) else None


def _rows(doc: Doc, name: str) -> list[dict[str, Any]]:
    sec = _section(doc, name)
    rows = sec.get("rows") if sec else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def as_number(value: Any) -> float:
    """A number from a document field of any type (missing or malformed: 0)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _meta(doc: Doc) -> dict[str, Any]:
    meta = doc.get("meta")
    return meta if isinstance(meta, dict) else {}


def _duration(doc: Doc, section: str | None = None) -> float:
    """Seconds the section (or the whole capture) covered; 0 when unknown."""
    if section:
        sec = _section(doc, section)
        smeta = sec.get("meta") if sec else None
        if isinstance(smeta, dict) and as_number(smeta.get("duration_s")) > 0:
            return as_number(smeta["duration_s"])
    return as_number(_meta(doc).get("duration_s"))


def _stats(doc: Doc, name: str) -> dict[str, Any] | None:
    stats = _section(doc, "stats")
    value = stats.get(name) if stats else None
    return value if isinstance(value, dict) else None


def _activity_samples(doc: Doc) -> list[dict[str, Any]]:
    act = _section(doc, "activity")
    samples = act.get("samples") if act else None
    return [s for s in samples if isinstance(s, dict)] if isinstance(samples, list) else []


def _avg_active(doc: Doc) -> float | None:
    samples = _activity_samples(doc)
    if not samples:
        return None
    return sum(as_number(s.get("active")) for s in samples) / len(samples)


def _max_clients(doc: Doc) -> int | None:
    samples = _activity_samples(doc)
    return max(int(as_number(s.get("total"))) for s in samples) if samples else None


def _major(doc: Doc) -> int:
    num = int(as_number(_meta(doc).get("postgres_version_num")))
    return num // 10000 if num >= 100000 else num // 100


# ---------------------------------------------------------------------------------------------
# Formatting numbers in the words of a finding.


def _n(value: float) -> str:
    """3200 -> '3,200'; 2.5 -> '2.5'; 0.123 -> '0.12'."""
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:,.1f}"
    return f"{value:,.2f}".rstrip("0").rstrip(".") if value else "0"


def _pct(value: float) -> str:
    """61.3 -> '61 %'; 4.25 -> '4.2 %' (the issue's style: a space before %)."""
    return f"{value:.0f} %" if abs(value) >= 10 else f"{value:.1f} %"


def _secs(value: float) -> str:
    return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def _bytes(value: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"  # unreachable


def _join(parts: Iterable[str]) -> str:
    return "; ".join(p for p in parts if p)


def _severity(value: float, high: float, medium: float, low: float | None = None) -> str | None:
    """The severity of a value against its thresholds (None: below them all)."""
    if value >= high:
        return "high"
    if value >= medium:
        return "medium"
    if low is not None and value >= low:
        return "low"
    return None


def _at_most(severity: str, cap: str) -> str:
    return severity if _RANK[severity] >= _RANK[cap] else cap


# ---------------------------------------------------------------------------------------------
# LWLocks: which tranche the waits are on, and what that tranche means.

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


_SLRU_ADVICE = {
    "pg_xact": (
        "look-ups of old transactions' commit status miss the pg_xact (clog) buffers",
        "VACUUM the tables written recently so that hint bits spare the look-ups (VACUUM FREEZE "
        "for bulk-loaded ones), end long-running transactions, and give pg_xact more buffers: "
        "transaction_buffers on PostgreSQL 17+, shared_buffers/512 pages capped at 128 buffers "
        "(shared_buffers of 512MB or more) on 13-16; the flame graph shows which code looks "
        "them up",
    ),
    "pg_subtrans": (
        "look-ups of subtransaction parents miss the pg_subtrans buffers",
        "remove subtransactions from hot paths (SAVEPOINT, PL/pgSQL EXCEPTION blocks, driver "
        "autosave), keep them under 64 per transaction (snapshot overflow), end long "
        "transactions; subtransaction_buffers on PostgreSQL 17+",
    ),
    "pg_multixact": (
        "row locks shared by several transactions (multixacts) miss the pg_multixact buffers",
        "reduce shared row locks (SELECT ... FOR SHARE / FOR KEY SHARE, foreign-key checks on "
        "hot parent rows), watch multixact age (VACUUM); multixact_offset_buffers and "
        "multixact_member_buffers on PostgreSQL 17+",
    ),
    "pg_commit_ts": (
        "commit timestamp look-ups miss the pg_commit_ts buffers",
        "turn track_commit_timestamp off if nothing needs it; commit_timestamp_buffers on "
        "PostgreSQL 17+",
    ),
    "pg_serial": (
        "SERIALIZABLE transactions' conflict data spills to pg_serial",
        "shorten serializable transactions or use a weaker isolation level where safe; "
        "serializable_buffers on PostgreSQL 17+",
    ),
    "pg_notify": (
        "the LISTEN/NOTIFY queue is read from disk",
        "make listeners consume their notifications (a listener stuck in a transaction keeps "
        "the queue long); notify_buffers on PostgreSQL 17+",
    ),
}


def _slru_dir(name: str) -> str:
    """'pg_multixact/offsets' -> 'pg_multixact'; 'pg_clog' -> 'pg_xact'."""
    head = name.split("/")[0]
    return "pg_xact" if head == "pg_clog" else head


# The remedy in a few words, for the LWLock finding (the SLRU reads finding has it in full).
_SLRU_REMEDY = {
    "pg_xact": "VACUUM recently written tables, end long transactions, more pg_xact buffers "
    "(transaction_buffers on 17+, shared_buffers on 13-16)",
    "pg_subtrans": "fewer subtransactions, shorter transactions (subtransaction_buffers on 17+)",
    "pg_multixact": "fewer shared row locks (multixact_*_buffers on 17+)",
    "pg_commit_ts": "track_commit_timestamp off if unused (commit_timestamp_buffers on 17+)",
    "pg_serial": "shorter serializable transactions (serializable_buffers on 17+)",
    "pg_notify": "listeners that keep up (notify_buffers on 17+)",
}


def _slru_family(slru: str, *tranches: str) -> _Family:
    meaning = _SLRU_ADVICE[slru][0]
    return _Family(
        frozenset(tranches),
        "its buffers thrash, backends queue for pages being read in",
        f"{meaning}: the SLRU reads show which backends miss and how often; in short: "
        f"{_SLRU_REMEDY[slru]}",
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
    rows = _rows(doc, "lwlocks")
    duration = _duration(doc, "lwlocks")
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
    active = _avg_active(doc)
    out = []
    for fam, tranches in fams.items():
        total_us = sum(tranches.values())
        share = 100 * total_us / grand
        backends = total_us / 1e6 / duration  # average number of backends waiting
        if share < LWLOCK_SHARE_PCT or backends < LWLOCK_MIN_BACKENDS:
            continue
        if active:
            of_active = 100 * backends / active
            severity = _severity(of_active, LWLOCK_HIGH_ACTIVE_PCT, LWLOCK_MEDIUM_ACTIVE_PCT)
            active_text = f"{_pct(min(of_active, 100))} of the time backends were active"
        else:
            severity = _severity(backends, LWLOCK_HIGH_BACKENDS, LWLOCK_MEDIUM_BACKENDS)
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
        row_locks = _row_lock_pct(doc)
        if fam == "LockManager" and row_locks >= WAIT_LOW_PCT:
            # Waiting for a row lock is a wait on a transactionid/tuple lock in the shared
            # lock table: its partitions' LWLocks are then busy whatever the fast path does.
            meaning = (
                f"the lock table is busy with row-lock waits ({_pct(row_locks)} of active "
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
                f"{t}: {_n(sum(as_number(r.get('waits')) for r in modes))} waits, "
                f"{_secs(tranches[t] / 1e6)}, p99 {_n(worst)} us"
            )
        if fam == "ProcArray":
            max_conn = int(as_number(_meta(doc).get("max_connections")))
            detail.append(
                f"{_n(_max_clients(doc) or 0)} client connections (max_connections {_n(max_conn)})"
            )
        evidence = _join(
            [
                f"{_pct(share)} of {_secs(grand / 1e6)} of LWLock wait time in "
                f"{_secs(duration)} traced",
                f"{_n(backends)} backends waiting on average"
                + (f" ({active_text}, {_n(active or 0)} active on average)" if active else ""),
                *detail,
            ]
        )
        out.append(
            Finding(
                id=f"lwlock.{fam}",
                severity=severity or "low",
                title=f"{_pct(share)} of LWLock wait time is {subject}: {meaning}",
                evidence=evidence,
                next_step=step,
                magnitude=share,
                section="lwlocks",
            )
        )
    return out


def _row_lock_pct(doc: Doc) -> float:
    """Share of the sampled active time spent waiting on row locks (Lock:transactionid/tuple)."""
    act = _section(doc, "activity")
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


# ---------------------------------------------------------------------------------------------
# SLRU reads: physical reads of pg_xact & co (clog_reads probe; pg_stat_slru as a fallback).

# Reads per second of one SLRU. Each read happens while the backend holds the SLRU's lock, and
# a hit-only workload reads nothing: a thousand reads a second means the buffers are replaced
# continuously (thrashing) and other backends queue on the SLRU locks; a hundred is a real
# cost; ten is worth knowing about.
SLRU_READS_HIGH_PER_S = 1000.0
SLRU_READS_MEDIUM_PER_S = 100.0
SLRU_READS_LOW_PER_S = 10.0


def _slru_stats(doc: Doc) -> dict[str, dict[str, Any]]:
    """pg_stat_slru deltas per directory: stats.slru, else clog_reads.meta.slru_stats."""
    rows: list[Any] = []
    stats = _section(doc, "stats")
    if stats and isinstance(stats.get("slru"), list):
        rows = stats["slru"]
    else:
        clog = _section(doc, "clog_reads")
        meta = clog.get("meta") if clog else None
        if isinstance(meta, dict) and isinstance(meta.get("slru_stats"), list):
            rows = meta["slru_stats"]
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if isinstance(r, dict) and r.get("slru"):
            key = _slru_dir(str(r["slru"]))
            if key in out:  # pg_multixact offsets + members
                prev = out[key]
                out[key] = {
                    **prev,
                    "blks_hit": as_number(prev.get("blks_hit")) + as_number(r.get("blks_hit")),
                    "blks_read": as_number(prev.get("blks_read")) + as_number(r.get("blks_read")),
                }
            else:
                out[key] = dict(r)
    return out


@rule
def slru_reads(doc: Doc) -> list[Finding]:
    """SLRU pages read from disk at a high rate: the SLRU's buffers thrash."""
    rows = _rows(doc, "clog_reads")
    probe: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = _slru_dir(str(r.get("slru") or r.get("file") or "?"))
        agg = probe.setdefault(key, {"reads": 0.0, "pids": set(), "max_us": 0.0, "files": set()})
        agg["reads"] += as_number(r.get("reads"))
        agg["pids"].add(r.get("pid"))
        agg["files"].add(r.get("file"))
        agg["max_us"] = max(agg["max_us"], as_number(r.get("max_us")))
    stats = _slru_stats(doc)
    clog_s = _duration(doc, "clog_reads")
    stats_s = _duration(doc)
    out = []
    for slru in sorted(set(probe) | set(stats)):
        got = probe.get(slru)
        st = stats.get(slru)
        st_reads = as_number(st.get("blks_read")) if st else 0.0
        if got and clog_s > 0:
            rate = got["reads"] / clog_s
            source = "probe"
        elif st and stats_s > 0:
            rate = st_reads / stats_s
            source = "pg_stat_slru"
        else:
            continue
        severity = _severity(
            rate, SLRU_READS_HIGH_PER_S, SLRU_READS_MEDIUM_PER_S, SLRU_READS_LOW_PER_S
        )
        if severity is None:
            continue
        meaning, step = _SLRU_ADVICE.get(slru, ("its buffers are too few", "see the stacks"))
        step = (
            f"{meaning}: {step}; search the flame graph for SimpleLruReadPage: its callers are "
            "the code that misses"
        )
        evidence = []
        if got and source == "probe":
            pids = len(got["pids"])
            who = f"{pids} backend" + ("s" if pids != 1 else "")
            title = f"{slru} reads: {_n(rate)}/s from {who}"
            evidence.append(
                f"{_n(got['reads'])} reads of {len(got['files'])} segment file"
                + ("s" if len(got["files"]) != 1 else "")
                + f" in {_secs(clog_s)} (probe), slowest {_n(got['max_us'])} us"
            )
        else:
            title = f"{slru} reads: {_n(rate)}/s (pg_stat_slru)"
        if st:
            hit = st.get("hit_pct")
            if hit is None:
                hits = as_number(st.get("blks_hit"))
                hit = 100 * hits / (hits + st_reads) if hits + st_reads else None
            evidence.append(
                f"pg_stat_slru {st.get('name', slru)}: {_n(st_reads)} blocks read, "
                f"{_n(as_number(st.get('blks_hit')))} hit"
                + (f" ({_pct(as_number(hit))} hit ratio)" if hit is not None else "")
                + (f" in {_secs(stats_s)}" if stats_s else "")
            )
        thrash = "buffers thrashing" if slru != "pg_xact" else "clog buffers thrashing"
        out.append(
            Finding(
                id=f"slru.{slru}",
                severity=severity,
                title=f"{title} \N{EM DASH} {thrash}, see the stacks",
                evidence=_join(evidence),
                next_step=step,
                magnitude=min(100.0, 100 * rate / SLRU_READS_HIGH_PER_S),
                section="slru",
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# CPU: where the on-CPU samples go (flame graph stacks; the hot table as a fallback).

# Below about 2 CPU-seconds of samples (200 at 99 Hz) shares are too rough to act on.
CPU_MIN_SAMPLES = 200
# One function with a fifth of all CPU samples as its own (self) time is a hotspot.
CPU_FUNCTION_SELF_PCT = 20.0
# Snapshot building (GetSnapshotData and friends, in any frame) scales with the number of
# connections: a tenth of CPU there means the connection count costs real CPU.
SNAPSHOT_TOTAL_PCT = 10.0
# Spinning is pure waste; a few percent of CPU spinning already means contention.
SPIN_SELF_PCT = 5.0
# Hash table look-ups (lock table, buffer mapping, caches) as self time: a tenth is unusual.
HASH_SELF_PCT = 10.0
# Sorting under a fifth of the CPU is ordinary query work.
SORT_TOTAL_PCT = 20.0
# JIT compiling should be rare in OLTP: 5 % of CPU in LLVM is compile time paid per query.
JIT_TOTAL_PCT = 5.0
# Parsing and planning a quarter of the time: statements are not prepared (or plans not
# cached), a cost paid again on every execution.
PARSE_PLAN_TOTAL_PCT = 25.0
# Sending and receiving client messages as a third of CPU: tiny statements, a round trip each.
CLIENT_IO_SELF_PCT = 30.0


@dataclass(frozen=True)
class _Profile:
    samples: int
    stacks: list[tuple[list[str], int]]  # (frames root first, count); empty: use rows
    rows: list[dict[str, Any]]  # the hot table
    source: str

    def self_pct(self, rx: re.Pattern[str]) -> float:
        if self.stacks:
            hit = sum(n for frames, n in self.stacks if frames and rx.search(frames[-1]))
            return 100 * hit / self.samples
        return sum(as_number(r.get("self_pct")) for r in self.rows if rx.search(_fname(r)))

    def total_pct(self, rx: re.Pattern[str]) -> float:
        if self.stacks:
            hit = sum(n for frames, n in self.stacks if any(rx.search(f) for f in frames))
            return 100 * hit / self.samples
        # the hot table cannot tell overlaps apart: the largest matching row is a lower bound
        return max(
            (as_number(r.get("total_pct")) for r in self.rows if rx.search(_fname(r))), default=0
        )

    def top_self(self, rx: re.Pattern[str], n: int = 3) -> list[tuple[str, float]]:
        counts: dict[str, float] = {}
        if self.stacks:
            for frames, c in self.stacks:
                if frames and rx.search(frames[-1]):
                    counts[frames[-1]] = counts.get(frames[-1], 0) + 100 * c / self.samples
        else:
            for r in self.rows:
                if rx.search(_fname(r)):
                    counts[_fname(r)] = counts.get(_fname(r), 0) + as_number(r.get("self_pct"))
        return sorted(counts.items(), key=lambda kv: -kv[1])[:n]


def _fname(row: Mapping[str, Any]) -> str:
    return str(row.get("function") or "")


def _frame_name(frame: str) -> str:
    """'libc.so.6`__send' -> '__send'; 'ExecScan+0x1a' -> 'ExecScan'."""
    return strip_offset(frame.rsplit("`", 1)[-1])


def _profile(doc: Doc) -> _Profile | None:
    flame = _section(doc, "flame")
    folded = flame.get("folded") if flame else None
    if isinstance(folded, dict) and folded:
        stacks = [
            ([_frame_name(f) for f in str(k).split(";")], int(as_number(v)))
            for k, v in folded.items()
        ]
        samples = sum(n for _, n in stacks)
        if samples >= CPU_MIN_SAMPLES:
            return _Profile(samples, stacks, [], "flame graph stacks")
    hot = _section(doc, "hot")
    hmeta = hot.get("meta") if hot else None
    samples = int(as_number(hmeta.get("samples"))) if isinstance(hmeta, dict) else 0
    rows = _rows(doc, "hot")
    if rows and samples >= CPU_MIN_SAMPLES:
        return _Profile(samples, [], rows, "top functions table")
    return None


def _cpu_finding(
    profile: _Profile,
    fid: str,
    severity: str,
    share: float,
    title: str,
    evidence: str,
    step: str,
) -> Finding:
    return Finding(
        id=f"cpu.{fid}",
        severity=severity,
        title=title,
        evidence=_join([evidence, f"{_n(profile.samples)} CPU samples ({profile.source})"]),
        next_step=step,
        magnitude=share,
        section="cpu",
    )


def _listing(items: list[tuple[str, float]]) -> str:
    return ", ".join(f"{name} {_pct(p)}" for name, p in items)


_SNAPSHOT_RX = re.compile(
    r"^(GetSnapshotData|GetSnapshotDataReuse|GetSnapshotDataInitOldSnapshot|"
    r"ComputeXidHorizons|TransactionIdIsInProgress|ProcArrayEndTransaction|"
    r"ProcArrayGroupClearXid)$"
)
_SPIN_RX = re.compile(
    r"^(s_lock|perform_spin_delay|finish_spin_delay|spin_delay|pg_spin_delay|s_lock_stuck|"
    r"LWLockWaitListLock|LockBufHdr|WaitBufHdrUnlocked)$"
)
_HASH_RX = re.compile(
    r"^(hash_search|hash_search_with_hash_value|hash_bytes|hash_bytes_extended|hash_any|"
    r"hash_uint32|tag_hash|uint32_hash|string_hash|LockTagHashCode|hash_seq_search|"
    r"BufTableLookup|BufTableHashCode)$"
)
_SORT_RX = re.compile(
    r"(qsort|^tuplesort_|^comparetup_|^ApplySortComparator|^ApplySortAbbrevFullComparator|"
    r"^ssup_datum|^btint[248]fastcmp|^varstrfastcmp)"
)
_JIT_RX = re.compile(r"^(llvm|LLVM)|llvmjit|libLLVM|_\[j\]$")
_PARSE_PLAN_RX = re.compile(
    r"^(pg_parse_query|raw_parser|base_yyparse|parse_analyze\w*|pg_analyze_and_rewrite\w*|"
    r"pg_plan_queries|pg_plan_query|planner|standard_planner)$"
)
_CLIENT_IO_RX = re.compile(
    r"^(__send|send|__libc_send|sendto|__libc_sendto|recv|__libc_recv|recvfrom|"
    r"__libc_recvfrom|epoll_wait|__epoll_wait|poll|__poll|secure_read|secure_write|"
    r"secure_raw_read|secure_raw_write)$"
)


@rule
def cpu_patterns(doc: Doc) -> list[Finding]:
    """Known CPU patterns: snapshots with many connections, spinlocks, hashing, sorting, JIT,
    parsing and planning, client round trips."""
    profile = _profile(doc)
    if profile is None:
        return []
    out = []
    clients = _max_clients(doc)
    max_conn = int(as_number(_meta(doc).get("max_connections")))
    snap = profile.total_pct(_SNAPSHOT_RX)
    if snap >= SNAPSHOT_TOTAL_PCT:
        conns = (
            f"{_n(clients)} client connections (max_connections {_n(max_conn)})"
            if clients is not None
            else f"max_connections {_n(max_conn)}"
        )
        sev = "high" if snap >= 2 * SNAPSHOT_TOTAL_PCT else "medium"
        out.append(
            _cpu_finding(
                profile,
                "snapshots",
                sev,
                snap,
                f"CPU: {_pct(snap)} in GetSnapshotData and the process array with {conns}: "
                "use a pooler",
                f"{_pct(snap)} of CPU samples have a snapshot or process-array scan on the stack "
                f"({_listing(profile.top_self(_SNAPSHOT_RX))} as self time)",
                "every snapshot scans all connections: put a connection pooler (pgbouncer, "
                "transaction mode) in front and size it near the number of CPUs; lower "
                "max_connections; upgrading to PostgreSQL 14+ makes snapshots much cheaper",
            )
        )
    spin = profile.self_pct(_SPIN_RX)
    if spin >= SPIN_SELF_PCT:
        out.append(
            _cpu_finding(
                profile,
                "spinlocks",
                "high" if spin >= 3 * SPIN_SELF_PCT else "medium",
                spin,
                f"CPU: {_pct(spin)} spinning on spinlocks (s_lock / perform_spin_delay)",
                f"self time in {_listing(profile.top_self(_SPIN_RX))}",
                "search the flame graph for s_lock to see which lock spins (its callers: buffer "
                "headers of one hot page, the WAL insert position, a shared counter); fewer "
                "concurrent backends (a pooler) ease any of them",
            )
        )
    hashing = profile.self_pct(_HASH_RX)
    if hashing >= HASH_SELF_PCT:
        out.append(
            _cpu_finding(
                profile,
                "hashing",
                "medium",
                hashing,
                f"CPU: {_pct(hashing)} in hash table look-ups",
                f"self time in {_listing(profile.top_self(_HASH_RX))}",
                "see the callers in the flame graph: the lock table (many relations or "
                "partitions per query), buffer mapping (a working set larger than "
                "shared_buffers), or catalog caches (many tables, DDL invalidations)",
            )
        )
    sort = profile.total_pct(_SORT_RX)
    if sort >= SORT_TOTAL_PCT:
        out.append(
            _cpu_finding(
                profile,
                "sorting",
                "medium" if sort >= 2 * SORT_TOTAL_PCT else "low",
                sort,
                f"CPU: {_pct(sort)} sorting",
                f"{_pct(sort)} of CPU samples are in a sort "
                f"({_listing(profile.top_self(_SORT_RX)) or 'callees of the sort'})",
                "find the sorting statements (pg_stat_statements, EXPLAIN ANALYZE): an index "
                "matching ORDER BY / GROUP BY / DISTINCT avoids the sort; work_mem keeps large "
                "sorts in memory",
            )
        )
    jit = profile.total_pct(_JIT_RX)
    if jit >= JIT_TOTAL_PCT:
        out.append(
            _cpu_finding(
                profile,
                "jit",
                "medium" if jit >= 3 * JIT_TOTAL_PCT else "low",
                jit,
                f"CPU: {_pct(jit)} in JIT compilation (LLVM)",
                f"{_pct(jit)} of CPU samples have LLVM or JIT code on the stack",
                "short queries pay more to compile than they save: raise jit_above_cost (and "
                "jit_inline_above_cost, jit_optimize_above_cost) or set jit = off for OLTP "
                "roles; EXPLAIN (ANALYZE) shows the JIT time per query",
            )
        )
    parse = profile.total_pct(_PARSE_PLAN_RX)
    if parse >= PARSE_PLAN_TOTAL_PCT:
        out.append(
            _cpu_finding(
                profile,
                "parse-plan",
                "medium",
                parse,
                f"CPU: {_pct(parse)} parsing and planning statements: use prepared statements",
                f"{_pct(parse)} of CPU samples are in the parser, analyzer or planner "
                f"({_listing(profile.top_self(_PARSE_PLAN_RX))} as self time)",
                "prepare the hot statements once per connection (driver prepared statements, "
                "pgbench -M prepared, a pooler that supports them), so that each execution "
                "skips parsing and, with plan caching, planning",
            )
        )
    client = profile.self_pct(_CLIENT_IO_RX)
    if client >= CLIENT_IO_SELF_PCT:
        out.append(
            _cpu_finding(
                profile,
                "client-io",
                "low",
                client,
                f"CPU: {_pct(client)} in sending to and receiving from clients: many tiny "
                "round trips",
                f"self time in {_listing(profile.top_self(_CLIENT_IO_RX))}",
                "fewer round trips: batch statements, pipeline mode, do the loop in one "
                "statement or a function; check that clients are close to the server",
            )
        )
    return out


_KNOWN_CPU_RX = [_SNAPSHOT_RX, _SPIN_RX, _HASH_RX, _SORT_RX, _JIT_RX, _PARSE_PLAN_RX, _CLIENT_IO_RX]


@rule
def cpu_hot_function(doc: Doc) -> list[Finding]:
    """One function (not covered by a known pattern) with a large self share of CPU."""
    profile = _profile(doc)
    if profile is None:
        return []
    everything = re.compile(".")
    out = []
    for name, share in profile.top_self(everything, n=5):
        if share < CPU_FUNCTION_SELF_PCT:
            break
        if any(rx.search(name) for rx in _KNOWN_CPU_RX):
            continue
        unresolved = "+0x" in name or name.startswith("[")
        step = (
            "the function has no symbol: install the server's debug symbols to name it, then "
            "see its callers in the flame graph"
            if unresolved
            else f"search the flame graph for {name} to see which statements call it; "
            "pg_stat_statements shows the statements with the most time"
        )
        out.append(
            _cpu_finding(
                profile,
                f"function.{name}",
                "medium" if share >= 2 * CPU_FUNCTION_SELF_PCT else "low",
                share,
                f"CPU: {_pct(share)} of samples are in {name} itself",
                f"{name} is the innermost frame of {_pct(share)} of CPU samples",
                step,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# Wait events sampled from pg_stat_activity.

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
    if wtype == "IO" and event in ("DataFileRead", "DataFilePrefetch"):
        return "io-read", _WaitFamily(
            "data file reads",
            "the working set is larger than shared_buffers and the page cache",
            "backends wait for pages read from disk: check the cache hit ratio and the statements "
            "with most shared_blks_read "
            "(pg_stat_statements), add the missing indexes that turn scans into look-ups, "
            "raise shared_buffers or the machine's memory, check disk latency",
        )
    if wtype == "IO" and event.startswith("WAL"):
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
    act = _section(doc, "activity")
    profile = act.get("wait_profile") if act else None
    if not isinstance(profile, list):
        return []
    entries = [p for p in profile if isinstance(p, dict)]
    total = sum(as_number(p.get("samples")) for p in entries)
    n_samples = len(_activity_samples(doc))
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
        severity = _severity(share, WAIT_HIGH_PCT, WAIT_MEDIUM_PCT, WAIT_LOW_PCT)
        if severity is None:
            continue
        backends = samples / n_samples if n_samples else 0.0
        if backends < WAIT_MIN_BACKENDS:
            severity = _at_most(severity, "low")
        names = sorted(events, key=lambda e: -events[e])
        listing = ", ".join(f"{e} {_pct(100 * events[e] / total)}" for e in names[:4])
        out.append(
            Finding(
                id=f"wait.{key}",
                severity=severity,
                title=f"{_pct(share)} of active time waits on {fam.label} ({listing}): "
                f"{fam.meaning}",
                evidence=_join(
                    [
                        f"{_n(samples)} of {_n(total)} samples of active backends in "
                        f"{_n(n_samples)} pg_stat_activity snapshots ({_n(interval)} s apart)",
                        f"{_n(backends)} backends in these waits on average",
                    ]
                ),
                next_step=fam.next_step,
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
                title=f"{_pct(cpu_share)} of active time is on CPU (no wait event): the "
                "backends are CPU-bound",
                evidence=f"{_n(cpu)} of {_n(total)} samples of active backends had no wait "
                f"event; {_n(cpu_backends)} backends on CPU on average",
                next_step="the flame graph and the top functions show where the CPU goes; "
                "compare the active backends with the number of CPUs",
                magnitude=cpu_share,
                section="waits",
            )
        )
    return out


# ---------------------------------------------------------------------------------------------
# Statistics deltas (pg_stat_database, pg_stat_bgwriter/checkpointer, pg_stat_wal).

# Checkpoints requested (max_wal_size reached, or CHECKPOINT commands) in a window of seconds
# mean the WAL volume outruns max_wal_size; four a minute (one every 15 s) is back to back.
CHECKPOINT_REQ_HIGH_PER_MIN = 4.0


@rule
def checkpoints_requested(doc: Doc) -> list[Finding]:
    """Checkpoints requested in the window: WAL volume outruns max_wal_size."""
    bg = _stats(doc, "bgwriter") or {}
    cp = _stats(doc, "checkpointer") or {}
    if "num_requested" in cp or "num_timed" in cp:  # PostgreSQL 17+
        req, timed = as_number(cp.get("num_requested")), as_number(cp.get("num_timed"))
        written = as_number(cp.get("buffers_written"))
    else:
        req, timed = as_number(bg.get("checkpoints_req")), as_number(bg.get("checkpoints_timed"))
        written = as_number(bg.get("buffers_checkpoint"))
    duration = _duration(doc)
    if req <= 0 or duration <= 0:
        return []
    per_min = 60 * req / duration
    wal = _stats(doc, "wal") or {}
    wal_bytes, fpi, records = (
        as_number(wal.get("wal_bytes")),
        as_number(wal.get("wal_fpi")),
        as_number(wal.get("wal_records")),
    )
    evidence = [
        f"{_n(req)} requested and {_n(timed)} timed checkpoints in {_secs(duration)} "
        f"({_n(per_min)} a minute)",
        f"{_n(written)} buffers written by checkpoints" if written else "",
    ]
    if wal_bytes:
        evidence.append(f"WAL: {_bytes(wal_bytes / duration)}/s")
    if records and fpi:
        evidence.append(
            f"full-page images: {_n(fpi)} of {_n(records)} WAL records "
            f"({_pct(100 * fpi / records)})"
        )
    return [
        Finding(
            id="stats.checkpoints",
            severity="high" if per_min >= CHECKPOINT_REQ_HIGH_PER_MIN else "medium",
            title=f"{_n(req)} checkpoint{'s' if req != 1 else ''} requested in "
            f"{_secs(duration)}: the WAL volume outruns max_wal_size",
            evidence=_join(evidence),
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
    db = _stats(doc, "database") or {}
    files, size = as_number(db.get("temp_files")), as_number(db.get("temp_bytes"))
    duration = _duration(doc)
    if files <= 0 and size <= 0:
        return []
    rate = size / duration if duration else 0.0
    return [
        Finding(
            id="stats.temp-files",
            severity="medium" if rate >= TEMP_BYTES_MEDIUM_PER_S else "low",
            title=f"{_n(files)} temporary file{'s' if files != 1 else ''} "
            f"({_bytes(size)}) written: sorts or hashes spill beyond work_mem",
            evidence=f"pg_stat_database: temp_files {_n(files)}, temp_bytes {_bytes(size)} in "
            f"{_secs(duration)} ({_bytes(rate)}/s)",
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
    db = _stats(doc, "database") or {}
    n = as_number(db.get("deadlocks"))
    if n <= 0:
        return []
    return [
        Finding(
            id="stats.deadlocks",
            severity="high" if n >= DEADLOCKS_HIGH else "medium",
            title=f"{_n(n)} deadlock{'s' if n != 1 else ''} in {_secs(_duration(doc))}",
            evidence=f"pg_stat_database.deadlocks rose by {_n(n)}",
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
    db = _stats(doc, "database") or {}
    hit, read = as_number(db.get("blks_hit")), as_number(db.get("blks_read"))
    if hit + read < CACHE_MIN_BLOCKS or read <= 0:
        return []
    ratio = 100 * hit / (hit + read)
    if ratio >= CACHE_HIT_LOW_PCT:
        return []
    duration = _duration(doc)
    evidence = [
        f"pg_stat_database: {_n(read)} blocks read, {_n(hit)} hit in {_secs(duration)}"
        + (f" ({_bytes(read * BLCKSZ / duration)}/s from the OS or disk)" if duration else "")
    ]
    statements = (_section(doc, "stats") or {}).get("statements")
    if isinstance(statements, list):
        readers = [
            s for s in statements if isinstance(s, dict) and as_number(s.get("shared_blks_read"))
        ]
        if readers:
            top = max(readers, key=lambda s: as_number(s.get("shared_blks_read")))
            evidence.append(
                f"most blocks read: {_short(str(top.get('query', '')))} "
                f"({_n(as_number(top.get('shared_blks_read')))} blocks)"
            )
    return [
        Finding(
            id="stats.cache-hit",
            severity="medium" if ratio < CACHE_HIT_MEDIUM_PCT else "low",
            title=f"Cache hit ratio {_pct(ratio)}: the working set does not fit in shared_buffers",
            evidence=_join(evidence),
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
    bg = _stats(doc, "bgwriter") or {}
    if "buffers_backend" not in bg:  # PostgreSQL 17 moved it to pg_stat_io
        return []
    backend = as_number(bg.get("buffers_backend"))
    written = (
        backend
        + as_number(bg.get("buffers_clean"))
        + as_number(bg.get("buffers_checkpoint"))
        + as_number((_stats(doc, "checkpointer") or {}).get("buffers_written"))
    )
    if backend < BACKEND_WRITES_MIN or written <= 0:
        return []
    share = 100 * backend / written
    severity = _severity(share, 101.0, BACKEND_WRITES_MEDIUM_PCT, BACKEND_WRITES_LOW_PCT)
    if severity is None:
        return []
    maxwritten = as_number(bg.get("maxwritten_clean"))
    return [
        Finding(
            id="stats.backend-writes",
            severity=severity,
            title=f"Backends wrote {_pct(share)} of dirty buffers themselves: shared_buffers "
            "is short or the background writer lags",
            evidence=_join(
                [
                    f"pg_stat_bgwriter: buffers_backend {_n(backend)}, buffers_clean "
                    f"{_n(as_number(bg.get('buffers_clean')))}, buffers_checkpoint "
                    f"{_n(as_number(bg.get('buffers_checkpoint')))}",
                    f"buffers_alloc {_n(as_number(bg.get('buffers_alloc')))}",
                    f"bgwriter stopped at bgwriter_lru_maxpages {_n(maxwritten)} times"
                    if maxwritten
                    else "",
                ]
            ),
            next_step="raise shared_buffers; make the background writer do more "
            "(bgwriter_lru_maxpages, bgwriter_lru_multiplier, bgwriter_delay)",
            magnitude=share,
            section="sql",
        )
    ]


# WAL buffers full: a backend had to write WAL itself because wal_buffers were full. Any is
# worth knowing; ten a second means wal_buffers is clearly too small for the write rate.
WAL_BUFFERS_FULL_MEDIUM_PER_S = 10.0


@rule
def wal_buffers_full(doc: Doc) -> list[Finding]:
    wal = _stats(doc, "wal") or {}
    n = as_number(wal.get("wal_buffers_full"))
    if n <= 0:
        return []
    duration = _duration(doc)
    rate = n / duration if duration else 0.0
    return [
        Finding(
            id="stats.wal-buffers-full",
            severity="medium" if rate >= WAL_BUFFERS_FULL_MEDIUM_PER_S else "low",
            title=f"WAL buffers were full {_n(n)} times: backends wrote WAL themselves",
            evidence=f"pg_stat_wal.wal_buffers_full rose by {_n(n)} in {_secs(duration)} "
            f"({_n(rate)}/s); WAL {_bytes(as_number(wal.get('wal_bytes')))} in the window",
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
    db = _stats(doc, "database") or {}
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
            title=f"{_pct(share)} of transactions rolled back",
            evidence=f"pg_stat_database: {_n(rb)} rollbacks, {_n(commits)} commits in "
            f"{_secs(_duration(doc))}",
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
    clients = _max_clients(doc)
    max_conn = as_number(_meta(doc).get("max_connections"))
    if clients is None or max_conn <= 0:
        return []
    share = 100 * clients / max_conn
    if share < CONNECTIONS_NEAR_LIMIT_PCT:
        return []
    active = _avg_active(doc) or 0.0
    return [
        Finding(
            id="stats.connections",
            severity="medium",
            title=f"{_n(clients)} client connections of max_connections {_n(max_conn)}: "
            "new connections will be refused soon",
            evidence=f"at most {_n(clients)} client backends in pg_stat_activity, "
            f"{_n(active)} active on average",
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
    statements = (_section(doc, "stats") or {}).get("statements")
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
            title=f"One statement takes {_pct(share)} of statement time: "
            f"{_short(str(top.get('query', '')), 70)}",
            evidence=f"{_n(as_number(top.get('calls')))} calls, "
            f"{_n(as_number(top.get('total_ms')))} ms in total, "
            f"{_n(as_number(top.get('mean_ms')))} ms each "
            f"(pg_stat_statements, top {len(rows)} statements of the window)",
            next_step="EXPLAIN (ANALYZE, BUFFERS) it; if its time is waiting rather than "
            "running (see the wait events), look for the rows or locks it shares",
            magnitude=share,
            section="sql",
        )
    ]


# ---------------------------------------------------------------------------------------------
# Capture quality: what the evidence is worth.

# A flame graph with a fifth of its frames unnamed hides where the time goes.
UNRESOLVED_PCT = 20.0


@rule
def capture_sections(doc: Doc) -> list[Finding]:
    out = []
    for name in SECTIONS:
        if doc.get(name) is None:
            out.append(
                Finding(
                    id=f"capture.missing.{name}",
                    severity="low",
                    title=f"No {SECTION_TITLES[name]} in this report",
                    evidence=f"unavailable: {section_reason(doc, name)}",
                    next_step="run `pgprobe doctor` to see what this machine can trace, fix "
                    "it, and capture again",
                    section="capture",
                )
            )
    return out


@rule
def capture_losses(doc: Doc) -> list[Finding]:
    losses = _meta(doc).get("losses")
    if not isinstance(losses, dict):
        return []
    lost = {k: as_number(v) for k, v in losses.items() if as_number(v) > 0}
    if not lost:
        return []
    what = ", ".join(f"{_n(v)} {k}" for k, v in lost.items())
    return [
        Finding(
            id="capture.losses",
            severity="low",
            title=f"The capture lost events ({what}): its counts are lower bounds",
            evidence=f"meta.losses: {what}",
            next_step="capture for a shorter time, with a lower sampling rate (-F), or with "
            "fewer backends targeted (--pid) to stay within the kernel's buffers and maps",
            magnitude=sum(lost.values()),
            section="capture",
        )
    ]


def _truncated_stacks(profile: _Profile) -> dict[str, int]:
    """Samples whose stack ends in '[truncated: why]' (pgprobe.unwind.truncation), per why."""
    out: dict[str, int] = {}
    for frames, n in profile.stacks:
        root = frames[0] if frames else ""
        if root.startswith("[truncated: "):
            why = root.removeprefix("[truncated: ").removesuffix("]")
            out[why] = out.get(why, 0) + n
    return out


@rule
def capture_server_gone(doc: Doc) -> list[Finding]:
    """The server stopped, crashed or restarted mid-capture: the SQL side is cut short."""
    gone = _meta(doc).get("server_went_away")
    if not isinstance(gone, dict):
        return []
    kept = as_number(gone.get("sql_window_s"))
    return [
        Finding(
            id="capture.server_gone",
            severity="medium",
            title=f"{str(gone.get('what', 'the server went away')).capitalize()} during the "
            f"capture, at {gone.get('at', '?')}: the SQL sections stop there",
            evidence=f"{gone.get('reason', '')}; PostgreSQL's statistics and pg_stat_activity "
            f"cover the first {_secs(kept)} of {_secs(_duration(doc))}, the probes the whole "
            "window",
            next_step="read the server log around that time (a crash, an OOM kill, a shutdown "
            "or restart by an administrator), then capture again once it is back",
            section="capture",
        )
    ]


@rule
def capture_unresolved(doc: Doc) -> list[Finding]:
    pct = as_number(_meta(doc).get("unresolved_pct"))
    profile = _profile(doc)
    if pct < UNRESOLVED_PCT or profile is None:
        return []
    cut = _truncated_stacks(profile)
    if sum(cut.values()) >= 0.2 * profile.samples:
        reason, _ = max(cut.items(), key=lambda kv: kv[1])
        share = 100.0 * sum(cut.values()) / profile.samples
        return [
            Finding(
                id="capture.unresolved",
                severity="low",
                title=f"{_pct(share)} of CPU stacks are cut short ({reason}): "
                "the frame-pointer walk cannot pass code built without frame pointers",
                evidence=f"meta.unresolved_pct {_n(pct)}; {_n(sum(cut.values()))} of "
                f"{_n(profile.samples)} CPU samples end in [truncated: ...] frames",
                next_step="profile again with `pgprobe flame --unwind dwarf` (perf copies the "
                "stack and pgprobe unwinds it with .eh_frame): debug symbols would not help",
                magnitude=share,
                section="capture",
            )
        ]
    major = _major(doc)
    pkgs = (
        f"postgresql-{major}-dbgsym (Debian/Ubuntu, from the debug archive) or "
        f"postgresql{major}-server-debuginfo (RHEL/PGDG)"
        if major
        else "the server's debug symbols package"
    )
    return [
        Finding(
            id="capture.unresolved",
            severity="low",
            title=f"{_pct(pct)} of stack frames are unresolved (postgres+0x...): install the "
            "debug symbols",
            evidence=f"meta.unresolved_pct {_n(pct)} over {_n(profile.samples)} CPU samples; "
            f"server binary {_meta(doc).get('server_binary', '?')}",
            next_step=f"install {pkgs} and capture again: the flame graph and the top "
            "functions then name the server's static functions",
            magnitude=pct,
            section="capture",
        )
    ]


# ---------------------------------------------------------------------------------------------
# Evaluation.


def section_reason(doc: Doc, name: str) -> str:
    """Why section `name` is null: the warnings that mention it, or a plain default."""
    warnings = [str(w) for w in _meta(doc).get("warnings") or [] if w]
    rx = _SECTION_WORDS.get(name) or re.compile(rf"\b{re.escape(name)}\b", re.I)
    hits = [w for w in warnings if rx.search(w)]
    return "; ".join(hits) if hits else "no reason was recorded (meta.warnings says nothing)"


def _nothing_stands_out(doc: Doc) -> Finding:
    facts = []
    active = _avg_active(doc)
    if active is not None:
        facts.append(f"{_n(active)} backends active on average")
    lw = _rows(doc, "lwlocks")
    if lw or doc.get("lwlocks") is not None:
        total = sum(as_number(r.get("total_us")) for r in lw) / 1e6
        facts.append(f"{_secs(total)} of LWLock waits")
    flame = _section(doc, "flame")
    if flame:
        facts.append(f"{_n(as_number(flame.get('samples')))} CPU samples")
    db = _stats(doc, "database")
    duration = _duration(doc)
    if db and duration:
        facts.append(f"{_n(as_number(db.get('xact_commit')) / duration)} commits/s")
    return Finding(
        id="nothing",
        severity="info",
        title="Nothing stands out in this window",
        evidence=_join([*facts, f"in {_secs(duration)}" if duration else ""]),
        next_step="if users still see slowness, capture again while it happens, target the "
        "slow sessions (--pid), and check the client side (network, connection pool)",
        section="",
    )


def evaluate(doc: Doc) -> list[Finding]:
    """Every rule on `doc`; most severe first, then largest first."""
    found: list[Finding] = []
    for fn in RULES:
        try:
            found.extend(fn(doc))
        except Exception as exc:  # one odd value must not cost the whole report
            found.append(
                Finding(
                    id=f"rule-error.{fn.__name__}",
                    severity="info",
                    title=f"The rule {fn.__name__} could not read this document",
                    evidence=f"{type(exc).__name__}: {exc}",
                    next_step="report this to pgprobe's maintainers with the --json document",
                    section="capture",
                )
            )
    if not any(not f.about_capture for f in found):
        found.append(_nothing_stands_out(doc))
    found.sort(key=lambda f: (_RANK[f.severity], -f.magnitude, f.id))
    return found


def findings(doc: Doc) -> list[Finding]:
    """The same as evaluate(doc)."""
    return evaluate(doc)


def findings_json(doc: Doc) -> list[dict[str, Any]]:
    """What goes into the document's `findings`."""
    return [f.as_json() for f in evaluate(doc)]


def render_text(findings: Iterable[Finding]) -> str:
    """Findings as plain text for a terminal."""
    out = []
    for f in findings:
        out.append(f"[{f.severity.upper()}] {f.title}")
        if f.evidence:
            out.append(f"    evidence:  {f.evidence}")
        if f.next_step:
            out.append(f"    next step: {f.next_step}")
    return "\n".join(out) + ("\n" if out else "")
