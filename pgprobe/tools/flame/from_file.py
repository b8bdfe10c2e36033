"""``pgprobe flame --from FILE``: a folded file (pgprobe, perf + stackcollapse, inferno,
bpftrace output) rendered without tracing, so without root.

Lines that are not stacks are left out and said in one line on stderr (how many, the first
one's number) and in the SVG's subtitle; a file with no stack at all, or binary data, is a
usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.render import flamegraph
from pgprobe.tools import pprof_export
from pgprobe.tools.flame.output import write


def read_source(source: str) -> str:
    """The text of --from FILE ('-': stdin): UTF-8 (or UTF-16 with a byte order mark),
    undecodable bytes replaced by U+FFFD; binary data refused."""
    try:
        if source == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(source, "rb") as f:
                data = f.read()
    except OSError as exc:
        raise PgprobeError(f"cannot read {source}: {exc.strerror or exc}", EXIT_USAGE) from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16 with its byte order mark
        return data.decode("utf-16", errors="replace")
    if b"\0" in data:
        where = "stdin" if source == "-" else source
        raise PgprobeError(
            f"{where} is binary data (it holds NUL bytes), not folded stacks", EXIT_USAGE
        )
    return data.decode("utf-8-sig", errors="replace")  # "-sig": a leading BOM is dropped


def read_profile(source: str, raw: str) -> flamegraph.FoldedProfile:
    """Parse --from's text; say what was skipped; no stack at all is a usage error."""
    profile = flamegraph.read_folded(raw)
    skipped = profile.skipped
    where = "stdin" if source == "-" else source
    bad = (
        f"{'1 line is' if skipped.lines == 1 else f'{skipped.lines:,} lines are'} not "
        f"`frame;frame;... count` (the first is line {skipped.first_line})"
    )
    if not profile.keyed:
        if skipped.lines:
            raise PgprobeError(f"no folded stacks in {where}: {bad}", EXIT_USAGE)
        raise PgprobeError(
            f"no samples in {where}: it is empty, or holds only comments and zero counts",
            EXIT_USAGE,
        )
    if skipped.lines:
        print(f"pgprobe: warning: {where}: {bad}; left out", file=sys.stderr)
    return profile


def render_file(ns: argparse.Namespace, fmt: str) -> int:
    """--from FILE: any folded file (or bpftrace's stack maps) to the chosen format."""
    source = str(ns.source)
    raw = read_source(source)
    profile = read_profile(source, raw)
    name = "stdin" if source == "-" else os.path.basename(source)
    title = ns.title or f"Flame graph of {name}"
    if fmt == "svg":
        # The renderer takes the parsed profile itself: faster than tuples of frames (half
        # the time on 50,000 stacks).
        lines, total = _plain_folded_counts(raw)
        if total is None:
            lines, total = len(profile.keyed), profile.samples
        subtitle = {"file": source, "samples": f"{total:,}", "lines": f"{lines:,}"}
        if profile.skipped.lines:
            subtitle["lines skipped"] = f"{profile.skipped.lines:,}"
        write(
            ns, flamegraph.render_svg(profile, title=title, subtitle=subtitle, minwidth=ns.minwidth)
        )
        return 0
    stacks = profile.stacks()
    if fmt == "pprof":
        pprof_export.write(ns.output, pprof_export.folded_profile(stacks))
        return 0
    if fmt == "folded":
        text = "".join(f"{';'.join(k)} {n}\n" for k, n in _most_first(stacks))
    else:
        text = flamegraph.render_speedscope({title: stacks}, name=title)
    write(ns, text)
    return 0


def _plain_folded_counts(text: str) -> tuple[int, int | None]:
    """(lines, samples) of a plain `stack COUNT` file; samples None for any other layout."""
    lines = total = 0
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            return 0, None  # bpftrace maps, decimals, ...: let the full parser count
        lines += 1
        total += int(count)
    return lines, total


def _most_first(stacks: Mapping[tuple[str, ...], int]) -> list[tuple[tuple[str, ...], int]]:
    return sorted(stacks.items(), key=lambda kv: (-kv[1], kv[0]))
