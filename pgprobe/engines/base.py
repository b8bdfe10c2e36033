"""What every engine hands to the tools: engine-neutral aggregations and lines.

A probe script (bpf/<tool>.bt or d/<tool>.d) fills named aggregations keyed by
a fixed tuple of fields, and may print lines. An engine runs the script and
turns whatever its tracer prints (bpftrace JSON, DTrace printa text) into the
types below, so that a tool never looks at a tracer's output format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

# How one key field is typed: a number, a text, or a stack of raw addresses
# (innermost frame first, as tracers print them).
KeyKind = Literal["int", "str", "stack"]
KeyValue = int | str | tuple[int, ...]
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


AggValue = int | Stats | Log2Hist


@dataclass(frozen=True)
class MapSpec:
    """The key layout of one aggregation, as the script declares it."""

    name: str
    key: tuple[KeyKind, ...]


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
    interrupted: bool = False  # ended by Ctrl-C / SIGTERM rather than the duration
    warnings: list[str] = field(default_factory=list)


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
