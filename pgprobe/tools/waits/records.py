"""What bpf/waits.bt hands back, and the time model shown: pure functions, no I/O.

Kept in one module (~500 lines) because the time model is one computation: states of @task,
running totals, open intervals and interval differences must agree line by line.

snapshot -> ProcessTime per process (what the kernel measured, plus the
intervals still open when the maps were printed) -> Rows (one per component
of the time model, per process or for the whole cluster).

Time model of a process over the window (its wall time: the window, or its
part of it from fork or to exit) = on CPU + runqueue (runnable, waiting for a
CPU: preempted, or woken and not yet running) + off CPU per wait event
+ asleep since before the capture (event unknown) + not accounted (the rest;
near 0 unless a process ran unseen).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from pgprobe import histogram, waitevents
from pgprobe.engines.base import Log2Hist, Snapshot
from pgprobe.waitevents import backend_state

# @task states (bpf/waits.bt)
ON_CPU, PREEMPTED, WOKEN, ASLEEP, PENDING_WOKEN, PENDING_ON_CPU, NOT_OURS = 1, 2, 3, 4, 5, 6, 9
LOST_TRACK, PENDING_LOST_TRACK = 7, 8  # its CPU's events stopped being seen: not charged
# @task's fields 9 and 10 from the compiled object (compiled._closed): the runqueue time
# after the sleeps of its running total (field 7's event), then after its open sleep
# (field 2's), both already in field 6 (woken). waits.bt's field 9 is the kernel's count of
# the task's runs it expects (none of the two: an entry of 10 fields)
WOKEN_AFTER = 9


def _from_object(task: tuple[object, ...]) -> bool:
    """Whether an @task entry is the compiled object's (it has fields 9 and 10)."""
    return len(task) >= WOKEN_AFTER + 2


# The compiled object's map of the same: (tid, wait_event_info) -> the runqueue time right
# after the sleeps moved to @wait_ns (compiled.read writes it; waits.bt has none)
WOKEN_AFTER_MAP = "wait_rq_ns"
# @runq_ns's third kind: runnable since before the capture as far as the script saw (its
# first event a switch-in). Runqueue time (WOKEN), unless pgprobe read the process asleep
# before the capture and it has not run since: then its wakeup was lost and it is that sleep.
RUNNABLE_AT_START = 4

CATEGORY_ORDER = ("on CPU", "runqueue", "wait", "idle", "unknown", "not accounted")


@dataclass
class ProcessTime:
    """One process's measured time in the window, in ns."""

    pid: int
    wall_ns: int
    cpu_ns: int = 0
    runq_ns: dict[int, int] = field(default_factory=dict)  # how (2 preempted, 3 woken) -> ns
    wait_ns: dict[int, int] = field(default_factory=dict)  # wait_event_info -> ns
    wait_hist: dict[int, Log2Hist] = field(default_factory=dict)  # complete sleeps
    # wait_event_info -> the runqueue time right after its sleeps (woken, not yet running,
    # the event still set): a part of runq_ns[WOKEN], known from the compiled object only
    woken_after_ns: dict[int, int] = field(default_factory=dict)
    woken_after_known: bool = False  # measured (the compiled object), even when none
    born: bool = False  # forked during the window
    exited: bool = False  # exited during the window

    @property
    def accounted_ns(self) -> int:
        return self.cpu_ns + sum(self.runq_ns.values()) + sum(self.wait_ns.values())


def _ints(snapshot: Snapshot, name: str) -> dict[int, int]:
    out = {}
    for key, value in snapshot.get(name).items():
        if isinstance(value, int) and key and isinstance(key[0], int):
            out[key[0]] = value
    return out


def _scalar(snapshot: Snapshot, name: str) -> int:
    value = snapshot.get(name).get(())
    return value if isinstance(value, int) else 0


# waits.bt's maps are running totals in interval mode (nothing cleared, so no time falls
# between two windows) and keep every process until the tracer ends: a cluster whose
# connections come and go would fill them (BPFTRACE_MAP_KEYS_MAX, 65,536 keys per map, ~5
# keys per process in the largest). Past this many exited processes `pgprobe waits
# --interval` and serve start the tracer again, and say so in one line.
RECYCLE_AFTER_EXITED = 2000


