"""What triage asks of the probes: its parts, one capture each, and their document sections.

A part is one capture (a tracer process) over the triage window and a function that turns
its final snapshot into a section of the triage document. The parts here are the ones built
from other tools' probe and records modules (profile, lwlocks, clog_reads); the time model
(waits) is built in triage's command, which may use `pgprobe waits`' own glue. A part that
cannot run against this server raises PgprobeError when started, and is left out with the
reason (start_parts).
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgprobe.discover import Targets
from pgprobe.engines.base import Capture, RunInfo, Snapshot
from pgprobe.errors import EXIT_TRACER, PgprobeError
from pgprobe.tools import clog_reads, common, lwlocks, profiling
from pgprobe.tools.hot.records import hot_rows

TOP_FUNCTIONS = 30

Section = Callable[[Snapshot, RunInfo], dict[str, Any]]
Starter = Callable[[argparse.Namespace, Targets], "Part"]


@dataclass
class Part:
    """One capture of the triage window and how its result becomes a document section."""

    name: str
    capture: Capture
    section: Section
    # Started once the others have their probes in, so that its own window is the SQL
    # window (the others may take seconds to attach on a loaded machine).
    late: bool = False
    final: tuple[Snapshot, RunInfo] | None = None
    error: str | None = None
    thread: threading.Thread | None = field(default=None, repr=False)

    def run(self) -> None:
        try:
            for event in self.capture.events():
                if isinstance(event, Snapshot) and event.final:
                    self.final = (event, self.capture.info)
        except PgprobeError as exc:
            self.error = exc.message

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name=self.name, daemon=True)
        self.thread.start()

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    @property
    def attached_or_ended(self) -> bool:
        return self.thread is not None and bool(
            self.capture.info.probes_attached or not self.running
        )


def start_parts(
    ns: argparse.Namespace,
    targets: Targets,
    starters: Sequence[tuple[str, Starter]],
    warnings: list[str],
) -> list[Part]:
    """The captures that can run against this server; the reason for each that cannot."""
    parts = []
    for name, starter in starters:
        try:
            parts.append(starter(ns, targets))
        except PgprobeError as exc:
            warnings.append(f"{name} left out: {exc.message}")
    if not parts:
        raise PgprobeError("no capture can run here: " + "; ".join(warnings), EXIT_TRACER)
    return parts


def lwlocks_part(ns: argparse.Namespace, targets: Targets) -> Part:
    lwlocks.check_server(targets)
    capture = lwlocks.start(ns, targets, by_pid=False, interval=None)

    def section(snapshot: Snapshot, info: RunInfo) -> dict[str, Any]:
        rows = lwlocks.rows(lwlocks.records(snapshot), targets, by_pid=False)
        meta = common.meta(targets, info, snapshot)
        return {"meta": meta, "rows": [r.as_json() for r in rows]}

    return Part("lwlocks", capture, section)


def profile_part(ns: argparse.Namespace, targets: Targets) -> Part:
    """CPU samples: the hot and flame sections (the SVG is drawn by the command)."""
    profiling.check_server(targets)
    profile_run = profiling.start(ns, targets)

    def section(snapshot: Snapshot, info: RunInfo) -> dict[str, Any]:
        profile = profile_run.finish(snapshot, info)
        rows = hot_rows(profile.stacks, by_module=False)[:TOP_FUNCTIONS]
        return {
            "hot": {"meta": profile.meta(), "rows": [r.as_json() for r in rows]},
            "flame": {"folded": profile.folded(), "samples": profile.samples},
            "_profile": profile,
            "_unresolved_pct": round(profile.unresolved_pct, 2),
            "_lost": profile.lost_samples,
        }

    return Part("profile", profile_run.capture, section)


def clog_part(ns: argparse.Namespace, targets: Targets) -> Part:
    clog_reads.check_server(targets)
    major = targets.cluster.major if targets.cluster.version_num else 99
    slrus = clog_reads.selected_slrus([("all",)], major)
    capture = clog_reads.start(ns, targets, slrus, clog_reads.MODE_AGGREGATE, None)
    wanted = None if targets.whole_cluster else set(targets.pids)

    def section(snapshot: Snapshot, info: RunInfo) -> dict[str, Any]:
        recs = [r for r in clog_reads.records(snapshot) if wanted is None or r.pid in wanted]
        rows = clog_reads.group_rows(recs, by="file", describe=targets.describe)
        return {"meta": common.meta(targets, info, snapshot), "rows": [r.as_json() for r in rows]}

    return Part("clog_reads", capture, section)
