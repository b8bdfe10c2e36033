"""Stacks as tracers print them, and FlameGraph folded stacks.

bpftrace (-f json, BPFTRACE_NO_USER_SYMBOLS=1) prints a stack map key as
text, one frame per line, innermost first, each line indented::

    ustack          "\\n    0x5607a80fd88f\\n    0x5607a80f433c\\n"
    kstack(perf)    "\\n\\tffffffff8158e846 filemap_get_pages+166\\n..."
    ustack(perf)    "\\n\\t5607a80fd88f 0x5607a80fd88f ([unknown])\\n..."
    empty stack     ""

A key of several fields is one JSON string with the fields joined by ","
(``"6172,\\n    0x5607a80fd88f\\n"``, ``"6172,,\\n    0x..."`` when a
kernel stack between them is empty): split_bpftrace_key() takes it apart.

Folded stacks are FlameGraph's text format: one line per distinct stack,
frames root first joined by ";", a space, and a sample count::

    main;PostgresMain;exec_simple_query;ExecutorRun 41

Frame names carry offsets in several dialects: ``ExecScan+0x1a`` (perf),
``ExecScan+26`` (bpftrace), ``vfs_read+0x5/0x1a0`` (kernel), ``postgres`ExecScan+0x1a``
(DTrace). strip_offset() turns them into the function name, keeping a ``_[k]``-style
annotation, so that one function is one frame. An offset is *kept* when there is no symbol
to merge on: ``[unknown]+0x..``, ``0x7f..+0x..``, a library (``libfoo.so+0x1a2``,
``/usr/lib/x.so+0x10``) or the server executable itself (``postgres+0x4a2f10``, the form in
which a stripped binary's static functions appear): those frames stay distinct per address,
since two addresses in a stripped binary are usually two different functions and merging
them would invent one huge fake function. ``exe_names`` (default EXE_NAMES: ``postgres``,
``postmaster``) says which bare names are executables. These helpers live here, with the
stack code, so that findings and renderers both use them without importing each other.

API: parse_bpftrace_stack(text) -> tuple[int, ...]; split_bpftrace_key(text,
kinds) -> list[str]; fold(frames) -> str; unfold(stack) -> list[str];
parse_folded(lines) -> dict[str, int]; read_folded(path) -> dict[str, int];
format_folded(stacks) -> list[str]; write_folded(path_or_stream, stacks);
strip_offset(frame, exe_names=EXE_NAMES) -> str; function_name(frame) -> str;
is_address_base(func, exe_names) -> bool; OFFSET_RE.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TextIO

from pgprobe import outfile
from pgprobe.literal import literal

EXE_NAMES: frozenset[str] = frozenset({"postgres", "postmaster"})

# name, "+", hex or decimal offset, optional "/size" (kernel style), optional "_[k]" annotation
OFFSET_RE = re.compile(
    r"^(?P<base>.*?)\+(?:0[xX][0-9a-fA-F]+|[0-9]+)(?:/0[xX][0-9a-fA-F]+)?(?P<ann>_\[[a-z]+\])?$"
)


def is_address_base(func: str, exe_names: Iterable[str]) -> bool:
    """True if ``func`` (what precedes ``+offset``) names no function: keep its offset."""
    return (
        not func
        or func[0] == "["
        or func.startswith(("0x", "0X"))
        or "/" in func
        or ".so" in func
        or func in exe_names
    )


def strip_offset(frame: str, exe_names: Iterable[str] = EXE_NAMES) -> str:
    """``ExecScan+0x1a`` -> ``ExecScan``; unresolved ``postgres+0x4a2f10`` is kept as it is.

    See the module docstring for the forms handled and why addresses stay distinct.
    """
    m = OFFSET_RE.match(frame)
    if m is None:
        return frame
    base = m.group("base")
    if is_address_base(base.rpartition("`")[2], exe_names):
        return frame
    return base + (m.group("ann") or "")


def function_name(frame: str) -> str:
    """The function of a frame without module or offset.

    ``libc.so.6`__send`` -> ``__send``; ``ExecScan+0x1a`` -> ``ExecScan``.
    """
    return strip_offset(frame.rsplit("`", 1)[-1])


def parse_bpftrace_stack(text: str) -> tuple[int, ...]:
    """The raw addresses of a stack printed by bpftrace, innermost first.

    Accepts the default mode with raw addresses ("    0x5607a80fd88f" lines,
    as printed with BPFTRACE_NO_USER_SYMBOLS=1) and perf mode ("\\t<hex>
    <symbol> ..." lines, user or kernel). A frame that bpftrace printed as a
    name only (default-mode kstack, or ustack with symbols on) carries no
    address: ValueError.
    """
    out: list[int] = []
    for line in text.splitlines():
        token = line.strip().split(None, 1)
        if not token:
            continue
        try:
            out.append(int(token[0], 16))
        except ValueError:
            raise ValueError(f"stack frame without an address: {line.strip()!r}") from None
    return tuple(out)


