"""`pgprobe waits` on bpf/waits.bpf.c, compiled: its maps read into waits.bt's snapshot.

The compiled object keeps waits.bt's maps, keys and @task states (bpf/waits.bpf.c), at a
fraction of its cost per context switch (docs/benchmarks.md): records.py reads either the
same way. It is used when scripts/build-bpf has built it and this kernel loads it (raw BTF
tracepoints, Linux 5.5+ with BTF); otherwise pgprobe runs bpf/waits.bt and says why in
one line. `--engine bpftrace` asks for the script.
"""

from __future__ import annotations

import argparse
import os
import struct
import time
from pathlib import Path

from pgprobe import engines, proc
from pgprobe.engines import libbpf
from pgprobe.engines.base import AggValue, Key, Log2Hist, RunInfo, Snapshot
from pgprobe.engines.compiled import CompiledCapture
from pgprobe.errors import PgprobeError
from pgprobe.scripts import script_path
from pgprobe.tools.waits import records
from pgprobe.waitevents import address as waitevents_address
from pgprobe.waitevents import backend_state

OBJECT = "build/waits.bpf.o"  # under bpf/, built by scripts/build-bpf
WINDOW, GAP, REFUSED, READ = 0, 1, 2, 3  # the object's `scalars` slots

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_PAIR = struct.Struct("<II")
_HIST_KEY = struct.Struct("<IIII")  # tid, wait_event_info, log2 slot, padding
_TASK = struct.Struct("<12Q")  # waits.bt's @task tuple, then three fields of its own
_BY_TID = ("cpu_ns", "born_ns", "exit_ns", "first_runs")
_BY_PAIR = ("runq_ns", "unseen", "wait_ns")  # wait_ns last: see read()


def object_path() -> Path | None:
    try:
        return script_path("bpf", OBJECT)
    except PgprobeError:
        return None


def why_not(ns: argparse.Namespace) -> str | None:
    """Why the compiled object is not used for this capture (None: it is); "" = not said."""
    if engines.choose(getattr(ns, "engine", "auto")) != "bpftrace":
        return ""  # DTrace
    if getattr(ns, "engine", "auto") == "bpftrace":
        return ""  # asked for the script
    if object_path() is None:
        return "bpf/build/waits.bpf.o is not built (scripts/build-bpf builds it with clang)"
    return libbpf.unavailable()


def capture(args: list[int | Path], duration: float | None, duty: float = 1.0) -> CompiledCapture:
    """waits.bt's parameters ($1-$6, probe.script_args) as the object's globals; with a duty
    below 1 (and an interval), each interval's snapshot is a capture of its own (engines.
    compiled): the maps are emptied and the processes seeded again before each attach."""
    postmaster, address, interval, single, be_address, state_offset = (int(str(a)) for a in args)
    path = object_path()
    assert path is not None
    rodata = {"postmaster": postmaster, "wei_addr": address, "only_pid": single,
              "be_addr": be_address, "state_off": state_offset,
              "local_wei": _pointer_at(postmaster, address)}  # fmt: skip

    entry = backend_state.StateAddress(be_address, state_offset) if be_address else None
    seeded: dict[int, int] = {}  # pid -> its run count written into its entry (_seed)
    asleep: dict[int, tuple[int, int]] = {}  # pid -> (that run count, its wait event)

    def start_window(obj: libbpf.BpfObject) -> None:
        _empty(obj)
        seeded.clear()
        seeded.update(_seed(obj, [single] if single else [postmaster, *proc.children(postmaster)]))
        # waits.bt sets @window_ns in BEGIN, before its probes attach: the same here.
        obj.update("scalars", _U32.pack(WINDOW), _U64.pack(time.monotonic_ns()))

    def read_asleep() -> None:
        asleep.clear()
        asleep.update(_asleep_since(seeded, address, entry))

    def read_all(obj: libbpf.BpfObject, info: RunInfo) -> Snapshot:
        # What records.since() needs for the sleeps begun before the capture (serve has no
        # SQL connection to ask pg_stat_activity, as pgprobe waits does). Before the maps:
        # a process that has not run yet slept all along until here; one that wakes from
        # here on has its switch-in in the maps.
        slept_in = {pid: wei for pid, (runs, wei) in asleep.items() if proc.run_count(pid) == runs}
        snapshot = read(obj, info, postmaster, single)
        records.keep_asleep(snapshot, slept_in, asleep)
        return snapshot

    return CompiledCapture(path, rodata, read_all, duration, interval or None, start_window,
                           duty, read_asleep)  # fmt: skip


def _asleep_since(
    seeded: dict[int, int], wei_address: int, entry: backend_state.StateAddress | None
) -> dict[int, tuple[int, int]]:
    """pid -> (run count, wait event), read right after the attach, for the processes that
    have not run since their seed (the run count the seed wrote, before the attach, is
    still theirs after this read of their memory) and sleep: in a wait event, or in none
    (0) where /proc says asleep (a process running all along, unseen by the probes, must
    not be charged a sleep). So they slept at the attach, in the event the probe would
    have read (records.records' asleep_at_start)."""
    out = {}
    for pid, runs in seeded.items():
        sleeping = proc.asleep(pid)
        try:
            wei = backend_state.read_as_probe(pid, wei_address, entry)
        except OSError:
            continue
        if (wei or sleeping) and proc.run_count(pid) == runs:
            out[pid] = (runs, wei)
    return out


