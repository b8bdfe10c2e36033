"""The server as /proc sees it: its postmaster, its binary and version, process titles.

What SQL cannot tell: which local process is the postmaster (proved through our own
backend and postmaster.pid, so that a pid that merely coincides is refused), the
executable the probes attach to, its version from `postgres --version`, and a backend's
type from its process title when there is no pg_stat_activity row.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pgprobe import proc
from pgprobe.errors import EXIT_TARGET, PgprobeError


def _local_postmaster(own_pid: int, port: int) -> int:
    """The postmaster of our own backend, proving the server runs on this machine."""
    info = proc.read_info(own_pid)
    not_local = PgprobeError(
        f"the server is not on this machine (its backend pid {own_pid} is not a local postgres "
        "process): pgprobe must run on the database host",
        EXIT_TARGET,
    )
    if info is None or not proc.is_postgres(info):
        raise not_local
    postmaster = info.ppid
    # A pid that merely coincides locally would not have a postmaster.pid naming it.
    lines = _postmaster_pid_file(postmaster)
    if len(lines) < 4 or lines[0] != str(postmaster) or lines[3] != str(port):
        raise not_local
    return postmaster


def _postmaster_pid_file(postmaster: int) -> list[str]:
    cwd = proc.cwd(postmaster)
    if cwd is None:
        return []
    try:
        return (Path(cwd) / "postmaster.pid").read_text().splitlines()
    except OSError:
        return []


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
    if not proc.is_postgres(info):
        raise PgprobeError(
            f"pid {pid} is not a PostgreSQL process ({info.comm}: {info.cmdline[:60]})",
            EXIT_TARGET,
        )
    return info


def _postmaster_of(info: proc.ProcInfo) -> int:
    """A backend's postmaster is its parent; a postmaster is its own."""
    parent = proc.read_info(info.ppid)
    if parent is not None and proc.is_postgres(parent):
        return parent.pid
    return info.pid


def binary_version(binary: str) -> tuple[int, str]:
    """(version_num, version) from `postgres --version`, e.g. (150018, '15.18 (Debian ...)')."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise PgprobeError(f"cannot run {binary} --version: {exc}") from None
    return parse_version(out.split("(PostgreSQL)", 1)[-1].strip())


def parse_version(version: str) -> tuple[int, str]:
    """'15.18 (Debian ...)' -> (150018, version); '9.6.24' -> (90624, version)."""
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version)
    if not match:
        return 0, version
    major, minor, patch = (int(g) if g else 0 for g in match.groups())
    if major >= 10:
        return major * 10000 + minor, version
    return major * 10000 + minor * 100 + patch, version


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
