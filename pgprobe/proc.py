"""Facts about local processes from /proc: parent, executable, command line, cwd."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    comm: str
    exe: str | None  # None when unreadable (another user's process, not root)
    cmdline: str


def exists(pid: int) -> bool:
    return (PROC / str(pid)).is_dir()


def read_info(pid: int) -> ProcInfo | None:
    """The process `pid`, or None when it does not exist (or just exited)."""
    base = PROC / str(pid)
    try:
        stat = (base / "stat").read_text()
        raw_cmdline = (base / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # comm is in parentheses and may itself contain spaces or parentheses.
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return ProcInfo(
        pid=pid,
        ppid=ppid,
        comm=comm,
        exe=read_link(base / "exe"),
        cmdline=raw_cmdline.replace(b"\0", b" ").decode(errors="replace").strip(),
    )


def run_count(pid: int) -> int | None:
    """How many times the kernel has put pid on a CPU (/proc/PID/schedstat, field 3)."""
    try:
        return int((PROC / str(pid) / "schedstat").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        return None


def read_link(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def cwd(pid: int) -> str | None:
    return read_link(PROC / str(pid) / "cwd")


def children(ppid: int) -> list[int]:
    """PIDs whose parent is `ppid` (a scan of /proc; fine for a few thousand)."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            info = read_info(int(entry.name))
            if info is not None and info.ppid == ppid:
                found.append(info.pid)
    return sorted(found)


def is_postgres(info: ProcInfo) -> bool:
    """A PostgreSQL server process (postmaster or backend), by comm or binary."""
    if info.comm in ("postgres", "postmaster"):
        return True
    return info.exe is not None and Path(info.exe.removesuffix(" (deleted)")).name in (
        "postgres",
        "postmaster",
    )