def exited(snapshot: Snapshot) -> int:
    """How many processes the tracer's maps hold after their exit."""
    return len(snapshot.get("exit_ns"))


def window(snapshot: Snapshot, previous: Snapshot | None = None) -> tuple[int, int]:
    """(start_ns, end_ns) of the window since previous (else since the capture began).

    On the kernel's monotonic clock. The maps are cumulative: a window starts
    at the previous snapshot's @now_ns.
    """
    start = _scalar(previous, "now_ns") if previous else _scalar(snapshot, "window_ns")
    return start, _scalar(snapshot, "now_ns")


def continues(previous: Snapshot | None, snapshot: Snapshot) -> Snapshot | None:
    """previous, when snapshot's maps count on from it (the same capture: the same
    @window_ns); None when snapshot is a new capture's (serve's duty cycle attaches the
    time model afresh for a part of each window), whose maps start from zero."""
    if previous is None or _scalar(previous, "window_ns") != _scalar(snapshot, "window_ns"):
        return None
    return previous


def keep_asleep(
    snapshot: Snapshot, slept_in: dict[int, int], asleep_at_start: dict[int, tuple[int, int]]
) -> None:
    """Keep in the snapshot what was known at its read of the sleeps begun before the
    capture (records()' slept_in and asleep_at_start), for asleep_before()."""
    snapshot.maps["slept_in"] = {(pid,): wei for pid, wei in slept_in.items()}
    snapshot.maps["asleep_at_start"] = {(pid,): at for pid, at in asleep_at_start.items()}


def asleep_before(
    snapshot: Snapshot,
) -> tuple[dict[int, int] | None, dict[int, tuple[int, int]] | None]:
    """(slept_in, asleep_at_start) as keep_asleep() kept them in the snapshot (pgprobe
    waits, from pg_stat_activity), for records(); (None, None) when none was kept."""
    if "asleep_at_start" not in snapshot.maps:
        return None, None
    slept_in = {int(str(k[0])): v for k, v in snapshot.get("slept_in").items()
                if isinstance(v, int)}  # fmt: skip
    at_start = {int(str(k[0])): (int(v[0]), int(v[1])) for k, v in
                snapshot.get("asleep_at_start").items() if isinstance(v, tuple)}  # fmt: skip
    return slept_in, at_start


def _unseen_by(snapshot: Snapshot | None) -> dict[tuple[int, int], int]:
    out = {}
    for key, value in (snapshot.get("unseen") if snapshot else {}).items():
        assert len(key) == 2 and isinstance(key[0], int) and isinstance(key[1], int)
        assert isinstance(value, int)
        out[(key[0], key[1])] = value
    return out


def unseen(snapshot: Snapshot, previous: Snapshot | None = None) -> dict[str, int]:
    """Events the script knows it never saw (lost events).

    switch_in, wakeup, switch_out: one task's event missing from its sequence;
    cpu_gaps: breaks in a CPU's chain of switches (none seen there for a while,
    gap_ns long in total; the kernel skipped the script's programs on that CPU).
    """
    counts: dict[int, int] = defaultdict(int)
    old = _unseen_by(previous)
    for (kind, tid), value in _unseen_by(snapshot).items():
        counts[kind] += value - old.get((kind, tid), 0)
    return {"switch_in": counts[1], "wakeup": counts[2], "switch_out": counts[3],
            "cpu_gaps": counts[4]}  # fmt: skip


def lost_pids(snapshot: Snapshot, previous: Snapshot | None = None) -> list[int]:
    """The processes whose own events the script knows it missed (see unseen())."""
    old = _unseen_by(previous)
    now = _unseen_by(snapshot)
    return sorted({tid for (kind, tid), n in now.items() if tid and n > old.get((kind, tid), 0)})


def gap_ns(snapshot: Snapshot, previous: Snapshot | None = None) -> int:
    """Total length of the breaks in the CPUs' chains of switches (see unseen())."""
    return _scalar(snapshot, "gap_ns") - (_scalar(previous, "gap_ns") if previous else 0)


