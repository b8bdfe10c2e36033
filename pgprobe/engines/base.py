"""What every engine hands to the tools: engine-neutral aggregations and lines.

A probe script (bpf/<tool>.bt or d/<tool>.d) fills named aggregations keyed by
a fixed tuple of fields, and may print lines. An engine runs the script and
turns whatever its tracer prints (bpftrace JSON, DTrace printa text) into the
types below, so that a tool never looks at a tracer's output format.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from pgprobe.symbolize import Frame

# DTrace's text for one stack frame: "module`function+0xoffset" (or without the
# offset at a function's first instruction), "module`0xaddress" (a module with
# no symbol there), "0xaddress" (no module: the process had exited when DTrace
# printed the stack, or the address is in no mapping).
_HEX = re.compile(r"0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class NamedStack:
    """A stack whose frames the tracer already named: DTrace's ustack()/stack() text.

    ``frames`` are the lines DTrace printed, stripped, innermost first
    (``postgres`SimpleLruReadPage+0x1b4``, ``libc.so.1`__pread+0xa``,
    ``0x7fffbf7ff62a``). bpftrace stacks are raw addresses instead; both are
    "stack" key fields (see KeyKind). DTrace names frames when it prints them,
    from the live process: a process that exited before that gets hex-only
    frames, which symbolized() reports as unresolved ``[unknown]`` frames.
    """

    frames: tuple[str, ...]

    def symbolized(self, kernel: bool = False) -> list[Frame]:
        """pgprobe.symbolize.Frame per frame, as Symbolizer gives for raw addresses.

        ``module`function+0xoff`` -> Frame(function, module, resolved, off);
        ``module`0xaddr`` -> an unresolved frame named by that text;
        ``0xaddr`` -> ``[unknown]`` (offset = the address, for display).
        kernel=True (a stack() field) appends FlameGraph's ``_[k]`` to names,
        as Symbolizer.kernel_frames does.
        """
        from pgprobe.symbolize import KERNEL_SUFFIX, UNKNOWN, Frame

        suffix = KERNEL_SUFFIX if kernel else ""
        out = []
        for text in self.frames:
            module, tick, rest = text.partition("`")
            if not tick:
                if _HEX.fullmatch(text):
                    out.append(Frame(UNKNOWN + suffix, UNKNOWN, False, int(text, 16)))
                else:  # a bare name (no module): keep it as DTrace printed it
                    out.append(Frame(text + suffix, UNKNOWN, True))
            elif _HEX.fullmatch(rest):
                out.append(Frame(text + suffix, module, False))
            else:
                name, plus, off = rest.rpartition("+")
                if plus and _HEX.fullmatch(off) and name:
                    out.append(Frame(name + suffix, module, True, int(off, 16)))
                else:
                    out.append(Frame(rest + suffix, module, True))
        return out


# How one key field is typed: a number, a text, or a stack (innermost frame
# first, as tracers print them). A "stack" field arrives in one of two forms,
# whichever the engine can give:
#   tuple[int, ...]  raw addresses (bpftrace, run with BPFTRACE_NO_USER_SYMBOLS=1):
#                    the tool names them with pgprobe.symbolize.Symbolizer;
#   NamedStack       frames the tracer already named (DTrace ustack()/stack()
#                    text): NamedStack.symbolized() gives the same Frames.
# A tool declares "stack" once for both engines and tells the two forms apart
# with isinstance(value, NamedStack); after symbolizing, both are list[Frame]
# and fold the same way (symbolize.folded_names, stacks.fold).
KeyKind = Literal["int", "str", "stack"]
KeyValue = int | str | tuple[int, ...] | NamedStack
Key = tuple[KeyValue, ...]


@dataclass(frozen=True)
class Stats:
    """count and sum of the values (bpftrace stats(), DTrace count()+sum())."""

    count: int
    total: int


@dataclass(frozen=True)
class Log2Hist:
    """A power-of-two histogram: buckets of (low, high inclusive, count).

    Buckets are sorted by `low`; empty buckets may be absent. A value v falls in
    the bucket low <= v <= high ([0,0], [1,1], [2,3], [4,7], ...).
    """

    buckets: tuple[tuple[int, int, int], ...]

    @property
    def count(self) -> int:
        return sum(c for _, _, c in self.buckets)


# tuple[int, ...]: a map whose values are tuples of integers (bpftrace; per-task state).
AggValue = int | Stats | Log2Hist | tuple[int, ...]


@dataclass(frozen=True)
class MapSpec:
    """The key layout of one aggregation, as the script declares it.

    combine: how two entries whose keys print the same add up ("sum" for
    count/sum/stats/hist, "max" or "min" for max()/min()). bpftrace keeps
    distinct keys whose printed text is the same (two stack ids of identical
    frames, strings with different bytes after their end): one aggregation
    may print one key twice. "last": a state map that the script deletes
    from while bpftrace prints it; the kernel restarts bpftrace's walk of the
    keys when the key it stands on is deleted, so the same key is printed
    again, read a moment later. The value printed last is kept (bpftrace
    sorts what it prints, so it may be either read: both are of this print).
    """

    name: str
    key: tuple[KeyKind, ...]
    combine: Literal["sum", "max", "min", "last"] = "sum"


@dataclass
class Snapshot:
    """The aggregations printed at one moment (an interval's end, or exit)."""

    label: str = ""
    final: bool = False
    maps: dict[str, dict[Key, AggValue]] = field(default_factory=dict)

    def get(self, name: str) -> dict[Key, AggValue]:
        return self.maps.get(name, {})


@dataclass
class Line:
    """One line the script printed (trace modes)."""

    text: str


@dataclass
class RunInfo:
    """Facts about a finished or running capture, for meta and loss reports."""

    engine: str = ""
    engine_version: str = ""
    probes_attached: int = 0
    attach_seconds: float = 0.0  # from start of the tracer to probes attached
    duration_seconds: float = 0.0  # from probes attached to the end of capture
    lost_events: int = 0  # events the tracer dropped (output buffers full)
    failed_map_updates: int = 0  # aggregation updates refused (map full)
    # BPF program runs the kernel skipped because another BPF program was running on
    # that CPU (an interrupt inside it): fdinfo's recursion_misses, read at the stop.
    missed_runs: int = 0
    interrupted: bool = False  # ended by Ctrl-C / SIGTERM rather than the duration
    warnings: list[str] = field(default_factory=list)
    # The probes stopped counting (the first output of the tracer's END, after SIGINT):
    # the moment a SQL window compared with the probes must close.
    stopped_counting: bool = False
    # How the tracer ended when it was not asked to, or did not end as asked: one
    # sentence ("bpftrace was killed by signal 9 (SIGKILL) 4.1 s after its probes
    # attached"); None when it stopped as asked. What it printed before is kept and
    # marked partial.
    ended_early: str | None = None

    @property
    def partial(self) -> bool:
        return self.ended_early is not None


Event = Snapshot | Line


TickCallback = Callable[[RunInfo, "float | None"], None]


class Capture(Protocol):
    """A running probe script: iterate to receive snapshots and lines.

    on_tick, when set, is called a few times a second with the seconds left
    (None until the probes are attached), for a countdown.
    """

    info: RunInfo
    on_tick: TickCallback | None

    def events(self) -> Iterator[Event]: ...

    def request_stop(self) -> None:
        """End early, from any thread; what was collected is still delivered."""
        ...
