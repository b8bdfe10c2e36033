"""SLRU reads: physical reads of pg_xact & co (clog_reads probe; pg_stat_slru as a fallback).

Also the advice per SLRU directory (``SLRU_ADVICE`` in full, ``SLRU_REMEDY`` in a few words),
which the LWLock rule reuses for the SLRU tranches.
"""

from __future__ import annotations

from typing import Any

from pgprobe.findings import fmt
from pgprobe.findings.base import Doc, Finding, rule, severity_of
from pgprobe.findings.document import (
    as_number,
    duration_s,
    section,
    section_rows,
)

# What the reads of each SLRU directory mean, and what to do about them.
SLRU_ADVICE = {
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


def slru_dir(name: str) -> str:
    """'pg_multixact/offsets' -> 'pg_multixact'; 'pg_clog' -> 'pg_xact'."""
    head = name.split("/")[0]
    return "pg_xact" if head == "pg_clog" else head


# The remedy in a few words, for the LWLock finding (the SLRU reads finding has it in full).
SLRU_REMEDY = {
    "pg_xact": "VACUUM recently written tables, end long transactions, more pg_xact buffers "
    "(transaction_buffers on 17+, shared_buffers on 13-16)",
    "pg_subtrans": "fewer subtransactions, shorter transactions (subtransaction_buffers on 17+)",
    "pg_multixact": "fewer shared row locks (multixact_*_buffers on 17+)",
    "pg_commit_ts": "track_commit_timestamp off if unused (commit_timestamp_buffers on 17+)",
    "pg_serial": "shorter serializable transactions (serializable_buffers on 17+)",
    "pg_notify": "listeners that keep up (notify_buffers on 17+)",
}


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
    stats = section(doc, "stats")
    if stats and isinstance(stats.get("slru"), list):
        rows = stats["slru"]
    else:
        clog = section(doc, "clog_reads")
        meta = clog.get("meta") if clog else None
        if isinstance(meta, dict) and isinstance(meta.get("slru_stats"), list):
            rows = meta["slru_stats"]
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if isinstance(r, dict) and r.get("slru"):
            key = slru_dir(str(r["slru"]))
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
    rows = section_rows(doc, "clog_reads")
    probe: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = slru_dir(str(r.get("slru") or r.get("file") or "?"))
        agg = probe.setdefault(key, {"reads": 0.0, "pids": set(), "max_us": 0.0, "files": set()})
        agg["reads"] += as_number(r.get("reads"))
        agg["pids"].add(r.get("pid"))
        if r.get("file"):  # rows of clog-reads' syscall source; its uprobe has no files
            agg["files"].add(r.get("file"))
            agg["max_us"] = max(agg["max_us"], as_number(r.get("max_us")))
    stats = _slru_stats(doc)
    clog_s = duration_s(doc, "clog_reads")
    stats_s = duration_s(doc)
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
        severity = severity_of(
            rate, SLRU_READS_HIGH_PER_S, SLRU_READS_MEDIUM_PER_S, SLRU_READS_LOW_PER_S
        )
        if severity is None:
            continue
        meaning, step = SLRU_ADVICE.get(slru, ("its buffers are too few", "see the stacks"))
        step = (
            f"{meaning}: {step}; search the flame graph for SimpleLruReadPage: its callers are "
            "the code that misses"
        )
        evidence = []
        if got and source == "probe":
            pids = len(got["pids"])
            who = f"{pids} backend" + ("s" if pids != 1 else "")
            title = f"{slru} reads: {fmt.n(rate)}/s from {who}"
            if got["files"]:
                evidence.append(
                    f"{fmt.n(got['reads'])} reads of {len(got['files'])} segment file"
                    + ("s" if len(got["files"]) != 1 else "")
                    + f" in {fmt.secs(clog_s)} (probe), slowest {fmt.n(got['max_us'])} us"
                )
            else:
                evidence.append(f"{fmt.n(got['reads'])} reads in {fmt.secs(clog_s)} (probe)")
        else:
            title = f"{slru} reads: {fmt.n(rate)}/s (pg_stat_slru)"
        if st:
            hit = st.get("hit_pct")
            if hit is None:
                hits = as_number(st.get("blks_hit"))
                hit = 100 * hits / (hits + st_reads) if hits + st_reads else None
            evidence.append(
                f"pg_stat_slru {st.get('name', slru)}: {fmt.n(st_reads)} blocks read, "
                f"{fmt.n(as_number(st.get('blks_hit')))} hit"
                + (f" ({fmt.pct(as_number(hit))} hit ratio)" if hit is not None else "")
                + (f" in {fmt.secs(stats_s)}" if stats_s else "")
            )
        thrash = "buffers thrashing" if slru != "pg_xact" else "clog buffers thrashing"
        out.append(
            Finding(
                id=f"slru.{slru}",
                severity=severity,
                title=f"{title} \N{EM DASH} {thrash}, see the stacks",
                evidence=fmt.join(evidence),
                next_step=step,
                magnitude=min(100.0, 100 * rate / SLRU_READS_HIGH_PER_S),
                section="slru",
            )
        )
    return out