def lost_warning(lost: dict[str, int], gap_ms: float) -> str | None:
    """One line on the scheduler events the script knows it never saw, else None."""
    if not any(lost.values()):
        return None
    parts = []
    if lost["switch_in"] or lost["switch_out"]:
        parts.append(
            f"{lost['switch_in']} switch-ins and {lost['switch_out']} switch-outs (those "
            "intervals are not accounted)"
        )
    if lost["wakeup"]:
        parts.append(f"{lost['wakeup']} wakeups (that runqueue time is charged to the wait event)")
    if lost["cpu_gaps"]:
        parts.append(
            f"{lost['cpu_gaps']} breaks of {gap_ms:.1f} ms in all when the kernel ran no "
            "probe on a CPU (a task preempted in a bpf() syscall holds the CPU's BPF guard; "
            "what ran there then, up to that much time, is not accounted or in the wrong row)"
        )
    return "events lost: " + "; ".join(parts)


def records(
    snapshot: Snapshot,
    targets: Iterable[int],
    is_ours: Callable[[int], bool],
    slept_in: dict[int, int] | None = None,
    asleep_at_start: dict[int, tuple[int, int]] | None = None,
) -> list[ProcessTime]:
    """Per process: the maps, plus the intervals open at the end, plus idle targets.

    is_ours(pid) decides for tasks the script had not yet decided (first seen
    asleep or runnable, never switched out in the window); `targets` are pids
    that belong in the model even with no event (asleep all along). slept_in:
    pid -> the wait_event_info it slept in for the whole window, where known
    (it never ran between a pg_stat_activity read and the end); otherwise such
    a pid's window is charged to "asleep since before the capture".
    asleep_at_start: pid -> (run count, wait_event_info) read before the capture
    with the run count unchanged across the pg_stat_activity read (asleep in
    that event then): a sleep that began before the capture and ended in it is
    charged to that event when the process's run count at its first switch-out
    (@first_runs) is exactly one more, i.e. it had not run since that read.
    Neither given: the snapshot's own (asleep_before), so that each of two
    snapshots of since() is modelled with what was known at its read.
    """
    if slept_in is None and asleep_at_start is None:  # the snapshot's own, if it has them
        slept_in, asleep_at_start = asleep_before(snapshot)
    start, end = window(snapshot)
    born, exited = _ints(snapshot, "born_ns"), _ints(snapshot, "exit_ns")
    procs: dict[int, ProcessTime] = {}
    known = woken_after_measured(snapshot)

    def proc(pid: int) -> ProcessTime:
        if pid not in procs:
            begin = max(start, born.get(pid, start))
            finish = min(end, exited.get(pid, end))
            procs[pid] = ProcessTime(pid, max(finish - begin, 0), born=pid in born,
                                     exited=pid in exited, woken_after_known=known)  # fmt: skip
        return procs[pid]

    for pid, ns in _ints(snapshot, "cpu_ns").items():
        proc(pid).cpu_ns += ns
    first_runs = _ints(snapshot, "first_runs")

    def slept_from_start(tid: int) -> int | None:
        """The wait event tid slept in before the capture, if its first run since is this one."""
        known = (asleep_at_start or {}).get(tid)
        return known[1] if known and first_runs.get(tid) == known[0] + 1 else None

    for (tid, how), value in snapshot.get("runq_ns").items():
        assert isinstance(tid, int) and isinstance(how, int) and isinstance(value, int)
        p = proc(tid)
        if how == RUNNABLE_AT_START:
            slept = slept_from_start(tid)
            if slept:  # not 0: no wait event set then, it may have been runnable indeed
                p.wait_ns[slept] = p.wait_ns.get(slept, 0) + value
                continue
            how = WOKEN
        p.runq_ns[how] = p.runq_ns.get(how, 0) + value
    for (tid, wei), value in snapshot.get("wait_ns").items():
        assert isinstance(tid, int) and isinstance(wei, int) and isinstance(value, int)
        slept = slept_from_start(tid) if wei == waitevents.BEFORE_CAPTURE else None
        if slept is not None:
            wei = slept
        p = proc(tid)
        p.wait_ns[wei] = p.wait_ns.get(wei, 0) + value
    for (tid, wei), value in snapshot.get(WOKEN_AFTER_MAP).items():
        assert isinstance(tid, int) and isinstance(wei, int) and isinstance(value, int)
        after = proc(tid).woken_after_ns
        after[wei] = after.get(wei, 0) + value
    for (tid, wei), value in snapshot.get("wait_hist").items():
        assert isinstance(tid, int) and isinstance(wei, int) and isinstance(value, Log2Hist)
        proc(tid).wait_hist[wei] = value
    for (tid,), value in snapshot.get("task").items():
        assert isinstance(tid, int) and isinstance(value, tuple)
        _add_totals(proc, tid, value)
        # A process that exited: open until its exit at most (its last switch-out
        # can be among the events lost, and it was then "on CPU" to the end).
        _add_open(proc, tid, value, start, min(end, exited.get(tid, end)), is_ours)
    for pid in targets:
        if pid not in procs and is_ours(pid):
            wei = (slept_in or {}).get(pid, waitevents.BEFORE_CAPTURE)
            proc(pid).wait_ns[wei] = proc(pid).wall_ns
    # Born after the window's end: in the maps only because they were printed later.
    return sorted((p for p in procs.values() if born.get(p.pid, start) < end), key=lambda p: p.pid)


