"""CPU: where the on-CPU samples go (flame graph stacks; the hot table as a fallback).

``cpu_profile(doc)`` reads the samples once into a ``CpuProfile`` (self and total shares of
functions matching a pattern); the rules look for known costly patterns (snapshots with many
connections, spinlocks, hashing, sorting, JIT, parsing and planning, client round trips) and
for one hot function outside them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pgprobe.findings import fmt
from pgprobe.findings.base import Doc, Finding, rule
from pgprobe.findings.document import (
    as_number,
    doc_meta,
    max_clients,
    section,
    section_rows,
)
from pgprobe.findings.timemodel import db_share
from pgprobe.stacks import function_name

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
class CpuProfile:
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


def cpu_profile(doc: Doc) -> CpuProfile | None:
    flame = section(doc, "flame")
    folded = flame.get("folded") if flame else None
    if isinstance(folded, dict) and folded:
        stacks = [
            ([function_name(f) for f in str(k).split(";")], int(as_number(v)))
            for k, v in folded.items()
        ]
        samples = sum(n for _, n in stacks)
        if samples >= CPU_MIN_SAMPLES:
            return CpuProfile(samples, stacks, [], "flame graph stacks")
    hot = section(doc, "hot")
    hmeta = hot.get("meta") if hot else None
    samples = int(as_number(hmeta.get("samples"))) if isinstance(hmeta, dict) else 0
    rows = section_rows(doc, "hot")
    if rows and samples >= CPU_MIN_SAMPLES:
        return CpuProfile(samples, [], rows, "top functions table")
    return None


def _cpu_finding(
    profile: CpuProfile,
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
        evidence=fmt.join([evidence, f"{fmt.n(profile.samples)} CPU samples ({profile.source})"]),
        next_step=step,
        magnitude=share,
        section="cpu",
    )


def _listing(items: list[tuple[str, float]]) -> str:
    return ", ".join(f"{name} {fmt.pct(p)}" for name, p in items)


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
    profile = cpu_profile(doc)
    if profile is None:
        return []
    out = []
    clients = max_clients(doc)
    max_conn = int(as_number(doc_meta(doc).get("max_connections")))
    snap = profile.total_pct(_SNAPSHOT_RX)
    if snap >= SNAPSHOT_TOTAL_PCT:
        conns = (
            f"{fmt.n(clients)} client connections (max_connections {fmt.n(max_conn)})"
            if clients is not None
            else f"max_connections {fmt.n(max_conn)}"
        )
        sev = "high" if snap >= 2 * SNAPSHOT_TOTAL_PCT else "medium"
        out.append(
            _cpu_finding(
                profile,
                "snapshots",
                sev,
                snap,
                f"CPU: {fmt.pct(snap)} in GetSnapshotData and the process array with {conns}: "
                "use a pooler",
                f"{fmt.pct(snap)} of CPU samples have a snapshot or process-array scan on the "
                "stack "
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
                f"CPU: {fmt.pct(spin)} spinning on spinlocks (s_lock / perform_spin_delay)",
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
                f"CPU: {fmt.pct(hashing)} in hash table look-ups",
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
                f"CPU: {fmt.pct(sort)} sorting",
                f"{fmt.pct(sort)} of CPU samples are in a sort "
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
                f"CPU: {fmt.pct(jit)} in JIT compilation (LLVM)",
                f"{fmt.pct(jit)} of CPU samples have LLVM or JIT code on the stack",
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
                f"CPU: {fmt.pct(parse)} parsing and planning statements: use prepared statements",
                f"{fmt.pct(parse)} of CPU samples are in the parser, analyzer or planner "
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
                f"CPU: {fmt.pct(client)} in sending to and receiving from clients: many tiny "
                "round trips",
                f"self time in {_listing(profile.top_self(_CLIENT_IO_RX))}",
                "fewer round trips: batch statements, pipeline mode, do the loop in one "
                "statement or a function; check that clients are close to the server",
            )
        )
    return _with_share(doc, out)


_KNOWN_CPU_RX = [_SNAPSHOT_RX, _SPIN_RX, _HASH_RX, _SORT_RX, _JIT_RX, _PARSE_PLAN_RX, _CLIENT_IO_RX]


@rule
def cpu_hot_function(doc: Doc) -> list[Finding]:
    """One function (not covered by a known pattern) with a large self share of CPU."""
    profile = cpu_profile(doc)
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
                f"CPU: {fmt.pct(share)} of samples are in {name} itself",
                f"{name} is the innermost frame of {fmt.pct(share)} of CPU samples",
                step,
            )
        )
    return _with_share(doc, out)


def _with_share(doc: Doc, found: list[Finding]) -> list[Finding]:
    """Each finding's share of DB time: its share of the CPU samples times the on-CPU share
    of the active time (the samples are of the traced processes: an estimate)."""
    on_cpu = db_share(doc, lambda c: c.category == "on CPU")
    if on_cpu is None:
        return found
    return [replace(f, share=f.magnitude * on_cpu / 100) for f in found]
