"""`pgprobe waits` on bpf/waits.bpf.c, compiled: its maps read into waits.bt's snapshot.

The compiled object measures on the kernel's own counters (bpf/waits.bpf.c: it runs only
when a process of ours goes to sleep, or is preempted) and writes waits.bt's output maps
at a fraction of its cost per context switch (docs/benchmarks.md). Its @task entries are
turned into waits.bt's here, the interval still open at a read closed on /proc's counters
(_closed), so records.py reads either the same way. It is used when scripts/build-bpf has
built it (in a checkout), or the wheel carries it (hatch_build.py compiles it into the
wheel: pgprobe/bpf/build/), and this kernel loads it (raw BTF tracepoints and task storage,
Linux 5.13+ with BTF); otherwise pgprobe runs bpf/waits.bt and says why in one line.
`--engine bpftrace` asks for the script.

Kept in one module (~630 lines) because the @task layout, the seed that writes it and the
reads that close its open intervals must agree field by field with bpf/waits.bpf.c; the
query and lock dimensions' own parts of that (their fields, charges and maps) are
querydim.py and lockdim.py."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pgprobe import histogram, proc, waitevents
from pgprobe.engines import compiled as engine
from pgprobe.engines import libbpf
from pgprobe.engines.base import AggValue, Key, Log2Hist, RunInfo, Snapshot
from pgprobe.engines.compiled import CompiledCapture
from pgprobe.tools.waits import lockdim, querydim, records
from pgprobe.tools.waits.unmoved import Unmoved
from pgprobe.waitevents import address as waitevents_address
from pgprobe.waitevents import backend_state, lwmode, statement

OBJECT = "waits.bpf.o"  # in bpf/build/: scripts/build-bpf, or the wheel's (pgprobe/bpf/)
WINDOW, REFUSED = 0, 1  # the object's `scalars` slots
# The object's @task states (bpf/waits.bpf.c): not asleep then (a fork); a switch-out into
# a sleep; pgprobe's seed: asleep with no run since, or not (running or runnable).
STARTED, ASLEEP, SEEDED_ASLEEP, SEEDED_RUNNING = 1, records.ASLEEP, 10, 11

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_PAIR = struct.Struct("<II")
_PAIR_NS = struct.Struct("<QQ")  # @wait_ns: asleep, woken after (not yet running)
_START = struct.Struct("<4Q")  # @start: cpu0, rd0, nv0, state
_HIST_KEY = struct.Struct("<IIII")  # tid, wait_event_info, log2 slot, padding
# since, state, a, rd_p, then waits.bt's running totals (cpu, runq2, runq3, wei, wait), the
# kernel's counters at `since` (cpu0, rd0, nv0), the two cached pointers, then the log2
# histogram of the sleeps in `wei` not yet in @wait_hist (a bit per slot used, the slots)
HIST_SLOTS = 48
_HIST_AT = 15
_QUERY_AT = _HIST_AT + HIST_SLOTS  # the query dimension's fields (querydim.FIELDS)
# after the histogram: the query dimension's fields, then slept_p (the sleep begun at
# `since` as measured at its first preemption since, +1; 0: none), the marks, the lock
# dimension's fields, wait_rq (the runqueue time after the sleeps in `wei`)
TAIL_FIELDS = querydim.FIELDS + 1 + querydim.MARK_FIELDS + lockdim.FIELDS + 1
_SLEPT_P = _QUERY_AT + querydim.FIELDS
_MARKS_AT = _SLEPT_P + 1
_LOCK_AT = _MARKS_AT + querydim.MARK_FIELDS
_WAIT_RQ = _LOCK_AT + lockdim.FIELDS
_TASK = struct.Struct(f"<15Q{HIST_SLOTS}Q{TAIL_FIELDS}Q")
_OPEN_HEAD = struct.Struct("<12Q")  # since, state, a, rd_p, 5 totals, cpu0, rd0, nv0
_LOCK_BYTES = slice(8 * _LOCK_AT, 8 * _WAIT_RQ)  # the lock dimension's fields in an entry
_NO_LOCK = bytes(8 * lockdim.FIELDS)
_BY_TID = ("cpu_ns", "born_ns", "exit_ns")
# The query dimension's own program, a uprobe on the server's proc_exit() (querydim.
# Dimension.uprobes): loaded only when asked for.
QUERY_PROGRAMS = frozenset({"on_proc_exit"})
_BY_PAIR = ("runq_ns", "unseen")  # then wait_ns: see read()


def object_path() -> Path | None:
    """The object: the installed wheel's (pgprobe/bpf/build/), or the checkout's (bpf/build/)."""
    return engine.object_path(OBJECT)


def not_built() -> str:
    """Why there is no object, in one line: where it would come from here."""
    return engine.not_built(OBJECT)


def how_to_build() -> str:
    """What makes the object here: doctor's fix."""
    return engine.how_to_build()


