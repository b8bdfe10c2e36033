"""``waits --stacks --unwind dwarf``: whole off-CPU stacks on builds without frame pointers.

bpftrace's ustack walks frame pointers, so a sleep in Debian's libc (no frame
pointers: ``sem_wait``, ``recv``, ``epoll_wait``) or anywhere in a build without
them is cut short. In this mode two tracers watch the same ``sched_switch``:

- ``perf record -e sched:sched_switch --filter 'prev_state & 255' -c 1
  --call-graph dwarf,N -k monotonic -p PIDS`` copies N bytes of the user stack
  at every switch-out into a sleep of the targets (per-task events, inherited
  by the backends the postmaster forks; the filter drops preemptions, whose
  time is runqueue, not a wait), stamped with CLOCK_MONOTONIC;
- bpf/waits_stacks.bt with BY_TIME=1 keeps, instead of a ustack, each sleep
  apart as @off_t[tid, wait_event_info, switch-out ns] = the time the model
  charges it (switch-out to wakeup; to the switch-in when the wakeup was lost),
  and its nsecs is the same clock.

``join`` pairs each sleep with perf's sample of the same switch-out (the first
of that task stamped from it on: both are stamped in the same tracepoint call,
perf's a few µs later, and before the task's next switch-out),
and the stack perf copied is unwound with .eh_frame (pgprobe.unwind.capture,
flame's engine). So each stack weighs exactly what the time model charges its
wait event. A sleep without a matching sample keeps its time under a
``[no stack: ...]`` frame that says why.

perf starts first and stops after bpftrace, so every sleep of the window has
its switch-out inside perf's recording.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from pgprobe.engines.base import Capture, Event, KeyKind, MapSpec, Snapshot, TickCallback
from pgprobe.errors import EXIT_TRACER, PgprobeError
from pgprobe.symbolize import Symbolizer
from pgprobe.tools.waits import probe
from pgprobe.tools.waits.stacks import RawSleep
from pgprobe.unwind.capture import DEFAULT_STACK_BYTES, PerfCapture

BY_TIME: tuple[KeyKind, ...] = ("int", "int", "int")  # tid, wait_event_info, switch-out ns
MAPS = (
    *probe.STACKS_MAPS,
    MapSpec("off_t", BY_TIME),  # one sleep: its length
    MapSpec("open_t", BY_TIME),  # the sleep open at exit: its start
)
# One @off_t entry per sleep: room for what perf can copy in a capture (16 KiB each).
ENV = {**probe.STACKS_ENV, "BPFTRACE_MAP_KEYS_MAX": "131072"}
MATCH_NS = 1_000_000  # perf's sample of a switch-out follows bpftrace's by at most this
SWITCH_OUT_TO_SLEEP = "prev_state & 255"  # a sleep (S, D, ...), not a preemption (R, R+)
PERF_BUFFER = "8M"  # a burst of switch-outs at 16 KiB each fills perf's default buffer
ATTACH_TIMEOUT_S = 60.0
NOT_IN_PERF = "[no stack: perf has no switch-out for this sleep]"


def perf_event() -> list[str]:
    """perf record's event options: every switch-out into a sleep, on bpftrace's clock."""
    return ["-e", "sched:sched_switch", "--filter", SWITCH_OUT_TO_SLEEP, "-c", "1",
            "-k", "monotonic", "--user-callchains", "-m", PERF_BUFFER, "--synth=no"]  # fmt: skip


class SwitchStacks:
    """bpftrace's capture (BY_TIME) with perf recording the same switch-outs meanwhile.

    The final snapshot of the inner capture is yielded once perf has stopped and
    its stacks are unwound: ``stacks`` then holds {(pid, time): user addresses}.
    """

    def __init__(
        self,
        inner: Capture,
        perf: str,
        pids: Iterable[int],
        symbolizer: Symbolizer,
        stack_bytes: int = DEFAULT_STACK_BYTES,
    ) -> None:
        self.inner = inner
        self.perf = PerfCapture(perf, sorted(set(pids)), 1, float("inf"), False, symbolizer,
                                stack_bytes, event=perf_event(), timed=True)  # fmt: skip
        self.info = inner.info
        self.on_tick: TickCallback | None = None
        self.stacks: dict[int, list[tuple[int, tuple[int, ...]]]] = {}  # pid -> [(time, addrs)]
        self.recorded = 0  # switch-outs perf stored
        self.lost = 0  # switch-outs perf lost (ring buffer full)
        self._snapshot: Snapshot | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def request_stop(self) -> None:
        self.inner.request_stop()

    def _run_perf(self) -> None:
        try:
            for event in self.perf.events():
                if isinstance(event, Snapshot):
                    self._snapshot = event
        except BaseException as exc:  # re-raised in the main thread
            self._error = exc

    def _start_perf(self) -> None:
        self._thread = threading.Thread(target=self._run_perf, name="perf-switches", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        while self.perf.info.attach_seconds is None and self._thread.is_alive():
            if time.monotonic() > deadline:
                self.perf.request_stop()
                raise PgprobeError("perf record did not attach within 60 s", EXIT_TRACER)
            time.sleep(0.05)
        if self._error is not None:
            raise self._error

    def _stop_perf(self) -> None:
        self.perf.request_stop()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        snapshot = self._snapshot
        if snapshot is None:
            raise PgprobeError("perf record kept no switch-outs", EXIT_TRACER)
        timed = snapshot.get("timed_stacks")
        for key in timed:
            pid, stamp, addrs = key
            assert isinstance(pid, int) and isinstance(stamp, int) and isinstance(addrs, tuple)
            self.stacks.setdefault(pid, []).append((stamp, addrs))
        for entries in self.stacks.values():
            entries.sort()
        self.recorded = len(timed)
        total = snapshot.get("samples").get((), 0)
        self.lost = int(total) - self.recorded if isinstance(total, int) else 0

    def events(self) -> Iterator[Event]:
        self._start_perf()
        self.inner.on_tick = self.on_tick
        try:
            for event in self.inner.events():
                if isinstance(event, Snapshot) and event.final:
                    self._stop_perf()
                yield event
        finally:
            if self._thread is not None and self._thread.is_alive():
                self.perf.request_stop()
                self._thread.join()

    @property
    def stops(self) -> dict[tuple[int, tuple[int, ...]], str]:
        """Why a DWARF walk stopped early, per (pid, addresses)."""
        return self.perf.stops

    def facts(self, sleeps: int, matched: int, widest_ns: int) -> dict[str, Any]:
        """What the DWARF mode recorded and cost, for meta (JSON) and the docs."""
        cost = self.perf.cost
        return {
            "unwind": "dwarf",
            "switches_recorded": self.recorded,
            "switches_lost": self.lost,
            "sleeps": sleeps,
            "sleeps_with_stack": matched,
            "join_max_us": round(widest_ns / 1000, 3),  # switch-out to perf's sample, at most
            "stack_bytes": self.perf.stack_bytes,
            "bytes_per_switch": cost.file_bytes // self.recorded if self.recorded else 0,
            # CPU of pgprobe's children that ended meanwhile: perf record and bpftrace
            "tracers_cpu_s": round(cost.perf_cpu_s, 3),
            "unwind_cpu_s": round(cost.post_cpu_s, 3),
        }


def join(
    sleeps: Iterable[RawSleep], stacks: dict[int, list[tuple[int, tuple[int, ...]]]]
) -> tuple[list[RawSleep], int]:
    """Each sleep keyed by its switch-out time (an int) gets the stack of perf's first
    sample of the same task stamped at or after it (perf's handler runs after bpftrace's
    in the same tracepoint call: measured 0.7-17 µs later, at most 143 µs in 36,317
    sleeps), within MATCH_NS and before the task's next switch-out bpftrace saw (so a
    sample perf lost is never replaced by the next one); none: NOT_IN_PERF. Sleeps with
    no key (asleep since before the capture) are kept as they are. Also: the widest
    distance in ns between a sleep's switch-out and its sample."""
    sleeps = list(sleeps)
    outs: dict[int, list[int]] = {}  # pid -> bpftrace's switch-outs into a sleep, in order
    for s in sleeps:
        if isinstance(s.stack, int):
            outs.setdefault(s.pid, []).append(s.stack)
    for times in outs.values():
        times.sort()
    out = []
    widest = 0
    for s in sleeps:
        if not isinstance(s.stack, int):
            out.append(s)
            continue
        entries, times = stacks.get(s.pid, []), outs[s.pid]
        later = bisect.bisect_right(times, s.stack)
        limit = min(s.stack + MATCH_NS, times[later] if later < len(times) else s.stack + MATCH_NS)
        i = bisect.bisect_left(entries, (s.stack,))  # the same clock, read after bpftrace's
        if i < len(entries) and entries[i][0] < limit:
            stamp, addrs = entries[i]
            out.append(RawSleep(s.pid, s.wei, addrs, s.ns))
            widest = max(widest, abs(stamp - s.stack))
        else:
            out.append(RawSleep(s.pid, s.wei, None, s.ns, NOT_IN_PERF))
    return out, widest
