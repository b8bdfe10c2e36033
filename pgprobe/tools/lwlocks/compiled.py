"""LWLock waits from bpf/lwlock_wait.bpf.c, compiled: its maps read into the script's.

The object times what bpf/lwlock_wait.bt times (each wait from lwlock__wait__start to
lwlock__wait__done, per thread) and keeps, per (pid or 0, tranche, mode) and CPU, the
count, total, max and log2 histogram; pgprobe adds the CPUs up into the script's maps
(@wait_stats, @wait_max_ns, @wait_ns, @wait_unfinished), so that records.py reads either.
What the script does in its own probes, pgprobe does here at its reads:
- the windows (--interval): the programs count into one of two buffers (scalars[BUF]);
  a window's read flips it, then reads and deletes the other one's entries, as the script
  prints and clears a map while its probes count into the map's _b twin;
- the guard (--max-events-per-sec): at each tick, the fires of the last second against
  the limit; past it, the programs stop recording (scalars[STOPPED]), the capture ends
  (closing the object detaches the probes) and says so with the script's marker line,
  which guard.Guarded reads the same way.
Why: no bpftrace process (~100 MiB, its start and LLVM compile), the USDT sites attached
in milliseconds (bpftrace 0.17 takes 80-150 ms per site to detach at its end).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path

from pgprobe import histogram
from pgprobe.engines import compiled as engine
from pgprobe.engines import libbpf
from pgprobe.engines.base import AggValue, Event, Key, Line, Log2Hist, RunInfo, Snapshot, Stats
from pgprobe.engines.compiled import CompiledCapture
from pgprobe.tools.lwlocks import guard

OBJECT = "lwlock_wait.bpf.o"
PROVIDER = "postgresql"
PROGRAMS = {"on_wait_start": "lwlock__wait__start", "on_wait_done": "lwlock__wait__done"}
FIRES, WAITS, UNFINISHED, REFUSED, BUF, STOPPED = 0, 1, 2, 4, 5, 6  # the `scalars` slots
HIST_SLOTS = 48
_KEY = struct.Struct("<IIII64s")  # pid (or 0), mode, buffer, CPU, tranche
_VALUE = struct.Struct(f"<{3 + HIST_SLOTS}Q")  # count, total, max, histogram slots
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def mode_name(mode: int) -> str:
    """LWLockMode as the script names it."""
    return "Exclusive" if mode == 0 else "Shared" if mode == 1 else "WaitUntilFree"


def rodata(args: list[int | Path]) -> dict[str, int]:
    """The object's globals from the script's parameters (probe.script_args: $1 binary,
    $2 postmaster, $3 key by pid, $4 interval, $5 single pid, $6 the guard)."""
    values = [int(str(a)) for a in args[1:]]
    return {"postmaster": values[0], "by_pid": values[1], "only_pid": values[3]}


def _scalars(obj: libbpf.BpfObject) -> dict[int, int]:
    return {_U32.unpack(k)[0]: _U64.unpack(v)[0] for k, v in obj.items("scalars")}


def _set(obj: libbpf.BpfObject, which: int, value: int) -> None:
    obj.update("scalars", _U32.pack(which), _U64.pack(value))


def _maps(
    obj: libbpf.BpfObject, buffers: tuple[int, ...], clear: bool
) -> dict[str, dict[Key, AggValue]]:
    """The script's maps from the entries of these buffers, the CPUs added up (clear: the
    entries deleted once read, a window's)."""
    stats: dict[Key, list[int]] = {}
    hists: dict[Key, list[int]] = {}
    for raw_key, raw_value in obj.items("waits"):
        pid, mode, buf, _cpu, tranche = _KEY.unpack(raw_key)
        if buf not in buffers:
            continue
        if clear:
            obj.delete("waits", raw_key)
        count, total, longest, *slots = _VALUE.unpack(raw_value)
        key: Key = (pid, tranche.split(b"\0", 1)[0].decode(errors="replace"), mode_name(mode))
        acc = stats.setdefault(key, [0, 0, 0])
        acc[0], acc[1], acc[2] = acc[0] + count, acc[1] + total, max(acc[2], longest)
        into = hists.setdefault(key, [0] * HIST_SLOTS)
        for slot, n in enumerate(slots):
            into[slot] += n
    return {
        "wait_stats": {k: Stats(c, t) for k, (c, t, _) in stats.items()},
        "wait_max_ns": {k: m for k, (_, _, m) in stats.items()},
        "wait_ns": {k: _log2(slots) for k, slots in hists.items()},
    }


def _log2(slots: list[int]) -> Log2Hist:
    return Log2Hist(tuple((*histogram.slot_bounds(k), n) for k, n in enumerate(slots) if n))


class Guard:
    """--max-events-per-sec at pgprobe's ticks: the fires since the last check, per second."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stop: guard.GuardStop | None = None
        self._checked_s = 0.0  # capture seconds at the last check
        self._fires = 0  # fires then

    def check(self, obj: libbpf.BpfObject, info: RunInfo) -> bool:
        """Whether the capture must stop now (the programs stop recording at once)."""
        elapsed = info.duration_seconds
        if not self.limit or self.stop is not None or elapsed - self._checked_s < 1.0:
            return False
        scalars = _scalars(obj)
        fires = scalars.get(FIRES, 0)
        per_s = round((fires - self._fires) / (elapsed - self._checked_s))
        self._checked_s, self._fires = elapsed, fires
        if per_s <= self.limit:
            return False
        _set(obj, STOPPED, 1)
        waits = _scalars(obj).get(WAITS, 0)
        self.stop = guard.GuardStop(int(elapsed * 1000), per_s, fires, waits)
        return True


class LwlockCapture(CompiledCapture):
    """The object's capture with the guard at each tick and its marker line at the end."""

    guard: Guard

    def events(self) -> Iterator[Event]:
        for event in super().events():
            if isinstance(event, Snapshot) and event.final and self.guard.stop is not None:
                self.info.interrupted = False  # the guard's stop, not the user's
                yield Line(guard.marker(self.guard.stop))
            yield event


def capture(
    args: list[int | Path], duration: float | None, interval: float | None, max_fires: int
) -> CompiledCapture:
    """The script's capture from the object (not started: iterate its events())."""
    path = engine.object_path(OBJECT)
    assert path is not None
    binary = str(args[0])
    state = {"buf": 0}

    def read(obj: libbpf.BpfObject, info: RunInfo) -> Snapshot:
        scalars = _scalars(obj)
        info.failed_map_updates = scalars.get(REFUSED, 0)
        if interval and not info.stopped_counting:  # a window: flip, then the old buffer's
            old = state["buf"]
            state["buf"] = 1 - old
            _set(obj, BUF, state["buf"])
            maps = _maps(obj, (old,), clear=True)
            unfinished = _scalars(obj).get(UNFINISHED + old, 0)
            _set(obj, UNFINISHED + old, 0)
        else:
            maps = _maps(obj, (0, 1), clear=False)
            unfinished = scalars.get(UNFINISHED, 0) + scalars.get(UNFINISHED + 1, 0)
        maps["wait_unfinished"] = {(): unfinished}
        return Snapshot(label=time.strftime("%H:%M:%S"), maps=maps)

    limit = Guard(max_fires)
    usdt = {prog: (binary, PROVIDER, probe) for prog, probe in PROGRAMS.items()}
    run: LwlockCapture

    def tick(obj: libbpf.BpfObject) -> None:
        if limit.check(obj, run.info):
            run.request_stop()

    run = LwlockCapture(path, rodata(args), read, duration, interval, every_tick=tick, usdt=usdt)
    run.guard = limit
    return run
