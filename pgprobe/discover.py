"""Find the cluster and the backends to trace: SQL (read-only) plus /proc.

The SQL session (pgprobe.connection) is read-only, says who it is (application_name
'pgprobe') and is left out of the targets. /proc (pgprobe.localserver) gives what SQL
cannot: the postmaster PID and the server binary that the probes attach to. With
`--pid` and no connection, everything comes from /proc.

This module holds the targets themselves (Cluster, Backend, Filters, Targets), reading
pg_stat_activity, and choosing the pids; it re-exports the connection names that tools
use as discover.ConnOptions, discover.connect, discover.binary_version.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgprobe import proc
from pgprobe.connection import APPLICATION_NAME as APPLICATION_NAME
from pgprobe.connection import ConnOptions as ConnOptions
from pgprobe.connection import connect as connect
from pgprobe.connection import connect_conninfo as connect_conninfo
from pgprobe.connection import is_connection_string as is_connection_string
from pgprobe.errors import EXIT_TARGET, EXIT_USAGE, PgprobeError
from pgprobe.localserver import (
    _local_postmaster,
    _postgres_process,
    _postmaster_of,
    _server_binary,
    _type_from_title,
)
from pgprobe.localserver import binary_version as binary_version
from pgprobe.localserver import parse_version as parse_version


@dataclass(frozen=True)
class Backend:
    """One row of pg_stat_activity (or, without SQL, what /proc tells)."""

    pid: int
    backend_type: str = ""
    datname: str = ""
    usename: str = ""
    application_name: str = ""
    state: str = ""
    wait_event_type: str = ""
    wait_event: str = ""
    query: str = ""

    def as_row(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "backend_type": self.backend_type,
            "datname": self.datname,
            "usename": self.usename,
            "application_name": self.application_name,
            "state": self.state,
            "wait_event_type": self.wait_event_type,
            "wait_event": self.wait_event,
            "query": self.query,
        }


@dataclass
class Cluster:
    """The PostgreSQL instance pgprobe looks at."""

    postmaster_pid: int
    binary: str  # the server executable, as /proc/<postmaster>/exe names it
    version_num: int  # e.g. 150018
    version: str  # e.g. "15.18 (Debian 15.18-0+deb12u1)"
    data_directory: str | None
    own_pid: int | None = None  # pgprobe's own backend, never a target
    backends: list[Backend] = field(default_factory=list)
    conninfo: str | None = None  # None: /proc only, no SQL

    @property
    def major(self) -> int:
        return self.version_num // 10000 if self.version_num >= 100000 else self.version_num // 100

    def backend(self, pid: int) -> Backend | None:
        return next((b for b in self.backends if b.pid == pid), None)


@dataclass(frozen=True)
class Filters:
    """Which backends to trace; all empty means the whole cluster."""

    pids: tuple[int, ...] = ()
    backend_types: tuple[str, ...] = ()
    databases: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    applications: tuple[str, ...] = ()

    @property
    def whole_cluster(self) -> bool:
        return not (
            self.pids or self.backend_types or self.databases or self.users or self.applications
        )


@dataclass
class Targets:
    """The processes a tool traces."""

    cluster: Cluster
    pids: list[int]  # the selected pids (for the whole cluster: what was there at start)
    whole_cluster: bool

    def describe(self, pid: int) -> Backend:
        """pg_stat_activity's row for pid, or a row made from /proc."""
        found = self.cluster.backend(pid)
        if found is not None:
            return found
        info = proc.read_info(pid)
        title = info.cmdline if info else "(exited)"
        return Backend(pid=pid, backend_type=_type_from_title(title))


# The query texts (up to track_activity_query_size each, of every backend) only when a
# tool shows them: on a server in trouble, fetch no more than is shown.
ACTIVITY_SQL = """
SELECT pid, coalesce(backend_type, ''), coalesce(datname, ''), coalesce(usename, ''),
       coalesce(application_name, ''), coalesce(state, ''),
       coalesce(wait_event_type, ''), coalesce(wait_event, ''), {query}
  FROM pg_stat_activity
 WHERE pid <> pg_backend_pid()
 ORDER BY pid
"""


def read_backends(conn: Any, query_text: bool = False) -> list[Backend]:
    """pg_stat_activity's rows (the query texts too when asked)."""
    sql = ACTIVITY_SQL.format(query="coalesce(query, '')" if query_text else "''")
    with conn.cursor() as cur:
        cur.execute(sql)
        return [Backend(*row) for row in cur.fetchall()]