def since(
    previous: Snapshot | None,
    snapshot: Snapshot,
    targets: Iterable[int],
    is_ours: Callable[[int], bool],
    slept_in: dict[int, int] | None = None,
    asleep_at_start: dict[int, tuple[int, int]] | None = None,
) -> list[ProcessTime]:
    """The window from `previous`'s @now_ns to `snapshot`'s: the difference of the two.

    With INTERVAL_S the script's maps are cumulative since the capture began
    (bpftrace prints asynchronously: a clear would lose what is charged
    between the interval probe and the print). Both snapshots are modelled the
    same way (same is_ours, targets, ...) so that what is charged in between
    lands in one window or the next, never in none. With no previous
    snapshot: the capture's first window, as records().
    """
    now = records(snapshot, targets, is_ours, slept_in, asleep_at_start)
    if previous is None:
        return now
    return difference(now, records(previous, targets, is_ours, slept_in, asleep_at_start),
                      snapshot, previous)  # fmt: skip


def difference(
    now: list[ProcessTime], before_list: list[ProcessTime], snapshot: Snapshot, previous: Snapshot
) -> list[ProcessTime]:
    """since()'s window from the two snapshots' records (modelled alike: a caller that
    keeps a snapshot's records for the next window passes them as they were)."""
    before = {p.pid: p for p in before_list}
    start, end = window(snapshot, previous)
    born, exited = _ints(snapshot, "born_ns"), _ints(snapshot, "exit_ns")
    out = []
    empty = Log2Hist(())
    for cur in now:
        old = before.get(cur.pid)
        if old is None:
            old = ProcessTime(cur.pid, 0)
        begin, finish = max(start, born.get(cur.pid, start)), min(end, exited.get(cur.pid, end))
        # (most maps of most processes are the same as at the refresh before: _minus says
        # so at once; the dicts given, none is made to be replaced)
        p = ProcessTime(cur.pid, max(finish - begin, 0), cur.cpu_ns - old.cpu_ns,
                        _minus(cur.runq_ns, old.runq_ns), _minus(cur.wait_ns, old.wait_ns), {},
                        _minus(cur.woken_after_ns, old.woken_after_ns), cur.woken_after_known,
                        cur.born and not old.born, cur.exited and not old.exited)  # fmt: skip
        for wei, hist in cur.wait_hist.items():
            prior = old.wait_hist.get(wei, empty)
            if prior.buckets == hist.buckets:
                continue
            left = hist_minus(hist, prior)
            if left.count:
                p.wait_hist[wei] = left
        if p.wall_ns or p.accounted_ns:
            out.append(p)
    return out


