"""DTrace's documented output formats, written out: the other half of the parser tests.

No DTrace runs on this machine, so the tests need DTrace output from
somewhere. This module writes it the way the Dynamic Tracing Guide documents
it, for the printa() formats of the d/ scripts:

- printa("...%@d") of count()/sum()/max(): the number in decimal;
- printa("...\\n%@d\\n") of quantize(): a newline, the header line
  ``           value  ------------- Distribution ------------- count    ``,
  one row per power-of-two bucket (``%16d |`` + 40 columns of ``@`` in
  proportion to the count + `` %-9d``) from the zero row below the first
  non-empty bucket to the zero row above the last, then the format's newline;
- printa("...%@d%k") of a stack: a newline, then one line per frame indented
  by 14 spaces (DTrace's default stackindent), ``module`function+0xoffset``,
  ``module`0xaddress`` or ``0xaddress``;
- printf("@@snapshot\\t%Y\\n", walltimestamp): ``2026 Nov 21 23:44:19``.

render_snapshot() turns an engine-neutral Snapshot (e.g. parsed from a real
bpftrace run) into the text the D script would print for the same data, so
that the equivalence tests can check that the DTrace parser gives back the
very same records. The tests below pin the writer itself to the documented
layout (the header, a row, a stack block).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pgprobe.engines.base import AggValue, Key, Log2Hist, NamedStack, Snapshot, Stats
from pgprobe.symbolize import KERNEL_SUFFIX, UNKNOWN, Frame

HEADER = "           value  ------------- Distribution ------------- count    "
STACK_INDENT = " " * 14
BAR_WIDTH = 40


@dataclass(frozen=True)
class Printa:
    """One printa() of a d/ script: the tag it prints, the map, and the value kind."""

    tag: str  # "@wait_stats:count"
    name: str  # "wait_stats"
    kind: str  # "count" | "total" | "int" | "hist" | "stacks"


LWLOCK_WAIT = (
    Printa("@wait_stats:count", "wait_stats", "count"),
    Printa("@wait_stats:total", "wait_stats", "total"),
    Printa("@wait_max_ns", "wait_max_ns", "int"),
    Printa("@wait_ns", "wait_ns", "hist"),
    Printa("@wait_unfinished", "wait_unfinished", "int"),
)
CLOG_READS = (
    Printa("@read_stats:count", "read_stats", "count"),
    Printa("@read_stats:total", "read_stats", "total"),
    Printa("@read_bytes", "read_bytes", "int"),
    Printa("@read_max_ns", "read_max_ns", "int"),
    Printa("@read_ns", "read_ns", "hist"),
    Printa("@read_stacks", "read_stacks", "stacks"),
)
PROFILE = (
    Printa("@samples", "samples", "int"),
    Printa("@stacks", "stacks", "stacks"),
    Printa("@kstacks", "kstacks", "stacks"),
)


def quantize_rows(hist: Log2Hist) -> list[tuple[int, int]]:
    """(low bound, count) rows as DTrace prints them, from a Log2Hist of bpftrace's shape."""
    counts: dict[int, int] = {}
    for low, high, count in hist.buckets:
        if high < 0:
            counts[-1] = counts.get(-1, 0) + count  # bpftrace's one negative bucket
        else:
            counts[low] = counts.get(low, 0) + count
    if not counts:
        return []
    ladder = [-1, 0] + [1 << i for i in range(63)]
    used = [i for i, v in enumerate(ladder) if counts.get(v)]
    lo, hi = max(used[0] - 1, 0), min(used[-1] + 1, len(ladder) - 1)
    return [(ladder[i], counts.get(ladder[i], 0)) for i in range(lo, hi + 1)]


def quantize_table(hist: Log2Hist) -> list[str]:
    """The lines %@d prints for a quantize() aggregation (after its leading newline)."""
    rows = quantize_rows(hist)
    total = sum(c for _, c in rows) or 1
    lines = [HEADER]
    for value, count in rows:
        bar = "@" * round(BAR_WIDTH * count / total)
        lines.append(f"{value:>16} |{bar:<{BAR_WIDTH}} {count:<9}")
    return lines


