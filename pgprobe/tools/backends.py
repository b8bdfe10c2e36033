"""`pgprobe backends`: the processes discovery finds, a quick look before tracing."""

from __future__ import annotations

import argparse
from typing import Any

from pgprobe import discover
from pgprobe.discover import Backend, Targets
from pgprobe.engines.base import RunInfo, Snapshot
from pgprobe.render import table
from pgprobe.tools import common

NAME = "backends"
QUERY_WIDTH = 60

COLUMNS = [
    table.Column("pid", "PID", numeric=True),
    table.Column("backend_type", "BACKEND TYPE"),
    table.Column("datname", "DATABASE"),
    table.Column("usename", "USER"),
    table.Column("application_name", "APPLICATION"),
    table.Column("state", "STATE"),
    table.Column("wait", "WAIT EVENT"),
    table.Column("query", "QUERY"),
]


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


def cells(backend: Backend) -> dict[str, str]:
    wait = ":".join(x for x in (backend.wait_event_type, backend.wait_event) if x)
    query = " ".join(backend.query.split())
    if len(query) > QUERY_WIDTH:
        query = query[: QUERY_WIDTH - 3] + "..."
    return {
        "pid": str(backend.pid),
        "backend_type": backend.backend_type,
        "datname": backend.datname,
        "usename": backend.usename,
        "application_name": backend.application_name,
        "state": backend.state,
        "wait": wait,
        "query": query,
    }


def run(ns: argparse.Namespace) -> int:
    targets = discover.discover(common.conn_options(ns), common.filters(ns))
    chosen = [targets.describe(pid) for pid in targets.pids]
    if ns.json:
        meta = common.meta(targets, RunInfo(), Snapshot(final=True))
        for key in ("duration_s", "engine", "engine_version", "lost_events",
                    "failed_map_updates", "interrupted", "final", "snapshot_time",
                    "attach_s"):  # fmt: skip
            meta.pop(key, None)
        common.print_json(NAME, meta, [b.as_row() for b in chosen])
        return 0
    table.render(_title(targets), COLUMNS, [cells(b) for b in chosen], empty="no backends")
    return 0


def _title(targets: Targets) -> str:
    c = targets.cluster
    source = "pg_stat_activity" if c.conninfo else "/proc only (no connection)"
    return (
        f"PostgreSQL {c.version.split()[0]}, postmaster {c.postmaster_pid}, "
        f"{c.data_directory}, binary {c.binary} ({source})"
    )
