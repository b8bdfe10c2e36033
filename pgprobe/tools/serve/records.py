"""What `pgprobe serve` keeps: running totals of the windows, bounded. No I/O.

Each window's snapshot (maps cleared by the script at every window, two buffers
taking turns: serve/probe.py) is added to
``Totals``: counters only grow, as Prometheus counters must, across tracer
restarts and server restarts. Label sets are bounded by what PostgreSQL has
(tranche names x 3 modes, 7 SLRUs; codes it has no name for folded: fold.py) and
histogram buckets by powers of two, so memory does not grow with time or with the
number of backends.

Histograms: the kernel's log2 buckets ([2^k, 2^(k+1)-1] ns) map exactly onto
Prometheus buckets with upper bounds 2^(k+1) ns (``le`` in seconds), from
``HIST_MIN_POW`` (waits shorter than 2^HIST_MIN_POW ns, 1 us, go to the first
bucket) to ``HIST_MAX_POW`` (longer ones to +Inf only).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pgprobe import waitevents
from pgprobe.engines.base import Log2Hist, Snapshot
from pgprobe.tools import clog_reads, lwlocks
from pgprobe.tools.queries import records as queries_records
from pgprobe.tools.serve.fold import Folder
from pgprobe.tools.waits import records as waits_records

# The time model's categories (pgprobe waits) as the `state` label of a wait event;
# Client:ClientRead carries the backend's own state (idle, idle in transaction, ...).
WAIT_STATE = {"wait": "active", "idle": "idle", "unknown": "unknown"}
WaitKey = tuple[str, str, str, str]  # wait_event_type, wait_event, backend_type, state

HIST_MIN_POW = 10  # 1.024 us
HIST_MAX_POW = 34  # 17.2 s


def bucket_pow(high: int) -> int:
    """The power of two just above a log2 bucket's highest value (high + 1 = 2^k)."""
    return max(HIST_MIN_POW, (high + 1).bit_length() - 1 if high >= 0 else 0)


@dataclass
class SourceState:
    """How one probe script is doing."""

    up: bool = False
    windows: int = 0
    restarts: int = 0
    lost_events: int = 0
    failed_map_updates: int = 0
    last_window_end: float = 0.0  # time.time() of the last snapshot
    last_window_s: float = 0.0
    observed_s: float = 0.0  # the windows' probes counted this long (duty cycle: in part)
    unavailable: str = ""  # why this server cannot feed it ("" : it can)


@dataclass
class Totals:
    """Every counter the agent exposes, summed over the windows."""

    lwlock_wait_ns: Counter[tuple[str, str]] = field(default_factory=Counter)  # tranche, mode
    lwlock_waits: Counter[tuple[str, str]] = field(default_factory=Counter)
    lwlock_hist: dict[str, Counter[int]] = field(default_factory=dict)  # tranche: pow: count
    slru_reads: Counter[str] = field(default_factory=Counter)  # pg_xact, pg_subtrans, ...
    slru_read_ns: Counter[str] = field(default_factory=Counter)
    cpu_samples: Counter[str] = field(default_factory=Counter)  # backend_type
    cpu_samples_without_stack: int = 0  # the stack map refused the stack, or the task was exiting
    cpu_hz: int = 0
    wait_ns: Counter[WaitKey] = field(default_factory=Counter)
    wait_sleeps: Counter[WaitKey] = field(default_factory=Counter)
    oncpu_ns: Counter[str] = field(default_factory=Counter)  # backend_type
    runqueue_ns: Counter[str] = field(default_factory=Counter)
    process_ns: Counter[str] = field(default_factory=Counter)  # wall time in the model
    # A window's time that a later read moves to another key (a sleep from before the
    # capture named at its end: records._minus) is taken from that key's next windows,
    # not from its counter: a Prometheus counter that goes down reads as a reset.
    owed_ns: Counter[tuple[str, ...]] = field(default_factory=Counter)
    sources: dict[str, SourceState] = field(default_factory=dict)
    server_restarts: int = 0
    # Wait event and tranche label values, unknown codes folded: the label sets stay bounded
    # whatever a backend publishes (fold.py).
    names: Folder = field(default_factory=Folder)
    # --statements N: seconds per query id and part (cpu, runqueue, a wait_event_type), for
    # at most STATEMENTS_TRACKED ids (the smallest forgotten), and per row kind for all.
    statement_ns: dict[int, Counter[str]] = field(default_factory=dict)
    statement_kind_ns: Counter[tuple[str, str]] = field(default_factory=Counter)
    statements_shown: int = 0  # N: the top N ids by DB time are series

    def source(self, name: str) -> SourceState:
        return self.sources.setdefault(name, SourceState())


