"""How a flame capture, or a folded file read with --from, is shown: an SVG flame graph,
folded stacks or speedscope JSON (pprof: pgprobe.tools.pprof_export)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

from pgprobe.render import flamegraph
from pgprobe.stacks import format_folded
from pgprobe.tools import profiling

NAME = "flame"


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
        if ns.by == "pid":
            profiles: Mapping[str, Mapping[str, int]] = {
                profile.backend_frame(pid): stacks
                for pid, stacks in sorted(profile.folded_by_pid().items())
            }
        elif ns.by == "query":
            profiles = profile.folded_by_part()
        else:
            profiles = {ns.title or default_title(profile): profile.folded()}
        return flamegraph.render_speedscope(profiles, name=ns.title or NAME, hz=profile.hz)
    folded = profile.folded(per_backend=ns.by == "pid", per_query=ns.by == "query")
    if fmt == "folded":
        return flamegraph.folded_file(format_folded(folded))
    roots = {profile.backend_frame(pid) for pid in profile.pids} if ns.by == "pid" else set()
    if ns.by == "query":
        roots = {profile.part_frame(s) for s in profile.stacks}
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


def render_folded_file(
    ns: argparse.Namespace, fmt: str, profile: flamegraph.FoldedProfile, raw: str, name: str
) -> str:
    """--from FILE's stacks (``raw`` is the file's text, ``name`` what to call it) as svg,
    folded or speedscope; the SVG's subtitle says file, samples, lines and lines skipped."""
    source = str(ns.source)
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
        return flamegraph.render_svg(profile, title=title, subtitle=subtitle, minwidth=ns.minwidth)
    stacks = profile.stacks()
    if fmt == "folded":
        return flamegraph.folded_file(f"{';'.join(k)} {n}" for k, n in _most_first(stacks))
    return flamegraph.render_speedscope({title: stacks}, name=title)


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
