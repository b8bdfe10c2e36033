"""How `pgprobe waits` is shown: the time model as a table on a terminal; with
--stacks, the off-CPU stacks as a flame graph (SVG, folded, speedscope) or a pprof file.
The flame graph's root frames are the wait events (``Timeout:PgSleep``), each class of wait
event (Timeout, LWLock, IO, ...) in a colour of its own; counts are microseconds, as
offcputime's folded output. Idle time (stacks.idle_event) is left out of every output
but the JSON unless --idle; the subtitle says how much."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from pgprobe.discover import Backend, Targets
from pgprobe.render import flamegraph, pprof, table
from pgprobe.stacks import format_folded
from pgprobe.tools import pprof_export
from pgprobe.tools.flame.output import write
from pgprobe.tools.waits.records import Row
from pgprobe.tools.waits.stacks import OffCpuStack, folded_us, split_idle

COLUMNS = [
    table.Column("category", "WHERE"),
    table.Column("wait_event_type", "TYPE"),
    table.Column("wait_event", "EVENT"),
    table.Column("total_s", "SECONDS", numeric=True),
    table.Column("share_pct", "SHARE", numeric=True),
    table.Column("sleeps", "SLEEPS", numeric=True),
    table.Column("p50_ms", "P50 ms", numeric=True),
    table.Column("p99_ms", "P99 ms", numeric=True),
]
PID_COLUMNS = [
    table.Column("pid", "PID", numeric=True),
    table.Column("backend_type", "BACKEND TYPE"),
]


def cells(row: Row) -> dict[str, str]:
    sleeps = row.sleeps > 0
    out = {
        "category": row.category,
        "wait_event_type": row.wait_event_type,
        "wait_event": f"{row.wait_event} ({row.state})" if row.state else row.wait_event,
        "total_s": f"{row.total_ns / 1e9:,.3f}",
        "share_pct": f"{100 * row.share:.1f}%",
        "sleeps": f"{row.sleeps:,}" if sleeps else "",
        "p50_ms": f"{row.percentile_us(0.5) / 1000:,.3f}" if sleeps else "",
        "p99_ms": f"{row.percentile_us(0.99) / 1000:,.3f}" if sleeps else "",
    }
    if row.pid is not None:
        out.update(pid=str(row.pid), backend_type=row.backend_type)
    return out


def shown(rows: list[Row]) -> list[Row]:
    """Components worth a line: any time at all (CPU and not accounted always)."""
    return [r for r in rows if r.total_ns or r.category in ("on CPU", "not accounted")]


def show(title: str, rows: list[Row], by_pid: bool, meta: dict[str, Any]) -> None:
    columns = (PID_COLUMNS if by_pid else []) + COLUMNS
    empty = f"no PostgreSQL process seen in {meta['duration_s']:.1f} s"
    table.render(title, columns, [cells(r) for r in shown(rows)], empty=empty)
    if meta.get("unaccounted_note"):
        print(meta["unaccounted_note"], file=sys.stderr)


OFF_CPU_NS = pprof.ValueType("off_cpu", "nanoseconds")
WAIT_MODULE = "[wait event]"  # the pprof module of the root frames
# One colour per wait class for the root frames (pg_stat_activity's wait_event_type).
CLASS_COLOURS = {
    "Activity": "#9aa9c2",  # main-loop waits of background processes: muted
    "BufferPin": "#8c564b",
    "Client": "#7fb3d5",
    "Extension": "#c49c94",
    "IO": "#2ca02c",
    "IPC": "#ff7f0e",
    "Lock": "#d62728",
    "LWLock": "#9467bd",
    "Timeout": "#e377c2",
    "none": "#bbbbbb",  # no wait event set, unreadable, asleep since before the capture
}


def wait_classes(stacks: Iterable[OffCpuStack]) -> dict[str, str]:
    """Root frame -> its colour group (the wait class)."""
    return {s.wait_frame: f"wait: {s.wait_event_type or 'none'}" for s in stacks}


def emit_stacks(
    ns: argparse.Namespace,
    fmt: str,
    stacks: list[OffCpuStack],
    title: str,
    facts: dict[str, str],
    targets: Targets,
    describe: Callable[[int], Backend | None],
    duration_s: float,
) -> None:
    stacks, idle_ns = split_idle(stacks, bool(getattr(ns, "idle", False)))
    if idle_ns:
        facts = {
            **facts,
            "off-CPU": f"{sum(s.ns for s in stacks) / 1e9:.3f} s",
            "idle left out": f"{idle_ns / 1e9:.3f} s (--idle shows it)",
        }
        title += ", idle time left out"
    if fmt == "pprof":
        pprof_export.write(ns.output, profile(stacks, targets, describe, duration_s, facts))
        return
    folded = folded_us(stacks)
    if fmt == "folded":
        write(ns, flamegraph.folded_file(format_folded(folded_text(folded))))
    elif fmt == "speedscope":
        write(ns, flamegraph.render_speedscope({title: folded}, name=title, hz=1e6))
    else:
        roots = wait_classes(stacks)

        def module_of(frame: str) -> str:
            return roots.get(frame) or flamegraph.classify_frame(frame)

        grey = CLASS_COLOURS["none"]
        colours = {m: CLASS_COLOURS.get(m.removeprefix("wait: "), grey) for m in roots.values()}
        svg = flamegraph.render_svg(folded, title=title, subtitle=facts, unit="us",
                                    module_of=module_of, module_colours=colours)  # fmt: skip
        write(ns, svg)


def folded_text(folded: dict[tuple[str, ...], int]) -> dict[str, int]:
    return {";".join(f.replace(";", ":") for f in k): n for k, n in folded.items()}


def profile(
    stacks: Iterable[OffCpuStack],
    targets: Targets,
    describe: Callable[[int], Backend | None],
    duration_s: float,
    facts: dict[str, str],
) -> pprof.Profile:
    """Off-CPU nanoseconds per (pid, wait event, stack); the wait event is the root
    frame (module "[wait event]") and a label."""
    main = os.path.basename(targets.cluster.binary)
    postmaster = targets.cluster.postmaster_pid
    samples = []
    for s in stacks:
        frames = tuple(pprof_export.frame_of(n, main) for n in s.frames)
        frames += (pprof.Frame(s.wait_frame, WAIT_MODULE),)
        labels = pprof_export.labels(s.pid, describe(s.pid), postmaster)
        labels["wait_event"] = s.wait_frame
        samples.append(pprof.Sample(frames, (s.ns,), labels))
    duration_ns = int(duration_s * 1e9)
    return pprof.build(
        samples,
        (OFF_CPU_NS,),
        default_type=OFF_CPU_NS.type,
        time_nanos=time.time_ns() - duration_ns,
        duration_nanos=duration_ns,
        comments=[f"pgprobe: {k}: {v}" for k, v in facts.items()],
        main_module=main,
    )
