"""How a flame capture is shown: an SVG flame graph, folded stacks or speedscope JSON."""

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