def _minus(now: dict[int, int], before: dict[int, int]) -> dict[int, int]:
    """now - before, key by key. A key only in before goes negative: a sleep from before
    the capture shown as unknown (2) in one window and named at its end in a later one
    moves there (that window shows the unknown part negative, the named one whole)."""
    if now == before:  # most processes' most maps between two refreshes
        return {}
    out = {}
    for k, v in now.items():
        if v != before.get(k, 0):
            out[k] = v - before.get(k, 0)
    for k, v in before.items():
        if v and k not in now:
            out[k] = -v
    return out


def hist_minus(now: Log2Hist, before: Log2Hist) -> Log2Hist:
    old = {(lo, hi): c for lo, hi, c in before.buckets}
    return Log2Hist(tuple((lo, hi, c - old.get((lo, hi), 0)) for lo, hi, c in now.buckets
                          if c > old.get((lo, hi), 0)))  # fmt: skip


def woken_after_measured(snapshot: Snapshot) -> bool:
    """Whether a snapshot has the runqueue time after each sleep (the compiled object's),
    even none of it, or not (the scripts')."""
    return WOKEN_AFTER_MAP in snapshot.maps


def pending_waits(snapshot: Snapshot | None, woken: bool = False) -> dict[tuple[int, int], int]:
    """(tid, wait_event_info) -> ns asleep not yet in @wait_ns: a live task's running
    total for the wait event it last slept in (@task fields 7 and 8). woken: the runqueue
    time after those sleeps instead (WOKEN_AFTER; the compiled object's only)."""
    out = {}
    at = WOKEN_AFTER if woken else 8
    for (tid,), task in (snapshot.get("task") if snapshot else {}).items():
        if not (isinstance(tid, int) and isinstance(task, tuple) and len(task) > 8):
            continue
        if (_from_object(task) or not woken) and task[at]:
            wei, ns = task[7], task[at]
            assert isinstance(wei, int) and isinstance(ns, int)
            out[(tid, wei)] = ns
    return out


def open_waits(snapshot: Snapshot | None, woken: bool = False) -> dict[tuple[int, int], int]:
    """(tid, wait_event_info) -> ns of the sleep under way at the read (@task state ASLEEP),
    as records() charges it (_add_open: to the window's end, or the task's exit). woken: the
    runqueue time after it instead (field WOKEN_AFTER + 1; the compiled object's only)."""
    if snapshot is None:
        return {}
    start, end = window(snapshot)
    exited = _ints(snapshot, "exit_ns")
    out = {}
    for (tid,), task in snapshot.get("task").items():
        if not (isinstance(tid, int) and isinstance(task, tuple) and len(task) > 2):
            continue
        since, state, wei = task[0], task[1], task[2]
        assert isinstance(since, int) and isinstance(wei, int)
        if state != ASLEEP:
            continue
        if woken:
            ns = task[WOKEN_AFTER + 1] if _from_object(task) else 0
        else:
            ns = min(end, exited.get(tid, end)) - max(since, start)
        if isinstance(ns, int) and ns > 0:
            out[(tid, wei)] = ns
    return out


def _add_totals(proc: Callable[[int], ProcessTime], pid: int, task: tuple[int, ...]) -> None:
    """A live task's running totals, kept in its @task entry (fields 4-6: on CPU,
    runqueue after a preemption, runqueue after a wakeup; 7-8: the wait event it last
    slept in and the time asleep in it since it changed) rather than in @cpu_ns,
    @runq_ns and @wait_ns, which get them when it exits (the wait also when the event
    changes): one map update per switch or wakeup, not two."""
    fields = task[4:9] if len(task) >= 9 else (*task[4:], 0, 0, 0, 0, 0)[:5]
    cpu, preempted, woken, wei, asleep = fields
    # waits.bt's field 9 is its run count, not these
    after, after_open = task[WOKEN_AFTER : WOKEN_AFTER + 2] if _from_object(task) else (0, 0)
    if not (cpu or preempted or woken or asleep):
        return
    p = proc(pid)
    p.cpu_ns += cpu
    for how, ns in ((PREEMPTED, preempted), (WOKEN, woken)):
        if ns:
            p.runq_ns[how] = p.runq_ns.get(how, 0) + ns
    if asleep:
        p.wait_ns[wei] = p.wait_ns.get(wei, 0) + asleep
    for event, ns in ((wei, after), (task[2], after_open)):
        if ns:
            p.woken_after_ns[event] = p.woken_after_ns.get(event, 0) + ns