def why_not(ns: argparse.Namespace) -> str | None:
    """Why the compiled object is not used for this capture (None: it is); "" = not said."""
    return engine.why_not(ns, OBJECT)


def capture(
    args: list[int | Path],
    duration: float | None,
    duty: float = 1.0,
    query: querydim.Dimension | None = None,
    locks: lockdim.Dimension | None = None,
    modes: lwmode.ModeAddress | None = None,
    unmoved: Unmoved | None = None,
) -> CompiledCapture:
    """waits.bt's parameters ($1-$6, probe.script_args) as the object's globals; with a duty
    below 1 (and an interval), each interval's snapshot is a capture of its own (engines.
    compiled): the maps are emptied and the processes seeded again at each attach. query:
    the time model keyed by statement too (querydim), in the snapshot's `query_ns`; locks:
    each Lock sleep keyed by its lock too (lockdim), in `lock_ns`; modes: each LWLock sleep
    keyed by the mode waited for too (lwmode: `wait_ns` keys carry it); unmoved: the reads'
    memory of each process (given: the caller sees which had not moved at the last read)."""
    postmaster, address, interval, single, be_address, state_offset = (int(str(a)) for a in args)
    path = object_path()
    assert path is not None
    entry = backend_state.StateAddress(be_address, state_offset) if be_address else None
    start = Start(0, {})
    if unmoved is None:  # each process's last read, for the next (one capture's: emptied below)
        unmoved = Unmoved()

    known: set[int] = set()  # the processes listed at the reads before

    def pids() -> list[int]:
        if single:
            return [single]
        # The children file can miss a child while others are reaped, even read twice (a CI
        # run's last read of a restart missed a backend asleep throughout: its running total,
        # a 2 s pg_sleep, with it). One listed before and still the postmaster's child is
        # read all the same.
        listed = {postmaster, *proc.children(postmaster)}
        listed |= {pid for pid in known - listed if proc.parent(pid) == postmaster}
        known.clear()
        known.update(listed)
        return sorted(listed)

    def start_window(obj: libbpf.BpfObject) -> None:
        targets = pids()
        _empty(obj, targets)
        unmoved.kept.clear()
        unmoved.confirmed.clear()
        # waits.bt sets @window_ns in BEGIN, before its probes attach: the same here.
        start.window = time.monotonic_ns()
        obj.update("scalars", _U32.pack(WINDOW), _U64.pack(start.window))
        start.counters = {pid: c for pid in targets if (c := proc.sched_counters(pid))}
        for pid, c in start.counters.items():  # for a switch-out before the seed
            state = SEEDED_ASLEEP if proc.asleep(pid) else SEEDED_RUNNING
            obj.update("start", _U32.pack(pid), _START.pack(c.cpu_ns, c.runq_ns, c.sleeps, state))

    globals_ = {**rodata(args), **(query.rodata() if query else {}),
                **(locks.rodata() if locks else {}),
                **(modes.rodata() if modes else {})}  # fmt: skip
    return CompiledCapture(path, globals_,
                           lambda obj, info: read(obj, info, pids(), query, locks, unmoved),
                           duration, interval or None, start_window, duty,
                           lambda obj: _seed(obj, start, address, entry, query, locks, modes),
                           frozenset() if query else QUERY_PROGRAMS,
                           query.uprobes() if query else {})  # fmt: skip


