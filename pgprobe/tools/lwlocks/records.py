"""What comes back from `pgprobe lwlocks`: wait records per (pid, tranche, mode), and rows.

The kernel times every wait and keeps, per (pid, tranche, mode), the count, the
total, the max and a log2 histogram; rows are those grouped per (tranche, mode) or
per (pid, tranche, mode), sorted by total wait time, with percentiles estimated from
the histogram. From the SCHED source the records are the LWLock-class sleeps of the
time model: with the compiled object (bpf/waits.bpf.c) each sleep with the runqueue time
right after its wakeup (woken, not yet running: the wait event still set, as
pg_stat_activity shows it), and the mode waited for (MyProc->lwWaitMode): whole waits
but for the queueing and spinning before the sleep; with bpf/waits.bt the sleeps alone
(switch-out to wakeup), mode unknown. Pure functions, no I/O.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pgprobe import histogram, waitevents
from pgprobe.discover import Targets
from pgprobe.engines.base import Log2Hist, Snapshot, Stats
from pgprobe.tools.lwlocks.probe import MAPS
from pgprobe.tools.waits import records as waits_records
from pgprobe.waitevents import lwmode

# Unfinished waits beyond this and beyond 5 % of the waits: the done probe missed some.
UNFINISHED_MIN = 10
UNFINISHED_SHARE = 0.05
# What the SCHED source measures, as the title and meta.title say it: whole waits from
# the compiled object, sleeps from the script.
WAITS_TITLE = "LWLock waits from the scheduler (each sleep and the runqueue time after it)"
SLEEPS_TITLE = "LWLock sleeps (from the scheduler: sleeps, not waits; mode unknown)"


@dataclass(frozen=True)
class WaitRecord:
    """What the kernel aggregated for one (pid, tranche, mode)."""

    pid: int
    tranche: str
    mode: str
    waits: int
    total_ns: int
    max_ns: int
    hist: Log2Hist
    runq_ns: int | None = None  # of total_ns: runqueue after wakeups (None: not measured)
    # of total_ns: the sleeps that ended in the window, AVG's numerator (None: all of it)
    ended_ns: int | None = None


@dataclass(frozen=True)
class WaitRow:
    """One line of the table (and one JSON row)."""

    tranche: str
    mode: str
    waits: int
    total_ns: int
    max_ns: int
    hist: Log2Hist
    share: float  # of all wait time in the snapshot, 0..1
    pid: int | None = None
    backend_type: str = ""
    application_name: str = ""
    runq_ns: int | None = None  # of total_ns: runqueue after wakeups (None: not measured)
    ended_ns: int | None = None  # of total_ns: the sleeps that ended (None: all of it)

    @property
    def avg_ns(self) -> float | None:
        """Per wait that ended: a sleep still under way at the read is in the total, not
        in the count (sched source)."""
        if not self.waits:
            return None
        return (self.total_ns if self.ended_ns is None else self.ended_ns) / self.waits

    def percentile_us(self, fraction: float) -> float:
        return histogram.percentile(self.hist, fraction, self.max_ns) / 1000

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {}
        if self.pid is not None:
            row.update(
                pid=self.pid,
                backend_type=self.backend_type,
                application_name=self.application_name,
            )
        row.update(
            tranche=self.tranche,
            mode=self.mode,
            waits=self.waits,
            total_us=round(self.total_ns / 1000, 3),
            avg_us=None if self.avg_ns is None else round(self.avg_ns / 1000, 3),
            p50_us=round(self.percentile_us(0.50), 3),
            p95_us=round(self.percentile_us(0.95), 3),
            p99_us=round(self.percentile_us(0.99), 3),
            max_us=round(self.max_ns / 1000, 3),
            share_pct=round(100 * self.share, 2),
        )
        if self.runq_ns is not None:
            row["runq_us"] = round(self.runq_ns / 1000, 3)
        return row


def unmatched_warning(snapshot: Snapshot) -> str | None:
    """Waits that started and never ended in the probe: a site that did not attach.

    Every lwlock__wait__start is followed by an lwlock__wait__done in the same
    backend. A backend caught mid-wait when the probes attach leaves one
    unfinished wait at most; many more mean the done probe is not attached
    everywhere (e.g. another uprobe without the USDT semaphore on one of its
    sites): those waits are missing from the table, so say it.
    """
    unfinished = snapshot.get("wait_unfinished").get((), 0)
    assert isinstance(unfinished, int)
    waits = sum(v.count for v in snapshot.get("wait_stats").values() if isinstance(v, Stats))
    never_done = waits == 0 and unfinished > 1  # the done probe never fired at all
    many = unfinished > UNFINISHED_MIN and unfinished > UNFINISHED_SHARE * (waits + unfinished)
    if not (never_done or many):
        return None
    return (
        f"{unfinished:,} LWLock waits started and never ended in the probe "
        f"(lwlock__wait__done fired for {waits:,}): they are missing from the table; a probe "
        "site did not attach or stopped firing (`pgprobe doctor` lists other uprobes on the "
        "server's probe sites)"
    )


def sleeps_warning(snapshot: Snapshot) -> str | None:
    """Scheduler events bpf/waits.bt knows it missed (the sleeps' figures are short)."""
    unseen = waits_records.unseen(snapshot)
    return waits_records.lost_warning(unseen, waits_records.gap_ns(snapshot) / 1e6)


def records(snapshot: Snapshot) -> list[WaitRecord]:
    stats, maxes, hists = (snapshot.get(m.name) for m in MAPS[:3])
    out = []
    for key, value in stats.items():
        assert isinstance(value, Stats)
        pid, tranche, mode = key
        max_ns = maxes.get(key, 0)
        hist = hists.get(key, Log2Hist(()))
        assert isinstance(max_ns, int) and isinstance(hist, Log2Hist)
        assert isinstance(pid, int) and isinstance(tranche, str) and isinstance(mode, str)
        out.append(WaitRecord(pid, tranche, mode, value.count, value.total, max_ns, hist))
    return out


def measures_waits(snapshot: Snapshot) -> bool:
    """Whether a time-model snapshot has the runqueue time after each sleep (whole waits:
    the compiled object's), or the sleeps alone (the script's)."""
    return waits_records.woken_after_measured(snapshot)


def sched_meta(snapshot: Snapshot, modes_read: bool) -> dict[str, str]:
    """The scheduler source's words in meta: what it measured, the modes, the title."""
    if measures_waits(snapshot):
        mode = "read" if modes_read else "unknown"
        return {"measures": "sleep and runqueue after", "mode": mode, "title": WAITS_TITLE}
    return {"measures": "sleeps", "mode": "unknown", "title": SLEEPS_TITLE}


def _sleep_ns(snapshot: Snapshot | None, woken: bool = False) -> dict[tuple[int, int], int]:
    """(tid, wait_event_info) -> ns asleep: @wait_ns plus the running totals in @task and
    the sleep under way at the read, as the time model charges them (woken: the runqueue
    time after those sleeps instead)."""
    out = waits_records.pending_waits(snapshot, woken)
    for pair, open_ns in waits_records.open_waits(snapshot, woken).items():
        out[pair] = out.get(pair, 0) + open_ns
    name = waits_records.WOKEN_AFTER_MAP if woken else "wait_ns"
    for key, ns in (snapshot.get(name) if snapshot is not None else {}).items():
        tid, wei = key
        assert isinstance(tid, int) and isinstance(wei, int) and isinstance(ns, int)
        out[(tid, wei)] = out.get((tid, wei), 0) + ns
    return out


def sleep_records(
    snapshot: Snapshot, major: int, clipped: bool, previous: Snapshot | None = None
) -> list[WaitRecord]:
    """The LWLock-class sleeps of a time-model snapshot, as WaitRecords.

    waits = complete sleeps (the histogram's count); total = the sleep time charged in
    the window, with the runqueue time after each (runq_ns) when measured (the compiled
    object: its histogram is of the two together too, and its mode is read); max = the top
    bound of the highest histogram
    bucket (waits.bt keeps no exact max): an upper bound within 2x, and at
    most the total unless `clipped` (with --interval a sleep that began in an
    earlier window is longer than the time charged to this one). With --interval
    waits.bt prints running totals: a window is this snapshot minus `previous`.
    """
    classes = waitevents.table(major)["classes"]
    lwlock_class = next(int(c) for c, name in classes.items() if name == "LWLock")
    hists = snapshot.get("wait_hist")
    before_hists = previous.get("wait_hist") if previous is not None else {}
    # waits.bt keeps a live task's time in its last wait event in @task, not @wait_ns
    charged, before = _sleep_ns(snapshot), _sleep_ns(previous)
    whole = measures_waits(snapshot)
    woken, woken_before = _sleep_ns(snapshot, True), _sleep_ns(previous, True)
    # A task sleeps once at a time: an open sleep that began in the window is the part of
    # the total not yet a wait; one that began before it is all of this window's total.
    under_way = waits_records.open_waits(snapshot)
    under_way_woken = waits_records.open_waits(snapshot, True)
    out = []
    for key in charged.keys() | woken.keys():
        tid, wei = key
        if wei >> 24 != lwlock_class:
            continue
        runq = woken.get(key, 0) - woken_before.get(key, 0)
        total = charged.get(key, 0) - before.get(key, 0) + runq
        hist = hists.get(key, Log2Hist(()))
        old = before_hists.get(key, Log2Hist(()))
        assert isinstance(hist, Log2Hist) and isinstance(old, Log2Hist)
        hist = waits_records.hist_minus(hist, old)
        if total <= 0 and not hist.count:
            continue
        top = max((high for _, high, count in hist.buckets if count), default=0)
        top = top if clipped else min(top, total)
        tranche = waitevents.name(major, wei)[1]
        ended = max(0, total - under_way.get(key, 0) - under_way_woken.get(key, 0))
        out.append(WaitRecord(tid, tranche, lwmode.mode(wei), hist.count, total, top, hist,
                              runq if whole else None, ended))  # fmt: skip
    return out


def _ended_ns(group: list[WaitRecord]) -> int | None:
    """The group's time in sleeps that ended (None: every record's total is)."""
    if all(r.ended_ns is None for r in group):
        return None
    return sum(r.total_ns if r.ended_ns is None else r.ended_ns for r in group)


def rows(recs: Iterable[WaitRecord], targets: Targets, by_pid: bool) -> list[WaitRow]:
    """Records of the targets, grouped per (tranche, mode) or per (pid, tranche, mode)."""
    wanted = None if targets.whole_cluster else set(targets.pids)
    groups: dict[tuple[int | None, str, str], list[WaitRecord]] = defaultdict(list)
    for rec in recs:
        if wanted is not None and rec.pid and rec.pid not in wanted:
            continue
        groups[(rec.pid if by_pid else None, rec.tranche, rec.mode)].append(rec)
    grand_total = sum(r.total_ns for group in groups.values() for r in group)
    out = []
    for (pid, tranche, mode), group in groups.items():
        total = sum(r.total_ns for r in group)
        runq = [r.runq_ns for r in group]
        backend = targets.describe(pid) if pid is not None else None
        out.append(
            WaitRow(
                tranche=tranche,
                mode=mode,
                waits=sum(r.waits for r in group),
                total_ns=total,
                max_ns=max(r.max_ns for r in group),
                hist=histogram.merge(r.hist for r in group),
                share=total / grand_total if grand_total else 0.0,
                pid=pid,
                backend_type=backend.backend_type if backend else "",
                application_name=backend.application_name if backend else "",
                runq_ns=None if None in runq else sum(n or 0 for n in runq),
                ended_ns=_ended_ns(group),
            )
        )
    out.sort(key=lambda r: (-r.total_ns, r.tranche, r.mode, r.pid or 0))
    return out