def _add_open(
    proc: Callable[[int], ProcessTime],
    pid: int,
    task: tuple[int, ...],
    start: int,
    end: int,
    is_ours: Callable[[int], bool],
) -> None:
    """Charge what a task was doing when the maps were printed, since max(since, start)."""
    since, state, a, b = task[:4] if len(task) >= 4 else (*task, 0, 0, 0, 0)[:4]
    if state in (0, NOT_OURS, LOST_TRACK) or since > end:
        return
    if state in (PENDING_WOKEN, PENDING_ON_CPU, PENDING_LOST_TRACK) and not is_ours(pid):
        return
    if pid == 0:
        return
    p = proc(pid)
    open_ns = end - max(since, start)
    if state == ON_CPU:
        p.cpu_ns += open_ns
    elif state in (PREEMPTED, WOKEN):
        p.runq_ns[state] = p.runq_ns.get(state, 0) + open_ns
    elif state == ASLEEP:
        p.wait_ns[a] = p.wait_ns.get(a, 0) + open_ns
    elif state == PENDING_LOST_TRACK:
        before = waitevents.BEFORE_CAPTURE
        p.wait_ns[before] = p.wait_ns.get(before, 0) + a
        p.runq_ns[WOKEN] = p.runq_ns.get(WOKEN, 0) + b
    elif state in (PENDING_WOKEN, PENDING_ON_CPU):
        before = waitevents.BEFORE_CAPTURE
        p.wait_ns[before] = p.wait_ns.get(before, 0) + a
        runq = b + (open_ns if state == PENDING_WOKEN else 0)
        p.runq_ns[WOKEN] = p.runq_ns.get(WOKEN, 0) + runq
        if state == PENDING_ON_CPU:
            p.cpu_ns += open_ns


@dataclass(frozen=True)
class Row:
    """One component of the time model (one line of the table, one JSON row)."""

    category: str  # on CPU, runqueue, wait, idle, unknown, not accounted
    wait_event_type: str
    wait_event: str
    total_ns: int
    wall_ns: int  # of the process (or the sum over the processes of the cluster)
    sleeps: int = 0
    hist: Log2Hist = Log2Hist(())
    wait_event_info: int | None = None
    pid: int | None = None
    backend_type: str = ""
    application_name: str = ""
    state: str = ""  # Client:ClientRead only: pg_stat_activity's state then (idle, ...)
    # a wait event's: the runqueue time right after its sleeps, counted in the runqueue
    # (woken) row (None: not measured, the scripts' forms)
    woken_after_ns: int | None = None

    @property
    def share(self) -> float:
        return self.total_ns / self.wall_ns if self.wall_ns else 0.0

    def percentile_us(self, fraction: float) -> float:
        return histogram.percentile(self.hist, fraction) / 1000

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {}
        if self.pid is not None:
            row.update(pid=self.pid, backend_type=self.backend_type,
                       application_name=self.application_name)  # fmt: skip
        row.update(
            category=self.category,
            wait_event_type=self.wait_event_type,
            wait_event=self.wait_event,
            state=self.state,
            wait_event_info=self.wait_event_info,
            total_us=round(self.total_ns / 1000, 3),
            wall_us=round(self.wall_ns / 1000, 3),
            share_pct=round(100 * self.share, 2),
            sleeps=self.sleeps,
            p50_us=round(self.percentile_us(0.50), 3) if self.sleeps else None,
            p99_us=round(self.percentile_us(0.99), 3) if self.sleeps else None,
        )
        if self.woken_after_ns is not None:
            row["woken_after_us"] = round(self.woken_after_ns / 1000, 3)
        return row


Describe = Callable[[int], tuple[str, str]]  # pid -> (backend_type, application_name)


def rows(procs: Iterable[ProcessTime], major: int, by_pid: bool, describe: Describe) -> list[Row]:
    """The time model per process (by_pid) or summed over the processes."""
    groups: dict[int | None, list[ProcessTime]] = defaultdict(list)
    for p in procs:
        if waitevents.NONE in p.wait_ns and describe(p.pid)[0] == "postmaster":
            p = _main_loop(p)
        groups[p.pid if by_pid else None].append(p)
    out: list[Row] = []
    for pid, group in sorted(groups.items(), key=lambda kv: kv[0] or 0):
        btype, app = describe(pid) if pid is not None else ("", "")
        out.extend(_model(group, major, pid, btype, app))
    return out