def rodata(args: list[int | Path]) -> dict[str, int]:
    """The object's globals for waits.bt's parameters $1-$6 (probe.script_args)."""
    postmaster, address, _interval, single, be_address, state_offset = (int(str(a)) for a in args)
    return {"postmaster": postmaster, "wei_addr": address, "only_pid": single,
            "be_addr": be_address, "state_off": state_offset,
            "local_wei": _pointer_at(postmaster, address)}  # fmt: skip


def _empty(obj: libbpf.BpfObject, pids: list[int]) -> None:
    """A fresh capture's maps in an object that ran before (detached): no totals, and no
    @task entry left to these processes (a task storage map cannot be walked: by pidfd)."""
    maps = ("wait_ns", "wait_hist", "start", "query_ns", "exit_query", "lock_ns")
    for name in (*_BY_TID, *_BY_PAIR, *maps):
        obj.clear(name)
    for pid in pids:
        with contextlib.suppress(OSError), _pidfd(pid) as pidfd:
            obj.delete("task", _I32.pack(pidfd))


@contextlib.contextmanager
def _pidfd(pid: int) -> Iterator[int]:
    pidfd = os.pidfd_open(pid)
    try:
        yield pidfd
    finally:
        os.close(pidfd)


def _pointer_at(pid: int, address: int) -> int:
    """What my_wait_event_info holds in the postmaster (it has no PGPROC): the address a
    process points it at until it has one; 0 when unreadable (the object then caches
    nothing and reads the pointer at every sleep)."""
    try:
        return waitevents_address.pointer_at(pid, address)
    except (OSError, ValueError):
        return 0


@dataclass
class Start:
    """A window's start: its clock (monotonic ns) and each process's kernel counters (/proc)
    read right after it, before the attach."""

    window: int
    counters: dict[int, proc.SchedCounters]


def _seed(
    obj: libbpf.BpfObject,
    start: Start,
    wei_address: int,
    entry: backend_state.StateAddress | None,
    query: querydim.Dimension | None = None,
    locks: lockdim.Dimension | None = None,
    modes: lwmode.ModeAddress | None = None,
) -> None:
    """Each process's @task entry as of the window's start, made right after the attach:
    the object splits the time from there to its first sleep seen (waits.bpf.c). Made
    only where the object has none: a process switched out since the attach has its own,
    from its counters in @start (its sleep then, if any, not named). A process
    asleep throughout (asleep, and not run from the window's start to a last read) slept
    in the wait event read from its memory in between, as the probe reads it: the tail of
    that sleep is charged to it; one whose memory cannot be read, to "asleep since before
    the capture". One that began a sleep between the start and the attach (unseen, in a
    wait event never read) has that time in "asleep since before the capture", and its
    entry starts at its counters read here, the sleep under way named from its memory."""
    for pid, at_start in start.counters.items():
        read_at = time.monotonic_ns()
        counters = proc.sched_counters(pid)
        sleeping = proc.asleep(pid)
        try:
            wei = backend_state.read_as_probe(pid, wei_address, entry)
        except OSError:
            wei = waitevents.BEFORE_CAPTURE
        if modes is not None:
            wei = lwmode.with_mode(pid, wei, modes)
        last = proc.sched_counters(pid)
        if counters is None or last is None:
            continue  # gone: nothing to seed
        if counters.sleeps == at_start.sleeps:
            since, base, totals = start.window, at_start, (0,) * 5
        else:
            since, base = read_at, counters
            totals = _unseen(at_start, counters, read_at - start.window)
        state = SEEDED_ASLEEP if sleeping and last.runs == base.runs else SEEDED_RUNNING
        fields = query.seed(pid) if query else (0,) * querydim.FIELDS
        lock = locks.seed(pid, wei) if locks else (0,) * lockdim.FIELDS
        value = _TASK.pack(since, state, wei, 0, *totals, base.cpu_ns, base.runq_ns,
                           base.sleeps, *[0] * (3 + HIST_SLOTS), *fields, 0,
                           *[0] * querydim.MARK_FIELDS, *lock, 0)  # fmt: skip
        with contextlib.suppress(OSError, libbpf.LibbpfError), _pidfd(pid) as pidfd:
            obj.update("task", _I32.pack(pidfd), value, only_new=True)  # refused: exited


