"""Folded stacks in: the four input dialects the renderer reads, merged into one dict; and
out: ``folded_file``, pgprobe's own folded output, its names shown as text.

Accepted, one stack per line, root first (FlameGraph's "folded" format)::

    postgres;PostgresMain;exec_simple_query;PortalRun;ExecScan 1234

Tolerated: blank lines, ``#`` comments, ``\\r\\n``, tabs or several spaces before the count,
decimal counts (rounded), perf/stackcollapse annotations (``func_[k]``), bpftrace maps printed
one per line (``@name[a;b;c]: 12``) and bpftrace's multi-line stack maps
(``@[\\n  leaf+12\\n  caller+40\\n]: 12``, leaf first, also ``ustack(perf)`` lines
``7f12ab sym+0x1a (/path)`` and extra keys such as ``@[comm, ustack]``, which become root
frames). bpftrace's ``Attaching N probes...`` banner is ignored. Malformed lines are
skipped and counted (``read_folded`` says how many and which was first), or raise
``ValueError`` with ``strict=True``.

Inside the package a profile is ``{"root;...;leaf;": count}`` (note the trailing separator:
layout.frame_tree relies on it); ``parse_folded`` turns that into tuples of interned names
for callers. This is input parsing rather than drawing; it stays beside the renderer because
``render_svg`` takes folded text directly and the fast path (docs/flamegraph-render.md) is
this string-keyed form, which nothing outside the renderer should depend on.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from pgprobe.literal import literal
from pgprobe.stacks import strip_offset

Stack = tuple[str, ...]


@dataclass
class Skipped:
    """Input lines that are not stacks: how many, and the number (from 1) of the first."""

    lines: int = 0
    first_line: int = 0

    def add(self, lineno: int) -> None:
        if not self.lines:
            self.first_line = lineno
        self.lines += 1


@dataclass(frozen=True)
class FoldedProfile:
    """Folded text once read (``read_folded``): the stacks in the renderer's own form, and
    what was skipped. ``render_svg`` and ``render_speedscope`` take it as it is (offsets were
    stripped, or not, when it was read)."""

    keyed: dict[str, int]  # "root;...;leaf;" -> count, counts > 0
    skipped: Skipped = field(default_factory=Skipped)

    @property
    def samples(self) -> int:
        return sum(self.keyed.values())

    def stacks(self) -> dict[Stack, int]:
        """``{(root, ..., leaf): count}``, names interned (as ``parse_folded``)."""
        intern = sys.intern
        return {tuple(map(intern, k[:-1].split(";"))): n for k, n in self.keyed.items()}


StacksInput: TypeAlias = (
    FoldedProfile
    | str
    | Path
    | Mapping[Stack, int]
    | Mapping[str, int]
    | Iterable[str]
    | Iterable[tuple[Stack, int]]
    | Iterable[tuple[str, int]]
)

_TAIL_RE = re.compile(r"^(.*?)\s+([0-9]+(?:\.[0-9]*)?)$")
_BPF_LINE_RE = re.compile(r"^@\w*\[(.*)\]:\s*([0-9]+(?:\.[0-9]*)?)$")
_BPF_OPEN_RE = re.compile(r"^@\w*\[(.*)$")
_BPF_CLOSE_RE = re.compile(r"^\]:\s*([0-9]+(?:\.[0-9]*)?)$")
_PERF_FRAME_RE = re.compile(r"^(?:0x)?[0-9a-fA-F]+\s+(.+?)(?:\s+\([^()]*\))?$")
_BANNER_RE = re.compile(r"^Attaching [0-9]+ probes?\.\.\.$")  # bpftrace's first line

_SPECIAL_START = frozenset(["", "#", "@", "]", " ", "\t", "\r", "\n", "\f", "\v"])


def _normalize(stack: str, strip_offsets: bool) -> str:
    if strip_offsets and "+" in stack:
        stack = ";".join([strip_offset(f) for f in stack.split(";")])
    return stack


def _parse_lines(
    lines: Iterable[str],
    acc: dict[str, int],
    strip_offsets: bool,
    strict: bool,
    skipped: Skipped | None = None,
) -> None:
    """Add the stacks of folded ``lines`` to ``acc``, keyed ``"root;...;leaf;"``; lines that
    are not stacks raise ``ValueError`` (``strict``) or are counted in ``skipped``.

    The common line takes the first branch (one rpartition, one int, one concatenation);
    anything else goes to the tolerant path.
    """
    get = acc.get
    block: list[str] | None = None  # frames of a bpftrace multi-line stack, leaf first
    block_keys: list[str] = []
    block_line = 0  # where that stack began
    special = _SPECIAL_START
    for lineno, raw in enumerate(lines, 1):
        if block is None and raw[:1] not in special:
            # the common line, "a;b;c 12\n": no copy but the key, int() ignores the newline
            stack, _, cnt = raw.rpartition(" ")
            try:
                n = int(cnt)
            except ValueError:
                pass  # the tolerant path below
            else:
                if stack[-1:] in (" ", "\t"):
                    stack = stack.rstrip()
                if n > 0 and stack:
                    if strip_offsets and "+" in stack:
                        stack = _normalize(stack, True)
                    key = stack + ";"
                    acc[key] = get(key, 0) + n
                elif skipped is not None and (n < 0 or not stack):
                    skipped.add(lineno)  # "12" or "a;b -3": no frames, or no count
                continue
        line = raw.strip()
        if not line:
            continue
        if block is None:
            c0 = line[0]
            if c0 != "#" and c0 != "@" and c0 != "]":
                stack, _, cnt = line.rpartition(" ")
                try:
                    n = int(cnt)
                except ValueError:
                    m = _TAIL_RE.match(line)
                    if m is None:
                        if strict:
                            msg = f"line {lineno}: not a folded stack: {line!r}"
                            raise ValueError(msg) from None
                        if skipped is not None and not _BANNER_RE.match(line):
                            skipped.add(lineno)
                        continue
                    stack, n = m.group(1), round(float(m.group(2)))
                stack = stack.rstrip()
                if n > 0 and stack:
                    key = _normalize(stack, strip_offsets) + ";"
                    acc[key] = get(key, 0) + n
                elif skipped is not None and (n < 0 or not stack):
                    skipped.add(lineno)
                continue
            if c0 == "#":
                continue
            if c0 == "@":
                m = _BPF_LINE_RE.match(line)
                if m is not None:
                    n = round(float(m.group(2)))
                    stack = m.group(1).strip()
                    if n > 0 and stack:
                        key = _normalize(stack, strip_offsets) + ";"
                        acc[key] = get(key, 0) + n
                    continue
                m = _BPF_OPEN_RE.match(line)
                if m is not None:
                    block = []
                    block_keys = [k.strip() for k in m.group(1).split(",") if k.strip()]
                    block_line = lineno
                    continue
            if strict:
                raise ValueError(f"line {lineno}: not a folded stack: {line!r}")
            if skipped is not None:
                skipped.add(lineno)
            continue
        # inside a bpftrace multi-line stack
        m = _BPF_CLOSE_RE.match(line)
        if m is None:
            pm = _PERF_FRAME_RE.match(line)
            frame = pm.group(1) if pm is not None else line
            if frame.endswith(","):  # end of one key of several: "leaf+12,"
                frame = frame[:-1].rstrip()
            if frame:
                block.append(frame.replace(";", ":"))
            continue
        n = round(float(m.group(1)))
        frames = block_keys + block[::-1]
        block = None
        if n > 0 and frames:
            key = _normalize(";".join(frames), strip_offsets) + ";"
            acc[key] = get(key, 0) + n
    if block is not None:
        if strict:
            raise ValueError("unterminated bpftrace stack at end of input")
        if skipped is not None:
            skipped.add(block_line)


def _join_stack(frames: Stack | str) -> str:
    if isinstance(frames, str):
        return frames
    s = ";".join(frames)
    if s.count(";") != len(frames) - 1:  # a ";" inside a name would split it
        s = ";".join([f.replace(";", ":") for f in frames])
    return s


def _parse_pairs(
    pairs: Iterable[tuple[Stack | str, int]], acc: dict[str, int], strip_offsets: bool
) -> None:
    get = acc.get
    for frames, n in pairs:
        if n <= 0 or not frames:
            continue
        key = _normalize(_join_stack(frames), strip_offsets) + ";"
        acc[key] = get(key, 0) + int(n)


def fold(stacks: StacksInput, strip_offsets: bool) -> dict[str, int]:
    """Any accepted input -> ``{"root;...;leaf;": count}`` (note the trailing separator)."""
    if isinstance(stacks, FoldedProfile):
        return stacks.keyed
    acc: dict[str, int] = {}
    if isinstance(stacks, str):
        _parse_lines(stacks.splitlines(), acc, strip_offsets, False)
    elif isinstance(stacks, Path):
        with stacks.open(encoding="utf-8", errors="replace") as f:
            _parse_lines(f, acc, strip_offsets, False)
    elif isinstance(stacks, Mapping):
        _parse_pairs(stacks.items(), acc, strip_offsets)
    else:
        it: Iterator[object] = iter(stacks)
        first = next(it, None)
        if first is None:
            return acc
        rest: Iterator[object] = _chain1(first, it)
        if isinstance(first, str):
            _parse_lines(rest, acc, strip_offsets, False)  # type: ignore[arg-type]
        else:
            _parse_pairs(rest, acc, strip_offsets)  # type: ignore[arg-type]
    return acc


def _chain1(first: object, it: Iterator[object]) -> Iterator[object]:
    yield first
    yield from it


def parse_folded(
    lines: str | Iterable[str], *, strip_offsets: bool = True, strict: bool = False
) -> dict[Stack, int]:
    """Folded text or lines -> ``{(root, ..., leaf): count}``, identical stacks merged.

    Frame names are interned, so a profile of many deep stacks costs little memory.
    """
    acc: dict[str, int] = {}
    _parse_lines(
        lines.splitlines() if isinstance(lines, str) else lines, acc, strip_offsets, strict
    )
    intern = sys.intern
    return {tuple(map(intern, k[:-1].split(";"))): n for k, n in acc.items()}


def read_folded(text: str, *, strip_offsets: bool = True) -> FoldedProfile:
    """Folded text -> a ``FoldedProfile``: the stacks, and the lines that were not stacks."""
    acc: dict[str, int] = {}
    skipped = Skipped()
    _parse_lines(text.splitlines(), acc, strip_offsets, False, skipped)
    return FoldedProfile(acc, skipped)


def folded_file(lines: Iterable[str]) -> str:
    """Folded ``stack count`` lines as the text of a file, in the order given.

    A text format that people cat and other tools read (flamegraph.pl, inferno): a control
    character in a frame name would reach a terminal, a line break would cut its stack in
    two, and flamegraph.pl would copy it into an invalid SVG. So names are shown as text
    (pgprobe.literal); ``;`` inside a name is already ``:`` (pgprobe.stacks.fold).
    """
    return "".join(literal(line) + "\n" for line in lines)