def add_lwlock(totals: Totals, snapshot: Snapshot) -> int:
    """One window of lwlock_wait.bt; returns the waits in it."""
    return add_lwlock_records(totals, lwlocks.records(snapshot))


def add_lwlock_records(totals: Totals, recs: Iterable[lwlocks.WaitRecord]) -> int:
    """One window's LWLock records: lwlock_wait.bt's waits, or the time model's LWLock
    sleeps with the runqueue time after each (lwlocks.sleep_records, mode "unknown"); returns
    the waits in it."""
    waits = 0
    for rec in recs:
        tranche = totals.names.tranche(rec.tranche)
        key = (tranche, rec.mode)
        grow(totals, totals.lwlock_wait_ns, ("lwlock", *key), key, rec.total_ns)
        totals.lwlock_waits[key] += rec.waits
        waits += rec.waits
        add_hist(totals.lwlock_hist.setdefault(tranche, Counter()), rec.hist)
    return waits


def add_hist(into: Counter[int], hist: Log2Hist) -> None:
    for _low, high, count in hist.buckets:
        into[min(bucket_pow(high), HIST_MAX_POW + 1)] += count


def add_slru(totals: Totals, snapshot: Snapshot, own_pid: int) -> int:
    """One window of clog_reads.bt (aggregate mode); returns the reads in it.

    pgprobe's own session reads nothing (serve holds no connection while it
    traces), but a pid it names is left out all the same, as clog-reads does.
    """
    reads = 0
    for rec in clog_reads.records(snapshot):
        if rec.pid == own_pid:
            continue
        totals.slru_reads[rec.slru] += rec.reads
        totals.slru_read_ns[rec.slru] += rec.total_ns
        reads += rec.reads
    return reads


def add_time_model(totals: Totals, rows: Iterable[waits_records.Row]) -> None:
    """One window of waits.bt, as pgprobe waits' rows per process (by pid).

    A process's rows share its wall time (wall_ns); it is added once, with its
    on-CPU row (the first of each process). "not accounted" (near 0) is left out:
    process seconds minus the rest is that.
    """
    for row in rows:
        btype = row.backend_type or "unknown"
        if row.category == "on CPU":
            grow(totals, totals.oncpu_ns, ("on CPU", btype), btype, row.total_ns)
            totals.process_ns[btype] += row.wall_ns
        elif row.category == "runqueue":
            grow(totals, totals.runqueue_ns, ("runqueue", btype), btype, row.total_ns)
        elif row.category in WAIT_STATE:
            state = row.state or WAIT_STATE[row.category]
            key = (*totals.names.event(row.wait_event_type, row.wait_event), btype, state)
            grow(totals, totals.wait_ns, key, key, row.total_ns)
            totals.wait_sleeps[key] += row.sleeps


def grow(
    totals: Totals, counter: Counter[Any], owed_key: tuple[str, ...], key: Any, ns: int
) -> None:
    """counter[key] += ns, never below what it showed: a negative window is owed."""
    ns -= totals.owed_ns.pop(owed_key, 0)
    if ns < 0:
        totals.owed_ns[owed_key] = -ns
    elif ns:
        counter[key] += ns


STATEMENTS_TRACKED = 5000  # ids whose totals the agent keeps (memory bounded)


def add_statements(
    totals: Totals, rows: Iterable[queries_records.StatementTime], major: int
) -> None:
    """One window's time per statement (queries' rows): per query id, per part, and per row
    kind (statement, idle in transaction, no query id, outside statements) for all."""
    for row in rows:
        parts: Counter[str] = Counter()
        parts["cpu"] += row.cpu_ns
        parts["runqueue"] += row.preempted_ns + row.woken_ns
        for wei, ns in row.wait_ns.items():
            wait_type = totals.names.event(*waitevents.name(major, wei))[0]
            parts[wait_type] += ns
        for part, ns in parts.items():
            if ns > 0:
                totals.statement_kind_ns[row.kind, part] += ns
        if row.kind != queries_records.STATEMENT or row.query_id is None:
            continue
        mine = totals.statement_ns.setdefault(row.query_id, Counter())
        for part, ns in parts.items():
            if ns > 0:
                mine[part] += ns
    if len(totals.statement_ns) > STATEMENTS_TRACKED:
        ranked = sorted(totals.statement_ns, key=lambda q: -sum(totals.statement_ns[q].values()))
        for qid in ranked[STATEMENTS_TRACKED:]:
            del totals.statement_ns[qid]


def top_statements(totals: Totals) -> list[tuple[int, Counter[str]]]:
    """The statements_shown ids with the most DB time, most first."""
    ranked = sorted(totals.statement_ns.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    return ranked[: totals.statements_shown]
