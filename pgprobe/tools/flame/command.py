"""``pgprobe flame``: options, and the run (a capture, or --from FILE) to the chosen format.

``--from FILE`` renders a folded file (pgprobe, perf + stackcollapse, inferno, bpftrace
output) without tracing, so without root. Lines that are not stacks are left out and said in
one line on stderr (how many, the first one's number) and in the SVG's subtitle; a file with
no stack at all, or binary data, is a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.render import flamegraph
from pgprobe.tools import aliases, bystatement, common, pprof_export, profiling
from pgprobe.tools.flame.output import check_output, write
from pgprobe.tools.flame.records import json_rows
from pgprobe.tools.flame.view import NAME, render_folded_file, render_profile

FORMATS = ("svg", "folded", "speedscope", "pprof")
DEFAULT_MINWIDTH_PX = 0.1


minwidth_value = common.bounded(float, 0.0, 10_000.0, unit="pixels")


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="CPU flame graph of backends (SVG, folded stacks, speedscope)",
        description="Sample the on-CPU stacks of PostgreSQL processes and write a flame "
        "graph: `pgprobe flame --pid 4242 > cpu.svg`. With --from, render a folded file "
        "instead (no tracing, no root).",
    )
    profiling.add_profile_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--format",
        choices=FORMATS,
        action=aliases.OneValue,
        help="svg (default), folded (FlameGraph folded stacks), speedscope (JSON) or pprof "
        "(gzipped profile.proto for go tool pprof, Pyroscope, Parca; -o FILE.pb.gz implies it)",
    )
    aliases.add_alias(out, "--folded", dest="format", action=aliases.OneValue, nargs=0,
                      const="folded")  # fmt: skip
    out.add_argument(
        "--by",
        choices=["pid", "query"],
        help="pid: root each stack at a frame naming its backend (pid, type, application); "
        "query: at a frame naming the statement it ran (query id and text; PostgreSQL 14+)",
    )
    aliases.add_alias(out, "--per-backend", dest="by", action="store_const", const="pid")
    bystatement.add_filters(out)
    out.add_argument("--title", help="the flame graph's title")
    out.add_argument(
        "--minwidth",
        type=minwidth_value,
        default=DEFAULT_MINWIDTH_PX,
        metavar="PX",
        help=f"leave out frames narrower than PX pixels (default {DEFAULT_MINWIDTH_PX:g}; "
        "their samples stay in their parents)",
    )
    out.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    out.add_argument(
        "--from",
        dest="source",
        metavar="FILE",
        help="render this folded file (pgprobe, perf + stackcollapse, bpftrace; '-' for "
        "stdin) instead of tracing",
    )
    parser.set_defaults(run=run)


def output_format(ns: argparse.Namespace) -> str:
    if ns.json and ns.format:
        raise PgprobeError("--json is a format of its own: drop --format", EXIT_USAGE)
    if not ns.format and pprof_export.wants_pprof(ns.output):
        return "pprof"
    return str(ns.format or "svg")


def check_from(ns: argparse.Namespace) -> None:
    """Options that only make sense when tracing."""
    tracing_only = {
        "--pid": ns.pid,
        "--backend-type": ns.backend_type,
        "--database": ns.database,
        "--user": ns.user,
        "--application": ns.application,
        "--kernel": ns.kernel,
        "--by": ns.by,
        "--query-id": ns.query_id is not None,
        "--no-text": ns.no_text,
        "--json": ns.json,
    }
    given = [name for name, value in tracing_only.items() if value]
    if given:
        raise PgprobeError(f"--from renders a file: {given[0]} has no meaning with it", EXIT_USAGE)


def run(ns: argparse.Namespace) -> int:
    fmt = output_format(ns)
    if ns.source is not None:
        check_from(ns)
        check_output(ns, fmt)
        return render_file(ns, fmt)
    check_output(ns, fmt)
    profile = profiling.collect(ns, names_at_end=ns.by == "pid" or ns.json)
    if ns.json:
        common.print_json(NAME, profile.meta(), json_rows(profile, by_query=ns.by == "query"))
    elif fmt == "pprof":
        pprof_export.write(ns.output, pprof_export.cpu_profile(profile))
    else:
        write(ns, render_profile(ns, fmt, profile))
    profiling.print_warnings(profile)
    return 0


def render_file(ns: argparse.Namespace, fmt: str) -> int:
    """--from FILE: any folded file (or bpftrace's stack maps) to the chosen format."""
    source = str(ns.source)
    raw = read_source(source)
    profile = read_profile(source, raw)
    if fmt == "pprof":
        pprof_export.write(ns.output, pprof_export.folded_profile(profile.stacks()))
        return 0
    name = "stdin" if source == "-" else os.path.basename(source)
    write(ns, render_folded_file(ns, fmt, profile, raw, name))
    return 0


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
        common.warn(f"{where}: {bad}; left out")
    return profile
