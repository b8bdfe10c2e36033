"""The d/ scripts' output -> the records the bpftrace engine gives for the same script.

Lines, fields separated by tabs::

    @@attached <TAB> <script> [...]       BEGIN: every probe is enabled
    @@snapshot <TAB> <%Y walltimestamp>   opens a snapshot (interval or END)
    @@end                                 END printed everything
    @<map> <TAB> <key>... <TAB> <value>   count()/sum()/max() via printa %@d
    @<map>:count <TAB> <key>... <TAB> <n>     the two halves of one Stats
    @<map>:total <TAB> <key>... <TAB> <sum>   (bpftrace's stats()): count(), sum()
    @<map> <TAB> <key>...                 then DTrace's quantize table (%@d):
                                              value  --- Distribution --- count
                                                 1024 |@@@@@@        12
    @<map> <TAB> <scalar keys> <TAB> <count>  then the stack frames (%k), one
                                          a line (see stacks.py); several stack
                                          fields are separated by a line "--"
    anything else                         a Line (trace modes: printf lines)

Records become exactly what the bpftrace engine gives for the same script:
the same map names and key tuples (fields typed by the tool's MapSpec),
Stats(count, total), int, and Log2Hist with bpftrace's buckets: DTrace's
quantize rows are power-of-two low bounds, mapped to (low, high) = (0, 0),
(1, 1), (2, 3), (4, 7), ...; the zero rows DTrace prints around the data are
dropped and the zero rows between kept (as bpftrace's JSON has them); negative
rows are summed into bpftrace's one negative bucket. Stack fields are
NamedStack (frames already named by DTrace) where bpftrace gives raw
addresses: see engines.base.KeyKind.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from pgprobe.engines.base import (
    Event,
    Key,
    KeyKind,
    KeyValue,
    Line,
    Log2Hist,
    MapSpec,
    NamedStack,
    RunInfo,
    Snapshot,
    Stats,
)
from pgprobe.engines.dtrace.stacks import STACK_SEPARATOR, is_frame

_NEG_INF = -(2**63)
_HIST_ROW = re.compile(r"^\s*(-?\d+)\s+\|[@|\s]*?\s(\d+)\s*$")
_HIST_HEADER = re.compile(r"\bvalue\s+-+\s*Distribution\s*-+\s+count\b")
_LABEL_TIME = re.compile(r"\b(\d\d:\d\d:\d\d)\b")


def quantize_buckets(rows: Sequence[tuple[int, int]]) -> Log2Hist:
    """DTrace quantize() rows (low bound, count) -> a Log2Hist shaped like bpftrace's.

    Rows are 0, 1, 2, 4, 8, ... (and -1, -2, -4, ... for negative values).
    Leading and trailing zero rows are dropped, zero rows in between are
    kept; negative rows become one (-2**63, -1) bucket, bpftrace's.
    """
    negative = 0
    buckets: list[tuple[int, int, int]] = []
    for value, count in rows:
        if value < 0:
            if -value & (-value - 1):
                raise ValueError(f"not a quantize() row: {value}")
            negative += count
        elif value == 0:
            buckets.append((0, 0, count))
        elif value & (value - 1):
            raise ValueError(f"not a quantize() row (not a power of two): {value}")
        else:
            buckets.append((value, 2 * value - 1, count))
    if negative:
        buckets.insert(0, (_NEG_INF, -1, negative))
    while buckets and buckets[0][2] == 0:
        buckets.pop(0)
    while buckets and buckets[-1][2] == 0:
        buckets.pop()
    return Log2Hist(tuple(buckets))


def _convert(text: str, kind: KeyKind | None) -> KeyValue:
    if kind == "int":
        return int(text.strip())
    return text


@dataclass
class _Hist:
    name: str
    key: Key
    rows: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _Stacks:
    name: str
    key: Key  # the scalar fields
    value: int
    stacks: list[list[str]] = field(default_factory=lambda: [[]])


class DtraceOutput:
    """The d/ scripts' output lines -> Snapshots and Lines (see the module docstring)."""

    def __init__(self, specs: dict[str, MapSpec], info: RunInfo) -> None:
        self.specs = specs
        self.info = info
        self.current: Snapshot | None = None
        self.pending: _Hist | _Stacks | None = None
        self.halves: dict[str, dict[Key, list[int | None]]] = {}
        self.unparsed = 0  # records not in the layout: said once, at the end
        self.first_unparsed = ""
        self.complete = False  # END printed everything (its last line, "@@end")

    # feeding ---------------------------------------------------------------------------

    def feed(self, line: str) -> Iterator[Event]:
        line = line.rstrip("\r\n")
        if isinstance(self.pending, _Hist) and self._hist_line(self.pending, line):
            return
        if isinstance(self.pending, _Stacks) and self._stack_line(self.pending, line):
            return
        self._close_pending_or_warn()
        if not line.strip():
            return  # the blank lines %@d and %k leave around tables and stacks
        if line.startswith("@@"):
            yield from self._control(line)
        elif line.startswith("@"):
            try:
                self._record(line)
            except ValueError as exc:
                self._not_understood(line, exc)
        else:
            yield Line(line)

    def finish(self) -> Iterator[Event]:
        self._close_pending_or_warn()
        if self.unparsed:
            self.info.warnings.append(
                f"{self.unparsed} records of dtrace's output not understood (left out), "
                f"first: {self.first_unparsed}"
            )
            self.unparsed = 0
        if self.current is not None:
            self._close_halves()
            self.current.final = True
            yield self.current
            self.current = None

    # control lines ----------------------------------------------------------------------

    def _control(self, line: str) -> Iterator[Event]:
        tag, _, rest = line.partition("\t")
        if tag == "@@attached":
            self.info.probes_attached = max(self.info.probes_attached, 1)
        elif tag == "@@end":
            self.complete = True
        elif tag == "@@snapshot":
            if self.current is not None:
                self._close_halves()
                yield self.current
            found = _LABEL_TIME.search(rest)
            self.current = Snapshot(label=found.group(1) if found else rest.strip())
        else:
            self.info.warnings.append(f"unknown control line from the D script: {line[:200]}")

    # records ----------------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        if self.current is None:  # records before any marker: still keep them
            self.current = Snapshot()
        return self.current

    def _record(self, line: str) -> None:
        header = _HIST_HEADER.search(line)
        if header:  # a quantize table printed with no newline before its header
            line = line[: header.start()].rstrip()
        tag, *fields = line.split("\t")
        name, _, half = tag[1:].partition(":")
        spec = self.specs.get(name)
        kinds: tuple[KeyKind, ...] | None = spec.key if spec else None
        if kinds is not None and "stack" in kinds:
            self.pending = self._stack_record(name, kinds, fields)
            return
        if kinds is None:  # a map the tool did not declare: text keys, value last
            has_value = bool(fields) and fields[-1].strip().lstrip("-").isdigit()
            text: KeyKind = "str"
            kinds = (text,) * (len(fields) - 1 if has_value else len(fields))
        n = len(kinds)
        key = tuple(_convert(f, k) for f, k in zip(fields[:n], kinds, strict=False))
        if len(key) != n:
            raise ValueError(f"record {line!r} has fewer than {n} key fields")
        tail = fields[n:]
        if not tail:
            self.pending = _Hist(name, key)
            return
        if len(tail) != 1:
            raise ValueError(f"record {line!r} has more than {n} key fields and a value")
        value = int(tail[0].strip())
        if half in ("count", "total"):
            slot = self.halves.setdefault(name, {}).setdefault(key, [None, None])
            slot[0 if half == "count" else 1] = value
        elif half:
            raise ValueError(f"unknown record kind {tag!r}")
        else:
            self._snapshot().maps.setdefault(name, {})[key] = value

    def _stack_record(self, name: str, kinds: tuple[KeyKind, ...], fields: list[str]) -> _Stacks:
        first = kinds.index("stack")
        if any(k != "stack" for k in kinds[first:]):
            raise ValueError(f"map {name}: stack fields must come last in the key")
        scalar_kinds = kinds[:first]
        if len(fields) < first + 1:
            raise ValueError(f"stack record of {name} without a count: {fields!r}")
        key = tuple(_convert(f, k) for f, k in zip(fields[:first], scalar_kinds, strict=True))
        # The count, and perhaps the first frame if %k printed no leading newline.
        count_text, _, frame = "\t".join(fields[first:]).strip().partition(" ")
        record = _Stacks(name, key, int(count_text))
        if frame.strip():
            record.stacks[0].append(frame.strip())
        return record

    def _hist_line(self, hist: _Hist, line: str) -> bool:
        if not line.strip() or _HIST_HEADER.search(line):
            return True
        row = _HIST_ROW.match(line)
        if not row:
            return False
        hist.rows.append((int(row.group(1)), int(row.group(2))))
        return True

    def _stack_line(self, record: _Stacks, line: str) -> bool:
        text = line.strip()
        if not text:
            return True
        if text.startswith(STACK_SEPARATOR):
            record.stacks.append([])
            text = text[len(STACK_SEPARATOR) :].strip()
            if text:
                record.stacks[-1].append(text)
            return True
        if is_frame(text):
            record.stacks[-1].append(text)
            return True
        return False

    def _not_understood(self, text: str, exc: ValueError) -> None:
        self.unparsed += 1
        self.first_unparsed = self.first_unparsed or f"{text[:120]!r} ({exc})"

    def _close_pending_or_warn(self) -> None:
        name = self.pending.name if self.pending is not None else ""
        try:
            self._close_pending()
        except ValueError as exc:
            self._not_understood(f"@{name}", exc)

    def _close_pending(self) -> None:
        pending, self.pending = self.pending, None
        if pending is None:
            return
        maps = self._snapshot().maps.setdefault(pending.name, {})
        if isinstance(pending, _Hist):
            maps[pending.key] = quantize_buckets(pending.rows)
            return
        spec = self.specs[pending.name]
        wanted = spec.key.count("stack")
        stacks = pending.stacks
        if len(stacks) != wanted:
            raise ValueError(
                f"stack record of {pending.name} has {len(stacks)} stacks, expected {wanted}"
            )
        key = pending.key + tuple(NamedStack(tuple(s)) for s in stacks)
        maps[key] = pending.value

    def _close_halves(self) -> None:
        if not self.halves:
            return
        snapshot = self._snapshot()
        for name, entries in self.halves.items():
            target = snapshot.maps.setdefault(name, {})
            for key, (count, total) in entries.items():
                if count is None or total is None:
                    self.info.warnings.append(
                        f"{name}: only one of count/total printed for {key!r}"
                    )
                target[key] = Stats(count=count or 0, total=total or 0)
        self.halves = {}
