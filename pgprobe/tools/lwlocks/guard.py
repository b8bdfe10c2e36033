"""The --max-events-per-sec guard of `pgprobe lwlocks` (USDT source).

Every LWLock wait fires two uprobes, about FIRE_COST_US of CPU each, paid as long as
the probes are attached: a script that merely stopped recording would still pay it.
So lwlock_wait.bt (.d) counts the fires of the targets, compares each second's with
the limit, and when it is passed stops recording, prints one marker line and exits
(which detaches the probes). `Guarded` wraps the capture: it takes the marker out of
the printed lines, and on the final snapshot says the stop was the guard's (not a
tracer that died) and sets the window to what the script captured.

Marker: "@@guard <TAB> CAPTURED_MS <TAB> FIRES_LAST_S <TAB> FIRES <TAB> WAITS".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pgprobe.engines.base import Capture, Event, Line, RunInfo, Snapshot, TickCallback

MARKER = "@@guard"
# Each probe fire (two per wait) costs about FIRE_COST_US of CPU on the 2-CPU VM of
# docs/benchmarks.md (bench2, contention workload: BPF 0.6-2 us + the uprobe trap ~16 us,
# 16.9-17.3 us all in), paid as long as the probes are attached: only detaching bounds it.
FIRE_COST_US = 17


@dataclass(frozen=True)
class GuardStop:
    """What the script said when the guard stopped it."""

    captured_ms: int  # from the script's BEGIN (probes attached) to the stop
    fires_last_s: int  # the fires of the second that passed the limit
    fires: int  # every fire counted (wait starts + dones of the targets)
    waits: int  # the waits recorded (dones): the table's WAITS add up to this

    @property
    def captured_s(self) -> float:
        return self.captured_ms / 1000

    def meta(self, limit: int) -> dict[str, Any]:
        return {
            "stopped_by_guard": True,
            "captured_s": round(self.captured_s, 3),
            "fires_per_s": self.fires_last_s,
            "fires_counted": self.fires,
            "waits_counted": self.waits,
            "max_events_per_sec": limit,
        }

    def sentence(self) -> str:
        """The one stderr line that says why the capture is short and what to do."""
        share = self.fires_last_s * FIRE_COST_US / 1e4  # fires/s x us -> % of a CPU
        return (
            f"pgprobe: stopped after {self.captured_s:.1f} s: {self.fires_last_s:,} fires/s "
            f"would cost about {share:.1f} % of a CPU (about {FIRE_COST_US} µs each here); "
            "raise --max-events-per-sec or use --source sched"
        )


def marker(stop: GuardStop) -> str:
    """The marker line the script prints (the compiled object's capture makes it too)."""
    return "\t".join(str(v) for v in (MARKER, stop.captured_ms, stop.fires_last_s, stop.fires,
                                      stop.waits))  # fmt: skip


def parse(text: str) -> GuardStop | None:
    """The marker line as a GuardStop; None for any other line."""
    fields = text.split("\t")
    if fields[0] != MARKER or len(fields) != 5:
        return None
    try:
        return GuardStop(*(int(f) for f in fields[1:]))
    except ValueError:
        return None


def no_guard_meta(limit: int) -> dict[str, Any]:
    return {"stopped_by_guard": False, "max_events_per_sec": limit}


class Guarded:
    """A lwlock_wait capture whose guard marker is taken out of its printed lines."""

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.info: RunInfo = capture.info  # the same object: the engine fills it in
        self.stop: GuardStop | None = None

    @property
    def on_tick(self) -> TickCallback | None:
        return self.capture.on_tick

    @on_tick.setter
    def on_tick(self, callback: TickCallback | None) -> None:
        self.capture.on_tick = callback

    def request_stop(self) -> None:
        self.capture.request_stop()

    def events(self) -> Iterator[Event]:
        for event in self.capture.events():
            if isinstance(event, Line) and (stop := parse(event.text)) is not None:
                self.stop = stop
                continue
            if isinstance(event, Snapshot) and event.final and self.stop is not None:
                info = self.info
                if not info.interrupted:
                    # The script ended itself, as the guard asks: not a tracer that died.
                    info.ended_early = None
                # The window is the script's own, up to the stop (the exit, END and the
                # maps' printing come after it and are not part of it).
                info.duration_seconds = self.stop.captured_s
            yield event
