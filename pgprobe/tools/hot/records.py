"""What ``pgprobe hot`` computes from a capture: self and total samples per function (or
per module), as frozen rows with ``as_json``. No I/O."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pgprobe.symbolize import Frame
from pgprobe.tools import profiling

NAME = "hot"


@dataclass(frozen=True)
class HotRow:
    function: str | None  # None with --lib
    module: str
    self_samples: int
    total_samples: int
    samples: int  # of all the targets: the percent base

    def pct(self, n: int) -> float:
        return 100.0 * n / self.samples if self.samples else 0.0

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {} if self.function is None else {"function": self.function}
        row.update(
            module=self.module,
            self_samples=self.self_samples,
            self_pct=round(self.pct(self.self_samples), 2),
            total_samples=self.total_samples,
            total_pct=round(self.pct(self.total_samples), 2),
        )
        return row


Key = tuple[str | None, str]


def _key(frame: Frame, by_module: bool) -> Key:
    return (None, frame.module) if by_module else (profiling.plain_name(frame), frame.module)


def hot_rows(
    stacks: Iterable[profiling.StackCount], by_module: bool, sort: str = "self"
) -> list[HotRow]:
    """Self and total samples per function (or module), most first."""
    self_n: Counter[Key] = Counter()
    total_n: Counter[Key] = Counter()
    samples = 0
    for s in stacks:
        samples += s.count
        frames = s.frames or (profiling.UNKNOWN_FRAME,)
        self_n[_key(frames[0], by_module)] += s.count
        for key in {_key(f, by_module) for f in frames}:
            total_n[key] += s.count
    rows = [
        HotRow(func, module, self_n[(func, module)], total, samples)
        for (func, module), total in total_n.items()
    ]

    def order(r: HotRow) -> tuple[int, int, str, str]:
        first, second = (
            (r.self_samples, r.total_samples)
            if sort == "self"
            else (r.total_samples, r.self_samples)
        )
        return (-first, -second, r.function or "", r.module)

    rows.sort(key=order)
    return rows


@dataclass(frozen=True)
class PartRows:
    """--by query: one statement's (or other part's) samples and its functions."""

    key: tuple[int, int]  # (state, id) as the probe read it
    kind: str
    query_id: int | None
    name: str  # 'query 123: UPDATE ...'
    samples: int
    rows: list[HotRow]


def part_rows(profile: profiling.Profile, by_module: bool, sort: str) -> list[PartRows]:
    """hot_rows per part (statement), the part with most samples first."""
    groups: dict[tuple[int, int], list[profiling.StackCount]] = {}
    for s in profile.stacks:
        groups.setdefault(s.query or (0, 0), []).append(s)
    out = []
    for key, stacks in groups.items():
        part = profile.parts[key]
        out.append(
            PartRows(
                key,
                part.kind,
                part.query_id,
                profile.part_names.get(key, ""),
                sum(s.count for s in stacks),
                hot_rows(stacks, by_module, sort),
            )
        )
    out.sort(key=lambda p: (-p.samples, p.name))
    return out
