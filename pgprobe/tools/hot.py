"""`pgprobe hot`: the functions the targets spend their CPU in (hotuser, for PostgreSQL).

The same capture as `pgprobe flame` (bpf/profile.bt through
pgprobe.tools.profiling), turned into a table of functions: by self samples
(the function was on CPU itself: the innermost frame) and by total samples
(the function was anywhere in the stack: it or its callees were on CPU).
A function that appears several times in one stack (recursion) counts once
for that sample, so total_pct never exceeds 100. ``--lib`` groups by module
(the server binary, each library, the kernel with --kernel).

JSON rows (``--json``; keys are stable), sorted like the table (``--sort``):

  function        the function (rows by function only); unresolved frames of a
                  stripped file are ``module+0x<function start>``
                  (``postgres+0x2f70b0``), stacks the kernel could not walk
                  ``[unknown]``; kernel functions without FlameGraph's ``_[k]``
  module          basename of the file the function is in (``postgres``,
                  ``libc.so.6``, ``plpgsql.so``), ``[kernel.kallsyms]``,
                  ``[jit]`` (generated code), ``[truncated]`` (the
                  ``[truncated: why]`` frame of a cut stack), ``[unknown]``
  self_samples    samples in which this function was the innermost frame
  self_pct        self_samples x 100 / all samples of the targets
  total_samples   samples in which the function was anywhere in the stack
  total_pct       total_samples x 100 / all samples of the targets

``meta`` holds the capture facts of every tool plus ``hz``, ``samples``,
``samples_taken``, ``lost_samples``, ``sampled_pids``,
``unresolved_frames_pct``, ``server_unresolved_frames_pct`` and
``server_symbols`` (see pgprobe.tools.profiling).

Caveat of frame-pointer stacks (``--unwind fp``): a leaf function that sets up
no frame (such as ``hash_bytes`` or libc's ``memcpy`` on Debian's build) hides
its caller, whose samples then go to the caller's caller; ``--unwind dwarf``
shows it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pgprobe.render import table
from pgprobe.symbolize import Frame
from pgprobe.tools import common, profiling

NAME = "hot"
DEFAULT_TOP = 25


def top_value(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (all) or more: {text}")
    return value


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="the functions backends spend their CPU in (self and total samples)",
        description="Sample the on-CPU stacks of PostgreSQL processes and rank the "
        "functions by self samples (on CPU themselves) and total samples (on the stack).",
    )
    profiling.add_profile_arguments(parser)
    parser.add_argument("--lib", action="store_true", help="one row per module (library)")
    parser.add_argument(
        "--top",
        type=top_value,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"show the first N rows (default {DEFAULT_TOP}; 0: all)",
    )
    parser.add_argument(
        "--sort",
        choices=["self", "total"],
        default="self",
        help="rank by self samples (default) or by total samples",
    )
    parser.set_defaults(run=run)


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


COLUMNS = [
    table.Column("self", "SELF", numeric=True),
    table.Column("self_pct", "SELF%", numeric=True),
    table.Column("total", "TOTAL", numeric=True),
    table.Column("total_pct", "TOTAL%", numeric=True),
]


def cells(row: HotRow) -> dict[str, str]:
    return {
        "self": f"{row.self_samples:,}",
        "self_pct": f"{row.pct(row.self_samples):.1f}%",
        "total": f"{row.total_samples:,}",
        "total_pct": f"{row.pct(row.total_samples):.1f}%",
        "function": row.function or "",
        "module": row.module,
    }


def run(ns: argparse.Namespace) -> int:
    profile = profiling.collect(ns)
    rows = hot_rows(profile.stacks, by_module=ns.lib, sort=ns.sort)
    shown = rows[: ns.top] if ns.top else rows
    meta = profile.meta(group="module" if ns.lib else "function", sort=ns.sort, top=ns.top)
    if ns.json:
        common.print_json(NAME, meta, [r.as_json() for r in shown])
    else:
        facts = profile.facts()
        title = (
            f"{common.title('CPU samples', meta)}\n"
            f"{facts['samples']} samples at {facts['Hz']} Hz, {facts['lost']} lost, "
            f"{facts['unresolved frames']} of frames unresolved; "
            f"top {len(shown)} of {len(rows)} by {ns.sort} samples"
        )
        columns = [*COLUMNS]
        if not ns.lib:
            columns.append(table.Column("function", "FUNCTION"))
        columns.append(table.Column("module", "MODULE"))
        empty = f"no samples in {meta['duration_s']:.1f} s (the targets were idle)"
        table.render(title, columns, [cells(r) for r in shown], empty=empty)
    profiling.print_warnings(profile)
    return 0
