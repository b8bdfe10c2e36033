"""What bpf/waits.bt hands back, and the time model shown: pure functions, no I/O.

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
from dataclasses import dataclass, field
from typing import Any

from pgprobe import histogram, waitevents
from pgprobe.engines.base import Log2Hist, Snapshot

# @task states (bpf/waits.bt)
ON_CPU, PREEMPTED, WOKEN, ASLEEP, PENDING_WOKEN, PENDING_ON_CPU, NOT_OURS = 1, 2, 3, 4, 5, 6, 9

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


def window(snapshot: Snapshot) -> tuple[int, int]:
    """(start_ns, end_ns) of the snapshot's window, on the kernel's monotonic clock."""
    return _scalar(snapshot, "window_ns"), _scalar(snapshot, "now_ns")


def unseen(snapshot: Snapshot) -> dict[str, int]:
    """Events the script knows it never saw: switch-ins and wakeups (lost events)."""
    counts = _ints(snapshot, "unseen")
    return {"switch_in": counts.get(1, 0), "wakeup": counts.get(2, 0)}


def records(
    snapshot: Snapshot,
    targets: Iterable[int],
    is_ours: Callable[[int], bool],
    slept_in: dict[int, int] | None = None,
) -> list[ProcessTime]:
    """Per process: the maps, plus the intervals open at the end, plus idle targets.

    is_ours(pid) decides for tasks the script had not yet decided (first seen
    asleep or runnable, never switched out in the window); `targets` are pids
    that belong in the model even with no event (asleep all along). slept_in:
    pid -> the wait_event_info it slept in for the whole window, where known
    (it never ran between a pg_stat_activity read and the end); otherwise such
    a pid's window is charged to "asleep since before the capture".
    """
    start, end = window(snapshot)
    born, exited = _ints(snapshot, "born_ns"), _ints(snapshot, "exit_ns")
    procs: dict[int, ProcessTime] = {}

    def proc(pid: int) -> ProcessTime:
        if pid not in procs:
            begin = max(start, born.get(pid, start))
            finish = min(end, exited.get(pid, end))
            procs[pid] = ProcessTime(pid, max(finish - begin, 0), born=pid in born,
                                     exited=pid in exited)  # fmt: skip
        return procs[pid]

    for pid, ns in _ints(snapshot, "cpu_ns").items():
        proc(pid).cpu_ns += ns
    for (tid, how), value in snapshot.get("runq_ns").items():
        assert isinstance(tid, int) and isinstance(how, int) and isinstance(value, int)
        p = proc(tid)
        p.runq_ns[how] = p.runq_ns.get(how, 0) + value
    for (tid, wei), value in snapshot.get("wait_ns").items():
        assert isinstance(tid, int) and isinstance(wei, int) and isinstance(value, int)
        p = proc(tid)
        p.wait_ns[wei] = p.wait_ns.get(wei, 0) + value
    for (tid, wei), value in snapshot.get("wait_hist").items():
        assert isinstance(tid, int) and isinstance(wei, int) and isinstance(value, Log2Hist)
        proc(tid).wait_hist[wei] = value
    for (tid,), value in snapshot.get("task").items():
        assert isinstance(tid, int) and isinstance(value, tuple)
        _add_open(proc, tid, value, start, end, is_ours)
    for pid in targets:
        if pid not in procs and is_ours(pid):
            wei = (slept_in or {}).get(pid, waitevents.BEFORE_CAPTURE)
            proc(pid).wait_ns[wei] = proc(pid).wall_ns
    return sorted(procs.values(), key=lambda p: p.pid)


def _add_open(
    proc: Callable[[int], ProcessTime],
    pid: int,
    task: tuple[int, ...],
    start: int,
    end: int,
    is_ours: Callable[[int], bool],
) -> None:
    """Charge what a task was doing when the maps were printed, since max(since, start)."""
    since, state, a, b = (list(task) + [0, 0, 0, 0])[:4]
    if state in (0, NOT_OURS) or since > end:
        return
    if state in (PENDING_WOKEN, PENDING_ON_CPU) and not is_ours(pid):
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
            wait_event_info=self.wait_event_info,
            total_us=round(self.total_ns / 1000, 3),
            wall_us=round(self.wall_ns / 1000, 3),
            share_pct=round(100 * self.share, 2),
            sleeps=self.sleeps,
            p50_us=round(self.percentile_us(0.50), 3) if self.sleeps else None,
            p99_us=round(self.percentile_us(0.99), 3) if self.sleeps else None,
        )
        return row


Describe = Callable[[int], tuple[str, str]]  # pid -> (backend_type, application_name)


def rows(procs: Iterable[ProcessTime], major: int, by_pid: bool, describe: Describe) -> list[Row]:
    """The time model per process (by_pid) or summed over the processes."""
    groups: dict[int | None, list[ProcessTime]] = defaultdict(list)
    for p in procs:
        groups[p.pid if by_pid else None].append(p)
    out: list[Row] = []
    for pid, group in sorted(groups.items(), key=lambda kv: kv[0] or 0):
        btype, app = describe(pid) if pid is not None else ("", "")
        out.extend(_model(group, major, pid, btype, app))
    return out


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
    for p in group:
        for wei, ns in p.wait_ns.items():
            by_event[wei] += ns
    events = []
    for wei, total in by_event.items():
        wtype, wname = waitevents.name(major, wei)
        hist = histogram.merge(p.wait_hist[wei] for p in group if wei in p.wait_hist)
        if wei == waitevents.BEFORE_CAPTURE:
            category = "unknown"
        elif waitevents.is_idle(wtype, wname):
            category = "idle"
        else:
            category = "wait"
        events.append(Row(category, wtype, wname, total, sleeps=hist.count, hist=hist,
                          wait_event_info=wei, **common))  # fmt: skip
    events.sort(key=lambda r: (CATEGORY_ORDER.index(r.category), -r.total_ns, r.wait_event))
    out.extend(events)
    rest = wall - sum(r.total_ns for r in out)
    out.append(Row("not accounted", "", "(not accounted)", rest, **common))
    return out
