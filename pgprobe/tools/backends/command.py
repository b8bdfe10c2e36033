"""`pgprobe backends` on the command line: discover, then JSON or the table (no tracing)."""

from __future__ import annotations

import argparse
from typing import Any

from pgprobe import discover
from pgprobe.engines.base import RunInfo, Snapshot
from pgprobe.tools import common
from pgprobe.tools.backends import view

NAME = "backends"
# common.meta's keys that describe a capture; backends makes none.
CAPTURE_KEYS = ("duration_s", "engine", "engine_version", "lost_events", "failed_map_updates",
                "interrupted", "final", "snapshot_time", "attach_s")  # fmt: skip


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="the processes pgprobe would trace",
        description="List the cluster's backends as discovery finds them (no tracing).",
    )
    common.add_connection_arguments(parser)
    common.add_target_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    targets = discover.discover(common.conn_options(ns), common.filters(ns), query_text=True)
    chosen = [targets.describe(pid) for pid in targets.pids]
    if ns.json:
        meta = common.meta(targets, RunInfo(), Snapshot(final=True))
        for key in CAPTURE_KEYS:
            meta.pop(key, None)
        common.print_json(NAME, meta, [b.as_row() for b in chosen])
        return 0
    view.show(targets, chosen)
    return 0