def from_connection(conn: Any, conninfo: str | None = None, query_text: bool = False) -> Cluster:
    """The cluster behind `conn`, located on this machine through our own backend."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pg_backend_pid(), current_setting('server_version_num')::int,"
            " current_setting('server_version'), current_setting('port')::int"
        )
        own_pid, version_num, version, port = cur.fetchone()
        data_directory = _setting_or_none(conn, "data_directory")
    postmaster = _local_postmaster(own_pid, port)
    binary = _server_binary(postmaster)
    cwd = proc.cwd(postmaster)
    cluster = Cluster(
        postmaster_pid=postmaster,
        binary=binary,
        version_num=version_num,
        version=version,
        data_directory=data_directory or cwd,
        own_pid=own_pid,
        conninfo=conninfo,
    )
    cluster.backends = read_backends(conn, query_text)
    return cluster


def _setting_or_none(conn: Any, name: str) -> str | None:
    """A setting that needs pg_read_all_settings; None without that privilege."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT setting FROM pg_settings WHERE name = %s", (name,)
        )  # hidden (no row) when not privileged, unlike current_setting() which raises
        row = cur.fetchone()
        return str(row[0]) if row else None


def from_pids(pids: Sequence[int]) -> Cluster:
    """The cluster of the given backends, from /proc only (no SQL connection)."""
    infos = [_postgres_process(pid) for pid in pids]
    postmasters = {_postmaster_of(info) for info in infos}
    if len(postmasters) > 1:
        raise PgprobeError(
            "the given pids belong to different PostgreSQL clusters (postmasters "
            + ", ".join(str(p) for p in sorted(postmasters))
            + ")",
            EXIT_TARGET,
        )
    postmaster = postmasters.pop()
    binary = _server_binary(postmaster)
    # The file the postmaster runs (its path may name another file by now), read as data.
    version_num, version = binary_version(f"{proc.PROC}/{postmaster}/exe")
    return Cluster(
        postmaster_pid=postmaster,
        binary=binary,
        version_num=version_num,
        version=version,
        data_directory=proc.cwd(postmaster),
        backends=[Backend(pid=i.pid, backend_type=_type_from_title(i.cmdline)) for i in infos],
    )


def select_targets(cluster: Cluster, filters: Filters) -> Targets:
    """The pids to trace: checked to be this cluster's, or matched by the filters."""
    for pid in filters.pids:
        _check_pid_in_cluster(cluster, pid)
    if filters.whole_cluster:
        return Targets(cluster, [b.pid for b in cluster.backends], whole_cluster=True)
    if not filters.pids and cluster.conninfo is None:
        raise PgprobeError("filters need a connection to PostgreSQL", EXIT_USAGE)
    chosen = _matching(cluster.backends, filters) if _has_sql_filters(filters) else []
    pids = sorted(set(filters.pids) | {b.pid for b in chosen})
    if filters.pids and _has_sql_filters(filters):
        # Both given: a backend must be named and match (filters narrow the list).
        pids = sorted(set(filters.pids) & {b.pid for b in chosen})
    if not pids:
        raise PgprobeError("no backend matches the given filters", EXIT_TARGET)
    return Targets(cluster, pids, whole_cluster=False)


def _has_sql_filters(filters: Filters) -> bool:
    return bool(filters.backend_types or filters.databases or filters.users or filters.applications)


def _matching(backends: Iterable[Backend], f: Filters) -> list[Backend]:
    def ok(values: tuple[str, ...], value: str) -> bool:
        return not values or value in values

    return [
        b
        for b in backends
        if ok(f.backend_types, b.backend_type)
        and ok(f.databases, b.datname)
        and ok(f.users, b.usename)
        and ok(f.applications, b.application_name)
    ]


def _check_pid_in_cluster(cluster: Cluster, pid: int) -> None:
    if pid == cluster.own_pid:
        raise PgprobeError(f"pid {pid} is pgprobe's own connection", EXIT_TARGET)
    info = _postgres_process(pid)
    if pid != cluster.postmaster_pid and info.ppid != cluster.postmaster_pid:
        other = _postmaster_of(info)
        where = proc.cwd(other) or "?"
        raise PgprobeError(
            f"pid {pid} belongs to another PostgreSQL cluster (postmaster {other}, {where}), "
            f"not to the one pgprobe is connected to (postmaster {cluster.postmaster_pid})",
            EXIT_TARGET,
        )


def refresh_backends(cluster: Cluster) -> None:
    """Re-read pg_stat_activity, keeping rows of backends that have exited since."""
    if cluster.conninfo is None:
        return
    import psycopg

    try:
        conn = connect_conninfo(cluster.conninfo)
        with conn:
            fresh = read_backends(conn)
    except (PgprobeError, psycopg.Error):
        return  # the server may be gone; what we saw at start still describes the pids
    known = {b.pid: b for b in cluster.backends}
    known.update({b.pid: b for b in fresh if b.pid != cluster.own_pid})
    cluster.backends = sorted(known.values(), key=lambda b: b.pid)


def discover(opts: ConnOptions, filters: Filters, query_text: bool = False) -> Targets:
    """Connect, find the cluster and pick the targets; /proc only when --pid allows it.
    query_text: read the backends' query texts too (only `backends` shows them)."""
    try:
        conn = connect(opts)
    except PgprobeError:
        if not filters.pids or _has_sql_filters(filters):
            raise
        return select_targets(from_pids(filters.pids), filters)
    with conn:
        cluster = from_connection(conn, conninfo=opts.conninfo(), query_text=query_text)
    return select_targets(cluster, filters)
