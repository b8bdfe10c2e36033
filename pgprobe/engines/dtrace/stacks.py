"""DTrace's stack text: which lines are frames, and hand-captured ``@[ustack()]`` output.

DTrace prints a stack() or ustack() one frame a line, innermost first:
``postgres`ExecScan+0x8c``, ``libc.so.6`0x7f55a2a4724a`` (a module without a
symbol there), ``0x7fffbf7ff62a`` (no module: the process had exited, or
the address is in no mapping). illumos, FreeBSD and macOS indent the frames
(14 spaces); DTrace for Linux 2.0 prints them at column 0. So a frame is
recognized by its shape, not its indent; a pgprobe record line starts with
"@", a trace line (clog_reads mode 2) is tab-separated numbers and words,
neither of which looks like a frame.
"""

from __future__ import annotations

import re

from pgprobe.engines.base import NamedStack

# module`function+0xoff, module`function, module`0xaddr; or a bare address.
_FRAME = re.compile(r"[^\s`@]+`[^\s`]+|0x[0-9a-fA-F]+")
STACK_SEPARATOR = "--"  # between the stack fields of one record (printa "%k\n--%k")


def is_frame(text: str) -> bool:
    """Whether a stripped line is one frame of a printed stack."""
    return bool(_FRAME.fullmatch(text))


def parse_ustack_aggregation(text: str) -> dict[NamedStack, int]:
    """The default output of ``@[ustack()] = count()`` -> {stack: count}.

    DTrace prints each key stack as frame lines (indented, or at column 0 on
    Linux), then the count on a line of its own; blank lines separate the
    entries. Lines before the first stack (a "dtrace: script ... matched"
    line, a header) are ignored. Repeated stacks (several printa or
    aggregations) add up.
    """
    out: dict[NamedStack, int] = {}
    frames: list[str] = []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped:
            continue
        if stripped.isdigit() and frames:
            stack = NamedStack(tuple(frames))
            out[stack] = out.get(stack, 0) + int(stripped)
            frames = []
        elif is_frame(stripped):
            frames.append(stripped)
        else:
            frames = []  # not part of a stack block
    return out