def _unseen(
    before: proc.SchedCounters, after: proc.SchedCounters, span: int
) -> tuple[int, int, int, int, int]:
    """A seed's running totals (cpu, runq2, runq3, wei, wait) for a span with a sleep that
    began unseen: on CPU, in a runqueue (woken, most likely), the rest asleep, not named."""
    on_cpu, queued, slept = _split(span, before.cpu_ns, before.runq_ns, after)
    return (on_cpu, 0, queued, waitevents.BEFORE_CAPTURE if slept else 0, slept)


def _split(span: int, cpu0: int, rd0: int, counters: proc.SchedCounters) -> tuple[int, int, int]:
    """A span's time on CPU, in a runqueue and asleep, from the kernel's counters grown
    since (cpu0, rd0): each part bounded by what the span leaves (the clocks differ)."""
    on_cpu = min(max(0, counters.cpu_ns - cpu0), span)
    queued = min(max(0, counters.runq_ns - rd0), span - on_cpu)
    return on_cpu, queued, span - on_cpu - queued


# One process's @task entry, read with its counters: (entry, when read, counters).
RawTask = tuple[bytes, int, proc.SchedCounters]


def _raw_tasks(
    obj: libbpf.BpfObject,
    pids: list[int],
    unmoved: Unmoved | None = None,
    served: set[int] | None = None,
) -> dict[int, RawTask]:
    """@task of these processes, each with its kernel counters (/proc) read at the same
    moment: the entry read again after them must be the same (no switch-out between). The
    state lives in the task (task local storage, asked by pidfd). An exited process has
    none left: its totals went to the maps at its last switch-out. unmoved: a process that
    has not run since its last read keeps that read (the same entry, the same counters;
    its pid added to `served`)."""
    out: dict[int, RawTask] = {}
    for pid in pids:
        if unmoved is not None:
            when = time.monotonic_ns()
            kept = unmoved.still(pid)
            if kept is not None:
                out[pid] = (kept.entry, when, kept.counters)
                if served is not None:
                    served.add(pid)
                continue
        with contextlib.suppress(OSError), _pidfd(pid) as pidfd:  # OSError: gone
            for _attempt in range(3):
                entry = obj.lookup("task", _I32.pack(pidfd))
                when = time.monotonic_ns()
                counters = proc.sched_counters(pid)
                if entry is None or counters is None:
                    break
                out[pid] = (entry, when, counters)
                if obj.lookup("task", _I32.pack(pidfd)) == entry:
                    break
        if unmoved is not None and pid in out:
            unmoved.keep(pid, out[pid][0], out[pid][2])
    return out


def _closed(raw: RawTask, now: int) -> tuple[int, ...]:
    """waits.bt's @task tuple for a raw entry: the interval still open at the read (since
    the entry's `since`) closed on the kernel's counters, as bpf/waits.bpf.c closes one at a
    switch-out (close_interval; keep the two alike): its on-CPU and runqueue parts added to
    the running totals, the rest asleep, an open sleep (state ASLEEP) ending at `now`. Two
    fields more than waits.bt's (records.WOKEN_AFTER): the runqueue time after the sleeps
    in the running total's event, and after the open sleep (woken since, in its event)."""
    fields = _fields(raw[0])
    cpu, runq2, runq3, wei, wait = fields[4:9]
    part = _open(raw)
    totals = (part.on_cpu + cpu, runq2 + part.preempted, runq3 + part.woken, wei, wait)
    if part.asleep_in is None or not part.slept:
        return (0, 0, 0, 0, *totals, fields[_WAIT_RQ], 0)
    return (now - part.slept, ASLEEP, part.asleep_in, 0, *totals, fields[_WAIT_RQ], part.woken)


