"""Folded stacks in: the four input dialects the renderer reads, merged into one dict.

Accepted, one stack per line, root first (FlameGraph's "folded" format)::

    postgres;PostgresMain;exec_simple_query;PortalRun;ExecScan 1234

Tolerated: blank lines, ``#`` comments, ``\\r\\n``, tabs or several spaces before the count,
decimal counts (rounded), perf/stackcollapse annotations (``func_[k]``), bpftrace maps printed
one per line (``@name[a;b;c]: 12``) and bpftrace's multi-line stack maps
(``@[\\n  leaf+12\\n  caller+40\\n]: 12``, leaf first, also ``ustack(perf)`` lines
``7f12ab sym+0x1a (/path)`` and extra keys such as ``@[comm, ustack]``, which become root
frames). Malformed lines are skipped, or raise ``ValueError`` with ``strict=True``.

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
from pathlib import Path
from typing import TypeAlias

from pgprobe.stacks import strip_offset

Stack = tuple[str, ...]
StacksInput: TypeAlias = (
    str
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

_SPECIAL_START = frozenset(["", "#", "@", "]", " ", "\t", "\r", "\n", "\f", "\v"])


def _normalize(stack: str, strip_offsets: bool) -> str:
    if strip_offsets and "+" in stack:
        stack = ";".join([strip_offset(f) for f in stack.split(";")])
    return stack


def _parse_lines(
    lines: Iterable[str], acc: dict[str, int], strip_offsets: bool, strict: bool
) -> None:
    """Add the stacks of folded ``lines`` to ``acc``, keyed ``"root;...;leaf;"``.

    The common line takes the first branch (one rpartition, one int, one concatenation);
    anything else goes to the tolerant path.
    """
    get = acc.get
    block: list[str] | None = None  # frames of a bpftrace multi-line stack, leaf first
    block_keys: list[str] = []
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
                        continue
                    stack, n = m.group(1), round(float(m.group(2)))
                stack = stack.rstrip()
                if n > 0 and stack:
                    key = _normalize(stack, strip_offsets) + ";"
                    acc[key] = get(key, 0) + n
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
                    continue
            if strict:
                raise ValueError(f"line {lineno}: not a folded stack: {line!r}")
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
    if block is not None and strict:
        raise ValueError("unterminated bpftrace stack at end of input")


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