def _main_loop(p: ProcessTime) -> ProcessTime:
    """The postmaster's sleeps with no wait event are its main loop's: idle, not the
    "(no wait event)" of a backend's kernel I/O (waitevents.shown; its off-CPU stacks are
    named the same way)."""
    none, loop = waitevents.NONE, waitevents.shown(waitevents.NONE, postmaster=True)
    wait_ns, wait_hist = dict(p.wait_ns), dict(p.wait_hist)
    wait_ns[loop] = wait_ns.get(loop, 0) + wait_ns.pop(none)
    if none in wait_hist:
        wait_hist[loop] = wait_hist.pop(none)
    return replace(p, wait_ns=wait_ns, wait_hist=wait_hist)


def _model(
    group: list[ProcessTime], major: int, pid: int | None, btype: str, app: str
) -> list[Row]:
    wall = sum(p.wall_ns for p in group)
    common: dict[str, Any] = dict(wall_ns=wall, pid=pid, backend_type=btype, application_name=app)
    out = [Row("on CPU", "CPU", "on CPU", sum(p.cpu_ns for p in group), **common)]
    for how, label in ((PREEMPTED, "preempted"), (WOKEN, "woken, not yet running")):
        total = sum(p.runq_ns.get(how, 0) for p in group)
        out.append(Row("runqueue", "CPU", f"runqueue ({label})", total, **common))
    by_event: dict[int, int] = defaultdict(int)
    after: dict[int, int] = defaultdict(int)
    for p in group:
        for wei, ns in p.wait_ns.items():
            by_event[wei] += ns
        for wei, ns in p.woken_after_ns.items():
            after[wei] += ns
    known = any(p.woken_after_known for p in group)
    events = []
    for wei, total in by_event.items():
        wtype, wname = waitevents.name(major, wei)
        hist = histogram.merge(p.wait_hist[wei] for p in group if wei in p.wait_hist)
        state = backend_state.state_of(major, wei)
        if wei == waitevents.BEFORE_CAPTURE:
            category = "unknown"
        elif state is not None:  # ClientRead: idle, idle in transaction, ... (or unknown)
            category = backend_state.category(state)
        elif waitevents.is_idle(wtype, wname):
            category = "idle"
        else:
            category = "wait"
        woken = after.get(wei, 0) if known else None
        events.append(Row(category, wtype, wname, total, sleeps=hist.count, hist=hist,
                          wait_event_info=wei, state=state or "", woken_after_ns=woken,
                          **common))  # fmt: skip
    events.sort(key=lambda r: (CATEGORY_ORDER.index(r.category), -r.total_ns, r.wait_event))
    out.extend(events)
    rest = wall - sum(r.total_ns for r in out)
    out.append(Row("not accounted", "", "(not accounted)", rest, **common))
    return out


def client_read_unknown_ns(rows: Iterable[Row]) -> int:
    """ClientRead time whose state (idle or in a transaction) was not known."""
    return sum(r.total_ns for r in rows if r.state and backend_state.category(r.state) == "unknown")


def client_read_warning(rows: list[Row], not_read: str | None = None) -> str | None:
    """One line when some ClientRead time is neither idle nor active: its state not known.

    not_read: why the probe did not read the state at all (else it read it and failed).
    """
    unknown = client_read_unknown_ns(rows)
    if not unknown:
        return None
    states = sorted({r.state for r in rows if r.total_ns and r.state
                     and backend_state.category(r.state) == "unknown"})  # fmt: skip
    if not_read:
        why = not_read
    elif states == ["disabled"]:
        why = "track_activities is off"
    else:
        why = "the backend's status entry was not set up or not readable at the switch-out"
    return (
        f"{unknown / 1e9:.3f} s of Client:ClientRead with the backend's state "
        f"{'/'.join(states)}, neither idle nor active ({why})"
    )