def _stack_end(text: str, pos: int) -> int:
    """End of a stack field starting at pos (a "\\n" + indented lines), or pos if empty."""
    if not text.startswith("\n", pos):
        return pos
    i = pos
    while i < len(text) and text[i] == "\n":
        nxt = i + 1
        if nxt < len(text) and text[nxt] in " \t":
            j = text.find("\n", nxt)
            i = len(text) if j < 0 else j
        else:
            return nxt  # the "\n" closing the last frame
    return i


def split_bpftrace_key(text: str, kinds: Sequence[str]) -> list[str]:
    """Split a bpftrace -f json map key of several fields into its fields.

    kinds says what each field is: "int", "str" or "stack" (as
    engines.base.KeyKind). Stacks are recognised by their layout (they start
    with a newline and every frame line is indented), so they may be empty.
    A "str" field runs to the next "," (to the end for the last field):
    strings that contain "," are ambiguous in bpftrace's output and come out
    wrong unless they are the last field.
    """
    if len(kinds) == 1:
        return [text]
    fields: list[str] = []
    pos = 0
    for n, kind in enumerate(kinds):
        last = n == len(kinds) - 1
        if kind == "stack":
            end = _stack_end(text, pos)
        elif last:
            end = len(text)
        else:
            end = text.find(",", pos)
            if end < 0:
                raise ValueError(f"map key has fewer fields than {len(kinds)}: {text!r}")
        fields.append(text[pos:end])
        if last:
            if end != len(text):
                raise ValueError(f"map key has more fields than {len(kinds)}: {text!r}")
        else:
            if not text.startswith(",", end):
                raise ValueError(f"map key field {n} is not followed by ',': {text!r}")
            pos = end + 1
    return fields


def _clean(frame: str) -> str:
    # Every line break (\r, \x1c-\x1e, U+2028, ... which splitlines() honours) and control
    # character shown as text: a frame name can then never cut a folded stack in two.
    return literal(frame.replace(";", ":").replace("\n", " ")).strip() or "[unknown]"


def fold(frames: Sequence[str], empty: str = "[unknown]") -> str:
    """One folded stack from frame names given innermost first (as stacks are).

    The result is root first, joined by ";". A ";" inside a name becomes
    ":" (it would split the frame). An empty stack folds to `empty`, so that
    its samples still show. For a kernel + user sample, pass kernel frames
    then user frames (both innermost first).
    """
    if not frames:
        return empty
    return ";".join(_clean(f) for f in reversed(frames))


def unfold(stack: str) -> list[str]:
    """The frame names of a folded stack, innermost first (fold(unfold(s)) == s)."""
    return stack.split(";")[::-1] if stack else []


def parse_folded_line(line: str) -> tuple[str, int]:
    """("a;b;c", count) from "a;b;c count". Frame names may contain spaces."""
    stack, sep, count = line.rstrip("\r\n").rpartition(" ")
    stack = stack.rstrip()
    if not sep or not stack:
        raise ValueError(f"not a folded stack line: {line!r}")
    try:
        n = int(count)
    except ValueError:
        raise ValueError(f"folded stack line without a count: {line!r}") from None
    return stack, n


def parse_folded(lines: Iterable[str]) -> dict[str, int]:
    """Folded stack lines -> {stack: count}, adding up repeated stacks.

    Blank lines and lines starting with "#" are skipped.
    """
    out: dict[str, int] = {}
    for no, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            stack, n = parse_folded_line(line)
        except ValueError as e:
            raise ValueError(f"line {no}: {e}") from None
        out[stack] = out.get(stack, 0) + n
    return out


def read_folded(path: str | os.PathLike[str]) -> dict[str, int]:
    """Read a folded stacks file (flamegraph.pl, inferno, pgprobe)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return parse_folded(f)


def format_folded(stacks: Mapping[str, int]) -> list[str]:
    """Lines "stack count" (no newline), most samples first, then by stack."""
    rows = sorted(stacks.items(), key=lambda kv: (-kv[1], kv[0]))
    return [f"{stack} {n}" for stack, n in rows]


def write_folded(dest: str | os.PathLike[str] | TextIO, stacks: Mapping[str, int]) -> None:
    """Write folded stacks to a path ('-': stdout; written whole: pgprobe.outfile) or an
    open text stream."""
    text = "".join(line + "\n" for line in format_folded(stacks))
    if isinstance(dest, (str, os.PathLike)):
        outfile.write(dest, text)
    else:
        dest.write(text)
