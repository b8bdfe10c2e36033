"""How `pgprobe backends` looks on a terminal: one line per backend, the query cut short."""

from __future__ import annotations

from pgprobe.discover import Backend, Targets
from pgprobe.render import table

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


def show(targets: Targets, chosen: list[Backend]) -> None:
    table.render(title(targets), COLUMNS, [cells(b) for b in chosen], empty="no backends")


def title(targets: Targets) -> str:
    c = targets.cluster
    source = "pg_stat_activity" if c.conninfo else "/proc only (no connection)"
    return (
        f"PostgreSQL {c.version.split()[0]}, postmaster {c.postmaster_pid}, "
        f"{c.data_directory}, binary {c.binary} ({source})"
    )