def _empty(obj: libbpf.BpfObject) -> None:
    """A fresh capture's maps in an object that ran before (detached): no totals, no break
    in a CPU's chain, no read yet. @task is the seed's to reset, process by process (a task
    storage map cannot be walked); the object's per-CPU chain of switches may still name a
    process of the last run, whose entry the seed rewrote: it no longer matches (waits.bpf.c
    checks the entry's `since`), so no break is counted for it."""
    for name in (*_BY_TID, *_BY_PAIR, "wait_hist"):
        obj.clear(name)
    for slot in (GAP, READ):
        obj.update("scalars", _U32.pack(slot), _U64.pack(0))


def _pointer_at(pid: int, address: int) -> int:
    """What my_wait_event_info holds in the postmaster (it has no PGPROC): the address a
    process points it at until it has one; 0 when unreadable (the object then caches
    nothing and reads the pointer at every sleep)."""
    try:
        return waitevents_address.pointer_at(pid, address)
    except (OSError, ValueError):
        return 0


def _seed(obj: libbpf.BpfObject, pids: list[int]) -> dict[int, int]:
    """Each process's runqueue total and run count (/proc/PID/schedstat) in its @task entry,
    before the probes attach. The object has no wakeup probe: at a process's first
    switch-in it takes the runqueue part of a sleep that began before the capture from the
    kernel's count since this seed (exact also when the process moved to another CPU's
    queue, which restarts the kernel's "queued since"), if it has not run since.
    Returns pid -> the run count written, for the processes seeded."""
    seeded = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/schedstat").read_text().split()
            run_delay, runs = int(fields[1]), int(fields[2])
            pidfd = os.pidfd_open(pid)
        except (OSError, ValueError, IndexError):
            continue  # gone: nothing to seed
        try:
            obj.update("task", _I32.pack(pidfd), _TASK.pack(0, 0, 0, runs + 1, *[0] * 7, run_delay))
            seeded[pid] = runs
        except libbpf.LibbpfError:
            pass  # exited meanwhile; or refused: its first sleep counts from the last queueing
        finally:
            os.close(pidfd)
    return seeded


def _tasks(obj: libbpf.BpfObject, pids: list[int]) -> dict[Key, AggValue]:
    """@task of these processes: its state lives in the task (task local storage, asked by
    pidfd). An exited process has none left: its totals went to the maps at its last
    switch-out."""
    out: dict[Key, AggValue] = {}
    for pid in pids:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue  # gone
        try:
            value = obj.lookup("task", _I32.pack(pidfd))
        finally:
            os.close(pidfd)
        if value is not None:
            out[(pid,)] = _TASK.unpack(value)[:9]
    return out


def read(obj: libbpf.BpfObject, info: RunInfo, postmaster: int, single: int) -> Snapshot:
    """The maps as waits.bt prints them, @now_ns the moment the read began."""
    pids = [single] if single else [postmaster, *proc.children(postmaster)]
    now = time.monotonic_ns()
    # First: a sleep that ends after this moment keeps the part read here as its wait
    # event's (the object's end_sleep), so that no total shrinks between two reads.
    obj.update("scalars", _U32.pack(READ), _U64.pack(now))
    maps: dict[str, dict[Key, AggValue]] = {"now_ns": {(): now}}
    scalars = {_U32.unpack(k)[0]: _U64.unpack(v)[0] for k, v in obj.items("scalars")}
    maps["window_ns"] = {(): scalars.get(WINDOW, 0)}
    if scalars.get(GAP):
        maps["gap_ns"] = {(): scalars[GAP]}
    before = _tasks(obj, pids)
    for name in _BY_TID:
        maps[name] = {(_U32.unpack(k)[0],): _U64.unpack(v)[0] for k, v in obj.items(name)}
    for name in _BY_PAIR:
        maps[name] = {_PAIR.unpack(k): _U64.unpack(v)[0] for k, v in obj.items(name)}
    maps["task"] = _consistent(obj, before, _tasks(obj, pids), maps["wait_ns"])
    maps["wait_hist"] = _hists(obj.items("wait_hist"))
    info.failed_map_updates = scalars.get(REFUSED, 0)  # a full map: said like bpftrace's
    return Snapshot(label=time.strftime("%H:%M:%S"), maps=maps)


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
        if now is not None and isinstance(read, int) and _U64.unpack(now)[0] > read:
            out[key] = old
    return out


def _hists(items: list[tuple[bytes, bytes]]) -> dict[Key, AggValue]:
    """(tid, wei, slot) -> count into a Log2Hist per (tid, wei): slot 0 holds 0, slot k
    2^(k-1) .. 2^k - 1 (bpftrace's hist buckets)."""
    buckets: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for k, v in items:
        tid, wei, slot, _ = _HIST_KEY.unpack(k)
        low, high = (0, 0) if slot == 0 else (1 << (slot - 1), (1 << slot) - 1)
        buckets.setdefault((tid, wei), []).append((low, high, _U64.unpack(v)[0]))
    return {key: Log2Hist(tuple(sorted(b))) for key, b in buckets.items()}
