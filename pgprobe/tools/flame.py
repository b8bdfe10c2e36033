"""`pgprobe flame`: a CPU flame graph of PostgreSQL backends (bpf/profile.bt).

Samples the on-CPU stacks of the targets at -F HZ for -d seconds, names the
frames in Python (pgprobe.symbolize: backends that exit during the capture
are still named, a stripped server's static functions show as
``postgres+0x<function start>``), folds them (one function is one frame) and
writes one of:

- ``svg`` (default): a self-contained interactive flame graph
  (pgprobe.render.flamegraph), to stdout or ``-o FILE``; the subtitle says
  duration, Hz, pids, samples, lost samples and the share of unresolved frames;
- ``folded``: FlameGraph folded stacks (``--folded``), for flamegraph.pl,
  inferno or speedscope;
- ``speedscope``: speedscope's JSON, one profile per backend with --per-backend;
- ``pprof``: a gzipped profile.proto (``-o cpu.pb.gz`` implies it) for
  ``go tool pprof``, Pyroscope or Parca (pgprobe.tools.pprof_export);
- ``--json``: one document ``{"tool": "flame", "meta": {...}, "rows": [...]}``,
  one row per (pid, stack): ``pid``, ``backend_type``, ``application_name``,
  ``stack`` (folded, root first, without a backend frame) and ``samples``.

``--per-backend`` roots each stack at a frame naming the backend
(``pid 4242: client backend (pgbench)``). ``--from FILE`` renders a folded file
(from pgprobe, perf + stackcollapse, or bpftrace output) without tracing, so
without root.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.render import flamegraph
from pgprobe.stacks import format_folded
from pgprobe.tools import common, pprof_export, profiling

NAME = "flame"
FORMATS = ("svg", "folded", "speedscope", "pprof")
DEFAULT_MINWIDTH_PX = 0.1


def minwidth_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of pixels: {text!r}") from None
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"must be between 0 and 10000 pixels: {text}")
    return value


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
        help="svg (default), folded (FlameGraph folded stacks), speedscope (JSON) or pprof "
        "(gzipped profile.proto for go tool pprof, Pyroscope, Parca; -o FILE.pb.gz implies it)",
    )
    out.add_argument("--folded", action="store_true", help="same as --format folded")
    out.add_argument(
        "--per-backend",
        action="store_true",
        help="root each stack at a frame naming its backend (pid, type, application)",
    )
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
    if ns.folded and ns.format not in (None, "folded"):
        raise PgprobeError(f"--folded contradicts --format {ns.format}", EXIT_USAGE)
    if ns.json and (ns.format or ns.folded):
        raise PgprobeError("--json is a format of its own: drop --format/--folded", EXIT_USAGE)
    if not ns.format and not ns.folded and pprof_export.wants_pprof(ns.output):
        return "pprof"
    return "folded" if ns.folded else ns.format or "svg"


def check_output(ns: argparse.Namespace, fmt: str) -> None:
    """Fail before a long capture, not after it."""
    if ns.output:
        parent = Path(ns.output).resolve().parent
        if Path(ns.output).is_dir():
            raise PgprobeError(f"-o {ns.output}: is a directory", EXIT_USAGE)
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise PgprobeError(f"-o {ns.output}: cannot write in {parent}", EXIT_USAGE)
    elif fmt in ("svg", "speedscope", "pprof") and not ns.json and sys.stdout.isatty():
        raise PgprobeError(
            f"not writing {fmt} to a terminal: redirect it (pgprobe flame > cpu.svg) "
            "or use -o FILE",
            EXIT_USAGE,
        )


def check_from(ns: argparse.Namespace) -> None:
    """Options that only make sense when tracing."""
    tracing_only = {
        "--pid": ns.pid,
        "--backend-type": ns.backend_type,
        "--database": ns.database,
        "--user": ns.user,
        "--application": ns.application,
        "--kernel": ns.kernel,
        "--per-backend": ns.per_backend,
        "--json": ns.json,
    }
    given = [name for name, value in tracing_only.items() if value]
    if given:
        raise PgprobeError(f"--from renders a file: {given[0]} has no meaning with it", EXIT_USAGE)


def write(ns: argparse.Namespace, text: str) -> None:
    if not ns.output:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(ns.output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PgprobeError(f"cannot write {ns.output}: {exc.strerror or exc}", EXIT_USAGE) from None


def run(ns: argparse.Namespace) -> int:
    fmt = output_format(ns)
    if ns.source is not None:
        check_from(ns)
        check_output(ns, fmt)
        return render_file(ns, fmt)
    check_output(ns, fmt)
    profile = profiling.collect(ns, names_at_end=ns.per_backend or ns.json)
    if ns.json:
        common.print_json(NAME, profile.meta(), json_rows(profile))
    elif fmt == "pprof":
        pprof_export.write(ns.output, pprof_export.cpu_profile(profile))
    else:
        write(ns, render_profile(ns, fmt, profile))
    profiling.print_warnings(profile)
    return 0


def json_rows(profile: profiling.Profile) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for pid, stacks in profile.folded_by_pid().items():
        backend = profile.describe(pid)
        for stack, n in stacks.items():
            rows.append(
                {
                    "pid": pid,
                    "backend_type": backend.backend_type,
                    "application_name": backend.application_name,
                    "stack": stack,
                    "samples": n,
                }
            )
    rows.sort(key=lambda r: (-r["samples"], r["pid"], r["stack"]))
    return rows


def default_title(profile: profiling.Profile) -> str:
    targets = profile.targets
    version = targets.cluster.version.split()[0] if targets.cluster.version else ""
    if targets.whole_cluster:
        who = "whole cluster"
    else:
        pids = targets.pids
        who = ("pid " if len(pids) == 1 else "pids ") + ", ".join(str(p) for p in pids[:8])
        who += ", ..." if len(pids) > 8 else ""
    return f"PostgreSQL {version} on-CPU flame graph: {who}".replace("  ", " ")


def render_profile(ns: argparse.Namespace, fmt: str, profile: profiling.Profile) -> str:
    if fmt == "speedscope":
        if ns.per_backend:
            profiles: Mapping[str, Mapping[str, int]] = {
                profile.backend_frame(pid): stacks
                for pid, stacks in sorted(profile.folded_by_pid().items())
            }
        else:
            profiles = {ns.title or default_title(profile): profile.folded()}
        return flamegraph.render_speedscope(profiles, name=ns.title or NAME, hz=profile.hz)
    folded = profile.folded(per_backend=ns.per_backend)
    if fmt == "folded":
        return "".join(line + "\n" for line in format_folded(folded))
    roots = {profile.backend_frame(pid) for pid in profile.pids} if ns.per_backend else set()
    return flamegraph.render_svg(
        folded,
        title=ns.title or default_title(profile),
        subtitle=profile.facts(),
        minwidth=ns.minwidth,
        module_of=module_classifier(roots),
    )


def module_classifier(backend_frames: set[str]) -> Callable[[str], str]:
    """The renderer's classifier, plus "backend" for the frames naming backends."""

    def module_of(frame: str) -> str:
        return "backend" if frame in backend_frames else flamegraph.classify_frame(frame)

    return module_of


def read_source(source: str) -> str:
    """The text of --from FILE ('-': stdin), undecodable bytes replaced; binary data refused."""
    try:
        if source == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(source, "rb") as f:
                data = f.read()
    except OSError as exc:
        raise PgprobeError(f"cannot read {source}: {exc.strerror or exc}", EXIT_USAGE) from None
    if b"\0" in data:
        raise PgprobeError(
            f"{source} is binary data (it holds NUL bytes), not folded stacks", EXIT_USAGE
        )
    return data.decode("utf-8", errors="replace")


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