def _closed_now(pid: int, raw: RawTask, now: int, unmoved: Unmoved | None) -> tuple[int, ...]:
    """_closed(raw, now) of an entry with its counters read at `now`: kept from an earlier
    read of the same entry and counters when that one was steady. Steady: the open
    interval's CPU and runqueue parts are the counters' growth whole (not cut at the span)
    and no known sleep length (slept_p) can cut it; then a later `now` only lengthens the
    open sleep, whose start (now - slept) and every total stay: the same tuple."""
    kept = unmoved.kept.get(pid) if unmoved is not None else None
    if kept is None or raw[1] != now or kept.entry != raw[0] or kept.counters != raw[2]:
        return _closed(raw, now)
    steady = kept.derived.get("closed")
    if steady is not None:
        return cast(tuple[int, ...], steady)
    closed = _closed(raw, now)
    fields, part, counters = _fields(raw[0]), _open(raw), raw[2]
    since, _state, _a, rd_p = fields[:4]
    cpu0, rd0 = fields[9:11]
    if (
        now >= since
        and part.on_cpu + part.preempted + part.woken + part.slept == now - since
        and part.on_cpu == max(0, counters.cpu_ns - cpu0)
        and part.preempted + part.woken == max(0, counters.runq_ns - rd0)
        and not (rd_p and fields[_SLEPT_P])
        and (part.asleep_in is None or part.slept > 0)
    ):
        kept.derived["closed"] = closed
    return closed


@functools.cache  # emptied at each read's end, as _open
def _fields(entry: bytes) -> tuple[int, ...]:
    """An entry's fields (1,848 bytes: a read asks each several times; the entry of a process
    that has not moved is the same bytes object read after read, its hash kept)."""
    return _TASK.unpack(entry)


@functools.lru_cache(maxsize=4096)  # a read of 1,000 processes asks ~3,000
def _open(raw: RawTask) -> querydim.Open:
    """The interval open at the read of a raw entry, split on the kernel's counters (pure:
    kept for the entries of a read, which asks it of each several times; emptied at the
    read's end, so no entry outlives it)."""
    entry, when, counters = raw
    # its own fields only: the whole entry's ~230 (_fields) for each process at each read
    # was a tenth of top's refresh with 1,000 idle backends
    since, state, a, rd_p, *_totals, cpu0, rd0, nv0 = _OPEN_HEAD.unpack_from(entry)
    span = max(0, when - since)
    on_cpu, queued, slept = _split(span, cpu0, rd0, counters)
    (slept_p,) = _U64.unpack_from(entry, 8 * _SLEPT_P)
    if rd_p and slept_p and slept_p - 1 < slept:
        # The sleep's length is known (the object's first_sleep): the rest is on CPU, with
        # the steal that sum_exec_runtime leaves out (a wait for a CPU under way now too,
        # moved to the runqueue at the next read).
        slept = slept_p - 1
        on_cpu = span - queued - slept
    woken = min(rd_p - 1 - rd0, queued) if rd_p else queued
    sleeps = counters.sleeps - nv0  # sleeps begun since `since`: none, or the entry is stale
    asleep_in = None
    if state in (SEEDED_ASLEEP, SEEDED_RUNNING) and sleeps:
        asleep_in = waitevents.BEFORE_CAPTURE  # a sleep since the seed the object missed
    elif state in (SEEDED_ASLEEP, ASLEEP) and not sleeps:
        asleep_in = a
    # else: no sleep under way at `since` (forked, or running at the seed: the clocks'
    # difference), or a sleep not seen (counted by the object at the next switch-out)
    return querydim.Open(on_cpu, queued - woken, woken, slept, asleep_in, a, when, rd0)


