"""The server as /proc sees it: its postmaster, its binary and version, process titles.

What SQL cannot tell: which local process is the postmaster (proved through our own
backend and postmaster.pid, so that a pid that merely coincides is refused), the
executable the probes attach to, its version (read from the binary, never by running it:
pgprobe.serverbinary), and a backend's type from its process title when there is no
pg_stat_activity row. A process is PostgreSQL's only if it runs a server binary and it,
or its parent, is a postmaster that its data directory's postmaster.pid names: a local
user's process named "postgres" is not.
"""

from __future__ import annotations

import contextlib
import os

from pgprobe import proc, safefile, serverbinary
from pgprobe.errors import EXIT_TARGET, PgprobeError
from pgprobe.serverbinary import parse_version as parse_version


def _local_postmaster(own_pid: int, port: int) -> int:
    """The postmaster of our own backend, proving the server runs on this machine."""
    info = proc.read_info(own_pid)
    not_local = PgprobeError(
        f"the server is not on this machine (its backend pid {own_pid} is not a local postgres "
        "process): pgprobe must run on the database host",
        EXIT_TARGET,
    )
    if info is None or not _is_server(info):
        raise not_local
    postmaster = info.ppid
    # A pid that merely coincides locally would not have a postmaster.pid naming it.
    lines, _ = _postmaster_pid_file(postmaster)
    if len(lines) < 4 or lines[0] != str(postmaster) or lines[3] != str(port):
        raise not_local
    return postmaster


MAX_PID_FILE = 64 * 2**10  # postmaster.pid is a few lines


def _postmaster_pid_file(postmaster: int) -> tuple[list[str], str]:
    """The lines of the postmaster.pid in pid's working directory (a postmaster works in its
    data directory), or no lines and why. The postgres user's file: read as data, limited."""
    path = f"{proc.PROC}/{postmaster}/cwd/postmaster.pid"
    try:
        data = safefile.read_limited(path, MAX_PID_FILE, safefile.process_owners(postmaster))
    except safefile.Untrusted as exc:
        return [], str(exc)
    except OSError as exc:
        return [], f"no postmaster.pid in its working directory ({exc.strerror})"
    return data.decode("utf-8", "replace").splitlines(), ""


def _is_server(info: proc.ProcInfo) -> bool:
    """A process that runs a PostgreSQL server binary: named so, and its file is one."""
    return proc.is_postgres(info) and serverbinary.of_process(info.pid) is not None


def _server_binary(postmaster: int) -> str:
    info = proc.read_info(postmaster)
    if info is None or info.exe is None:
        raise PgprobeError(
            f"cannot read /proc/{postmaster}/exe (the server binary): run pgprobe as root",
        )
    return info.exe.removesuffix(" (deleted)")


def _postgres_process(pid: int) -> proc.ProcInfo:
    info = proc.read_info(pid)
    if info is None:
        raise PgprobeError(f"pid {pid} does not exist", EXIT_TARGET)
    if not _is_server(info):
        raise PgprobeError(
            f"pid {pid} is not a PostgreSQL process ({info.comm}: {info.cmdline[:60]})",
            EXIT_TARGET,
        )
    return info


def _postmaster_of(info: proc.ProcInfo) -> int:
    """A backend's postmaster is its parent; a postmaster is its own. Either is proved by
    the postmaster.pid of its data directory naming it, and by its binary."""
    reasons = []
    parent = proc.read_info(info.ppid)
    for candidate in (parent, info):
        if candidate is None or not _is_server(candidate):
            continue
        lines, why = _postmaster_pid_file(candidate.pid)
        if lines and lines[0].strip() == str(candidate.pid):
            return candidate.pid
        reasons.append(why or f"the postmaster.pid of pid {candidate.pid} names another pid")
    raise PgprobeError(
        f"pid {info.pid} is not a PostgreSQL server process: neither it nor its parent is a "
        f"postmaster named by its data directory's postmaster.pid ({'; '.join(reasons)})",
        EXIT_TARGET,
    )


def running_postmasters() -> list[int]:
    """The postmasters running on this machine (each proved as _postmaster_of proves it)."""
    found = []
    for entry in sorted(os.listdir(proc.PROC), key=lambda n: (len(n), n)):
        if not entry.isdigit():
            continue
        info = proc.read_info(int(entry))
        if info is None or not proc.is_postgres(info):
            continue
        parent = proc.read_info(info.ppid)
        if parent is not None and proc.is_postgres(parent):
            continue  # a backend: its parent is the one
        with contextlib.suppress(PgprobeError):
            if _postmaster_of(info) == info.pid:
                found.append(info.pid)
    return found


def binary_version(binary: str) -> tuple[int, str]:
    """(version_num, version) of a server binary, e.g. (150018, '15.18 (Debian ...)'): the
    text `postgres --version` prints, read from the binary as data (never run)."""
    try:
        found = serverbinary.read(binary)
    except serverbinary.NotServer as exc:
        raise PgprobeError(f"{binary} is not a PostgreSQL server binary: {exc}") from None
    except OSError as exc:
        raise PgprobeError(f"cannot read {binary}: {exc}") from None
    return found.version_num, found.version


def _type_from_title(title: str) -> str:
    """A backend type guessed from the process title, e.g. 'postgres: checkpointer'."""
    words = title.split(":", 1)
    if len(words) < 2:
        return "postmaster" if title.startswith(("postgres", "/")) else ""
    rest = words[1].strip()
    known = (
        "checkpointer", "background writer", "walwriter", "autovacuum launcher",
        "autovacuum worker", "logical replication launcher", "archiver", "logger",
        "stats collector", "walsender", "walreceiver", "startup", "parallel worker",
    )  # fmt: skip
    for name in known:
        if rest.startswith(name):
            return name
    return "client backend"