def frame_text(frame: Frame) -> str:
    """DTrace's text for a frame that pgprobe's symbolizer named."""
    name = frame.name.removesuffix(KERNEL_SUFFIX)
    if frame.module == UNKNOWN:
        return f"0x{frame.offset:x}" if frame.offset else "0x0"
    if not frame.resolved:  # DTrace knows the module but no symbol: module`0xaddress
        return f"{frame.module}`0x{frame.offset:x}"
    return f"{frame.module}`{name}+0x{frame.offset:x}" if frame.offset else f"{frame.module}`{name}"


def stack_lines(stack: NamedStack) -> list[str]:
    return [STACK_INDENT + f for f in stack.frames]


def _key_fields(key: Key) -> list[str]:
    return [str(k) for k in key if not isinstance(k, (NamedStack, tuple))]


def _sorted(entries: dict[Key, AggValue], weight: str) -> list[tuple[Key, AggValue]]:
    def value_of(item: tuple[Key, AggValue]) -> int:
        value = item[1]
        if isinstance(value, Stats):
            return value.count if weight == "count" else value.total
        if isinstance(value, Log2Hist):
            return value.count
        return value

    # printa() prints in increasing order of the aggregation's value
    return sorted(entries.items(), key=lambda kv: (value_of(kv), repr(kv[0])))


def render_maps(snapshot: Snapshot, layout: Sequence[Printa]) -> list[str]:
    """The printa() output of one snapshot, in the script's order of printa()."""
    out: list[str] = []
    for p in layout:
        entries = snapshot.get(p.name)
        for key, value in _sorted(entries, p.kind):
            fields = "\t".join([p.tag, *_key_fields(key)])
            if p.kind in ("count", "total"):
                assert isinstance(value, Stats)
                out.append(f"{fields}\t{value.count if p.kind == 'count' else value.total}")
            elif p.kind == "int":
                assert isinstance(value, int)
                out.append(f"{fields}\t{value}")
            elif p.kind == "hist":
                assert isinstance(value, Log2Hist)
                out += [fields, "", *quantize_table(value), ""]
            else:
                assert isinstance(value, int)
                stacks = [k for k in key if isinstance(k, NamedStack)]
                out.append(f"{fields}\t{value}")
                for n, stack in enumerate(stacks):
                    if n:
                        out += ["", "--"]
                    out += stack_lines(stack)
                out.append("")
    return out


def render_run(
    snapshots: Iterable[Snapshot],
    layout: Sequence[Printa],
    script: str,
    attached_extra: str = "",
    date: str = "2026 Nov 21",
) -> str:
    """The whole stdout of a d/ script run: @@attached, then each snapshot."""
    lines = ["@@attached\t" + script + (f"\t{attached_extra}" if attached_extra else "")]
    for snap in snapshots:
        lines.append(f"@@snapshot\t{date} {snap.label or '00:00:00'}")
        lines += render_maps(snap, layout)
    return "\n".join(lines) + "\n"


# -- the writer itself, against the documented layout --------------------------------------


def test_quantize_table_matches_the_documented_layout() -> None:
    hist = Log2Hist(((2048, 4095, 3), (4096, 8191, 0), (8192, 16383, 1)))
    lines = quantize_table(hist)
    assert lines[0] == HEADER
    assert lines[1] == "            1024 |                                         0        "
    assert lines[2] == "            2048 |@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@           3        "
    assert lines[3].startswith("            4096 |") and lines[3].rstrip().endswith(" 0")
    assert lines[-1].rstrip().endswith(" 0") and lines[-1].lstrip().startswith("16384 |")
    assert len(lines) == 6


def test_frame_text_forms() -> None:
    assert frame_text(Frame("ExecScan", "postgres", True, 0x8C)) == "postgres`ExecScan+0x8c"
    assert frame_text(Frame("main", "postgres", True, 0)) == "postgres`main"
    assert frame_text(Frame("[unknown]", "[unknown]", False, 0x7F12)) == "0x7f12"
    assert frame_text(Frame("swtch_[k]", "unix", True, 0x14D)) == "unix`swtch+0x14d"