def read(
    obj: libbpf.BpfObject,
    info: RunInfo,
    pids: list[int],
    query: querydim.Dimension | None = None,
    locks: lockdim.Dimension | None = None,
    unmoved: Unmoved | None = None,
) -> Snapshot:
    """The maps as waits.bt prints them; @now_ns the moment the read ended (each process's
    time is counted to the moment its counters were read, just before). unmoved: what the
    last read of this capture kept (updated here)."""
    scalars = {_U32.unpack(k)[0]: _U64.unpack(v)[0] for k, v in obj.items("scalars")}
    maps: dict[str, dict[Key, AggValue]] = {"window_ns": {(): scalars.get(WINDOW, 0)}}
    same: set[int] = set()  # not run since the last read: not read after the maps either
    before = _raw_tasks(obj, pids, unmoved, same)
    for name in _BY_TID:
        maps[name] = {(_U32.unpack(k)[0],): _U64.unpack(v)[0] for k, v in obj.items(name)}
    for name in _BY_PAIR:
        maps[name] = {_PAIR.unpack(k): _U64.unpack(v)[0] for k, v in obj.items(name)}
    pairs = {_PAIR.unpack(k): _PAIR_NS.unpack(v) for k, v in obj.items("wait_ns")}
    maps["wait_ns"] = {k: v[0] for k, v in pairs.items()}
    maps[records.WOKEN_AFTER_MAP] = {k: v[1] for k, v in pairs.items() if v[1]}
    query_read = querydim.read_map(obj) if query else {}
    lock_read = lockdim.read_map(obj) if locks else {}
    hist_items = obj.items("wait_hist")
    after = _raw_tasks(obj, [pid for pid in pids if pid not in same], unmoved)
    after.update({pid: before[pid] for pid in same})  # still so at `now`: checked below
    now = time.monotonic_ns()
    maps["now_ns"] = {(): now}
    # A process that ended during the read (after @exit_ns was read, before `now`: tens of
    # ms under load) ends at its exit, not at `now`: read again, up to `now` (its totals are
    # in the entry read before, kept by _consistent, or in the maps).
    for k, v in obj.items("exit_ns"):
        if _U64.unpack(v)[0] <= now:
            maps["exit_ns"].setdefault((_U32.unpack(k)[0],), _U64.unpack(v)[0])
    for pid, (entry, _when, counters) in list(after.items()):
        if _unmoved(pid, counters, unmoved):  # neither run nor on CPU since: as it was at `now`
            after[pid] = (entry, now, counters)
        elif pid in same:  # it ran since its read before the maps: read it after them now
            same.discard(pid)
            after.pop(pid)
            after.update(_raw_tasks(obj, [pid], unmoved))
    # an entry the same after the maps as before them: its closed form from after alone
    # (_consistent has nothing to choose)
    closed_before: dict[Key, AggValue] = {
        (pid,): _closed(raw, now)
        for pid, raw in before.items()
        if pid not in after or after[pid][0] != raw[0]
    }
    closed_after: dict[Key, AggValue] = {
        (pid,): _closed_now(pid, raw, now, unmoved) for pid, raw in after.items()
    }
    maps["task"] = _consistent(obj, closed_before, closed_after, maps["wait_ns"])
    # the sleeps still in each task's histogram, from the entry kept for its totals
    kept = {pid: (before[pid] if maps["task"][(pid,)] is closed_before.get((pid,)) else raw)[0]
            for pid, raw in after.items()}  # fmt: skip
    maps["wait_hist"] = _hists(hist_items, kept, unmoved)
    if query:
        maps["query_ns"] = _query_ns(obj, query, query_read, before, after, unmoved, same)
    if locks:
        # only the processes with a lock wait in an entry: the others add nothing to the map
        waited = {pid for pid, raw in (*before.items(), *after.items())
                  if not raw[0].startswith(_NO_LOCK, _LOCK_BYTES.start)}  # fmt: skip
        kept_raw = {pid: before[pid] if maps["task"][(pid,)] is closed_before.get((pid,))
                    else raw for pid, raw in after.items() if pid in waited}  # fmt: skip
        maps["lock_ns"] = lockdim.collect(
            obj, lock_read, {pid: _lock_part(raw) for pid, raw in before.items() if pid in waited},
            {pid: _lock_part(raw) for pid, raw in kept_raw.items()},
            {pid: _lock_part(raw) for pid, raw in after.items() if pid in waited})  # fmt: skip
    info.failed_map_updates = scalars.get(REFUSED, 0)  # a full map: said like bpftrace's
    if unmoved is not None:
        unmoved.forget_gone(set(after))
        unmoved.confirmed = same
    _open.cache_clear()
    _fields.cache_clear()
    return Snapshot(label=time.strftime("%H:%M:%S"), maps=maps)


