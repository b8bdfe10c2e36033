"""What bpf/waits_stacks.bt hands back for ``waits --stacks``: off-CPU time per
(process, wait event, user stack). Pure functions, no I/O.

The script charges each sleep to @off_ns[tid, wei, stack] when it charges the
same sleep to @wait_ns[tid, wei] (the time model), so per process and event the
stacks add up to the model's figure. Two parts of the model have no stack, and
are kept under a ``[no stack: ...]`` frame instead of being dropped:
- a sleep still open when the maps were printed: its stack is in
  @open_ns[tid, wei, stack] = its start, matched to @task's state 4 (the
  reader adds now - start, as records._add_open does for the model);
- a sleep that began before the capture (no switch-out seen, so no stack):
  whatever the model has for (pid, event) beyond the stacks.

``idle_event`` says which sleeps are idle as the time model counts them
(records._model): Client:ClientRead in state idle (between transactions) and
Activity:* (background processes' main loops, the postmaster's too). The graph
leaves their stacks out unless --idle (view.emit_stacks); the JSON keeps them,
flagged ``idle``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pgprobe import waitevents
from pgprobe.engines.base import KeyValue, Snapshot
from pgprobe.tools.waits.records import ASLEEP, ProcessTime, window
from pgprobe.waitevents import backend_state

NO_STACK = "[no stack: asleep since before the capture]"


@dataclass(frozen=True)
class RawSleep:
    """Off-CPU time of one process in one wait event with one raw stack (None: no stack)."""

    pid: int
    wei: int
    stack: KeyValue | None  # the tracer's stack key (raw addresses, innermost first)
    ns: int
    missing: str = NO_STACK  # the frame shown when there is no stack: why


@dataclass(frozen=True)
class OffCpuStack:
    """A named stack's off-CPU time: what the flame graph, folded and pprof outputs show."""

    pid: int
    wait_event_type: str
    wait_event: str
    frames: tuple[str, ...]  # folded names, innermost first
    ns: int
    idle: bool = False  # idle time (idle_event): left out of the graph unless --idle

    @property
    def wait_frame(self) -> str:
        """The root frame: the wait event as pg_stat_activity shows it (Class:Event)."""
        return wait_frame(self.wait_event_type, self.wait_event)

    def folded(self) -> tuple[str, ...]:
        """Root first: the wait event, then the stack from its outermost frame."""
        return (self.wait_frame, *reversed(self.frames))

    def as_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "wait_event_type": self.wait_event_type,
            "wait_event": self.wait_event,
            "stack": ";".join(reversed(self.frames)),
            "off_cpu_ns": self.ns,
            "idle": self.idle,
        }


def idle_event(major: int, shown_wei: int) -> bool:
    """Idle as the time model counts it: ClientRead between transactions, Activity:*.

    shown_wei: the event as waitevents.shown gives it (the postmaster's loop is Activity);
    ClientRead of an unknown state is not idle (the model's "unknown")."""
    state = backend_state.state_of(major, shown_wei)
    if state is not None:
        return backend_state.category(state) == "idle"
    return waitevents.is_idle(*waitevents.name(major, shown_wei))


def split_idle(stacks: Iterable[OffCpuStack], keep: bool) -> tuple[list[OffCpuStack], int]:
    """(the stacks drawn, the idle nanoseconds left out): all of them when keep."""
    shown, left = [], 0
    for s in stacks:
        if s.idle and not keep:
            left += s.ns
        else:
            shown.append(s)
    return shown, left


def wait_frame(wait_event_type: str, wait_event: str) -> str:
    return f"{wait_event_type}:{wait_event}" if wait_event_type else wait_event


def raw_sleeps(
    snapshot: Snapshot,
    procs: Iterable[ProcessTime],
    keep: Callable[[int], bool],
    maps: tuple[str, str] = ("off_ns", "open_ns"),
) -> list[RawSleep]:
    """The stacks' time per (pid, event, stack), open sleeps included, plus what the
    time model of each kept process has beyond its stacks (no stack: NO_STACK).

    maps: the charged and the open sleeps; ("off_t", "open_t") with BY_TIME, where
    the "stack" is the sleep's switch-out time (pgprobe.tools.waits.dwarfstacks)."""
    _start, end = window(snapshot)
    asleep_since = {}
    for (tid,), task in snapshot.get("task").items():
        if isinstance(task, tuple) and len(task) >= 3 and task[1] == ASLEEP:
            asleep_since[tid] = (task[0], task[2])
    out: list[RawSleep] = []
    stacked: dict[tuple[int, int], int] = {}

    def add(pid: int, wei: int, stack: KeyValue | None, ns: int) -> None:
        out.append(RawSleep(pid, wei, stack, ns))
        stacked[pid, wei] = stacked.get((pid, wei), 0) + ns

    charged, still_open = maps
    for (tid, wei, stack), value in snapshot.get(charged).items():
        assert isinstance(tid, int) and isinstance(wei, int) and isinstance(value, int)
        if keep(tid):
            add(tid, wei, stack, value)
    for (tid, wei, stack), since in snapshot.get(still_open).items():
        assert isinstance(tid, int) and isinstance(wei, int) and isinstance(since, int)
        if keep(tid) and asleep_since.get(tid) == (since, wei) and since <= end:
            add(tid, wei, stack, end - since)
    for p in procs:
        if not keep(p.pid):
            continue
        for wei, ns in p.wait_ns.items():
            rest = ns - stacked.get((p.pid, wei), 0)
            if rest > 0:
                out.append(RawSleep(p.pid, wei, None, rest))
    return out


def by_event(stacks: Iterable[OffCpuStack]) -> dict[str, int]:
    """Off-CPU ns per wait event frame (Class:Event)."""
    out: dict[str, int] = {}
    for s in stacks:
        out[s.wait_frame] = out.get(s.wait_frame, 0) + s.ns
    return out


def folded_us(stacks: Iterable[OffCpuStack]) -> dict[tuple[str, ...], int]:
    """{(wait event, outermost, ..., innermost): microseconds}, as offcputime's folded."""
    ns: dict[tuple[str, ...], int] = {}
    for s in stacks:
        key = s.folded()
        ns[key] = ns.get(key, 0) + s.ns
    return {k: round(v / 1000) for k, v in ns.items() if round(v / 1000) > 0}