def _unmoved(pid: int, counters: proc.SchedCounters, unmoved: Unmoved | None) -> bool:
    """Whether pid's time on CPU and run count are still those read (asleep, or waiting
    for a CPU, since)."""
    now = unmoved.schedstat(pid) if unmoved is not None else proc.schedstat(pid)
    return now is not None and (now[0], now[2]) == (counters.cpu_ns, counters.runs)


def _consistent(
    obj: libbpf.BpfObject,
    before: dict[Key, AggValue],
    after: dict[Key, AggValue],
    wait_ns: dict[Key, AggValue],
) -> dict[Key, AggValue]:
    """@task as of the moment @wait_ns was read, read before and after it.

    When a process's wait event changes, its running total (fields 7, 8) moves from the task
    to @wait_ns. A move between the two reads would count that time in neither (a window
    short, the next one long: waits.bt's prints have this race) or in both: so the entry
    read on the same side of the move as @wait_ns is kept. @wait_ns read again tells which
    side: grown since, the move came after it (keep the entry from before)."""
    out = dict(after)
    for key, old in before.items():
        new = after.get(key)
        if not isinstance(old, tuple) or (isinstance(new, tuple) and new[7] == old[7]):
            continue  # the same wait event: nothing moved (an exit moves its totals too)
        moved = (int(str(key[0])), old[7])
        now = obj.lookup("wait_ns", _PAIR.pack(*moved))
        read = wait_ns.get(moved, 0)
        if now is not None and isinstance(read, int) and _PAIR_NS.unpack(now)[0] > read:
            out[key] = old
    return out


def _entry_hist(entry: bytes) -> tuple[tuple[int, int, int], ...]:
    """An entry's own histogram: (its running total's event, slot, count) of each slot used."""
    fields = _fields(entry)
    return tuple((fields[7], slot, n) for slot, n in enumerate(fields[_HIST_AT:_QUERY_AT]) if n)


def _hists(
    items: list[tuple[bytes, bytes]], entries: dict[int, bytes], unmoved: Unmoved | None = None
) -> dict[Key, AggValue]:
    """(tid, wei, slot) -> count, from @wait_hist and the live tasks' own histograms (of
    their running total's event), into a Log2Hist per (tid, wei): slot 0 holds 0, slot k
    2^(k-1) .. 2^k - 1 (bpftrace's hist buckets; the object's last slot holds all longer)."""
    counts: dict[tuple[int, int, int], int] = {}
    for k, v in items:
        tid, wei, slot, _ = _HIST_KEY.unpack(k)
        counts[(tid, wei, slot)] = _U64.unpack(v)[0]
    for pid, entry in entries.items():
        used = (unmoved.of_entry(pid, entry, "hist", functools.partial(_entry_hist, entry))
                if unmoved is not None else _entry_hist(entry))  # fmt: skip
        for wei, slot, n in used:
            key = (pid, wei, slot)
            counts[key] = counts.get(key, 0) + n
    buckets: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for (tid, wei, slot), n in counts.items():
        buckets.setdefault((tid, wei), []).append((*histogram.slot_bounds(slot), n))
    return {key: Log2Hist(tuple(sorted(b))) for key, b in buckets.items()}


def query_totals(obj: libbpf.BpfObject, pids: list[int]) -> querydim.Charges:
    """@query_ns with what these live processes' entries hold, their open intervals left
    out (bench.toggle's share of time keyed by an id)."""
    out = querydim.read_map(obj)
    for pid, raw in _raw_tasks(obj, pids).items():
        for key, ns in querydim.totals(pid, _query_fields(pid, raw)).items():
            out[key] = out.get(key, 0) + ns
    return out


def _query_fields(pid: int, raw: RawTask) -> tuple[int, ...]:
    """A raw entry's query dimension fields (querydim.FIELDS), its marks, then the pid."""
    fields = _fields(raw[0])
    marks = fields[_MARKS_AT : _MARKS_AT + querydim.MARK_FIELDS]
    return (*fields[_QUERY_AT : _QUERY_AT + querydim.FIELDS], *marks, pid)


def _query_ns(
    obj: libbpf.BpfObject,
    query: querydim.Dimension,
    read: querydim.Charges,
    before: dict[int, RawTask],
    after: dict[int, RawTask],
    unmoved: Unmoved | None = None,
    same: set[int] | None = None,
) -> dict[Key, AggValue]:
    """The query dimension's map, with each live process's totals and open interval (its
    statement now: the one read last when it has not run since). same: the processes that
    have not moved all through this read (their entry the same before the maps and after)."""
    rodata = query.rodata()
    # Most processes at most reads (1,000 idle backends under top): asleep all along since
    # the read before. Their charges are their totals and that sleep, to the read's end:
    # kept, with the sleep's start, and not split again (a fifth of top's refresh was this).
    asleep: dict[int, tuple[querydim.Charges, querydim.Key5, int]] = {}
    for pid in same or ():
        alone = _asleep_alone(pid, after[pid], unmoved)
        if alone is not None:
            totals, key, start = alone
            asleep[pid] = (totals, key, after[pid][1] - start)
    if asleep:
        before = {pid: raw for pid, raw in before.items() if pid not in asleep}
        after = {pid: raw for pid, raw in after.items() if pid not in asleep}

    def statement_now(pid: int) -> statement.Read | None:
        kept = unmoved.known_statement(pid) if unmoved is not None else None
        if kept is not None and kept.entry == after[pid][0]:
            return kept.statement
        now = query.read(pid)
        if unmoved is not None:
            unmoved.statement(pid, now)
        return now

    def fields(raws: dict[int, RawTask]) -> dict[int, tuple[int, ...]]:
        """Each entry's query fields: kept with the entry (the same tuple for an entry the
        same before the maps, after them and at the read before)."""
        if unmoved is None:
            return {pid: _query_fields(pid, raw) for pid, raw in raws.items()}
        return {pid: unmoved.of_entry(pid, raw[0], "query fields",
                                      functools.partial(_query_fields, pid, raw))
                for pid, raw in raws.items()}  # fmt: skip

    def live(out: querydim.Charges, pid: int, q: tuple[int, ...]) -> None:
        # q is the fields after the maps, or before them for a process gone since
        raw = after[pid] if q is fields_after.get(pid) else before[pid]
        known = None
        if unmoved is not None:
            known = unmoved.of_entry(pid, raw[0], "query totals", lambda: querydim.totals(pid, q))
        querydim.charges(pid, q, _open(raw), statement_now(pid), rodata, known, out)

    fields_after = fields(after)
    out = querydim.snapshot_map(obj, read, fields(before), fields_after, live)
    for totals, key, slept in asleep.values():
        querydim.add_asleep(cast(querydim.Charges, out), totals, key, slept)
    return out


def _asleep_alone(
    pid: int, raw: RawTask, unmoved: Unmoved | None
) -> tuple[querydim.Charges, querydim.Key5, int] | None:
    """For a process steady since the read before (_closed_now kept its closed form: the
    same entry and counters, its open sleep only lengthening) whose open interval is a sleep
    alone (querydim.sleep_alone): its totals, that sleep's key and its start (raw's read
    moment less the sleep: the same at every read while it stays so), kept with the entry."""
    kept = unmoved.kept.get(pid) if unmoved is not None else None
    if kept is None or kept.entry != raw[0] or kept.counters != raw[2]:
        return None
    if "closed" not in kept.derived:  # not steady: its open sleep may not only lengthen
        return None
    if "query asleep" not in kept.derived:
        q, part = _query_fields(pid, raw), _open(raw)
        key = querydim.sleep_alone(pid, q, part)
        totals = kept.derived.get("query totals") or querydim.totals(pid, q)  # live()'s
        kept.derived["query asleep"] = (totals, key, raw[1] - part.slept) if key else None
    return cast(tuple[querydim.Charges, querydim.Key5, int] | None, kept.derived["query asleep"])


def _lock_part(raw: RawTask) -> lockdim.Part:
    """A raw entry's lock fields, with its open sleep as the time model charges it."""
    fields, part = _fields(raw[0]), _open(raw)
    return lockdim.Part(fields[_LOCK_AT:_WAIT_RQ], part.asleep_in, fields[2], part.slept)
