"""Facts about local processes from /proc: parent, executable, command line, cwd."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

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


_SMALL = 8192  # bytes: more than /proc/PID/stat, schedstat or status hold


def read_small(pid: int, name: str) -> str:
    """/proc/PID/name whole, with no Path or buffered file on the way (a third of the cost:
    read for each process at each refresh of `top`); OSError when pid is gone."""
    fd = os.open(f"{PROC}/{pid}/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        # One read takes the file whole: /proc's seq files fill the buffer until they end
        # (a short read is the end; a second read returned b"", a third of the system
        # calls); again only when it filled the buffer.
        chunks = [os.read(fd, _SMALL)]
        while len(chunks[-1]) == _SMALL:
            chunks.append(os.read(fd, _SMALL))
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def schedstat(pid: int) -> tuple[int, int, int] | None:
    """/proc/PID/schedstat: ns on CPU, ns waiting for a CPU, times put on a CPU; None when
    pid is gone."""
    try:
        return _parse_schedstat(read_small(pid, "schedstat"))
    except (OSError, ValueError):
        return None


def _parse_schedstat(text: str | bytes) -> tuple[int, int, int]:
    cpu, runq, runs = text.split()[:3]
    return int(cpu), int(runq), int(runs)


class SchedstatFiles:
    """/proc/PID/schedstat read again and again through a descriptor kept open per process:
    one pread() instead of open, read and close (0.9 us against 4.9 here; `top` reads each
    of 1,000 backends twice a refresh). The descriptor stays with the process it was
    opened on: once that one has exited, the read fails (None), whoever has its pid now.
    At most `limit` are kept (the file limit is shared); past it, read as schedstat()."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # pid -> (descriptor, the last text read, its fields): a text read again is not
        # parsed again
        self._open: dict[int, tuple[int, bytes, tuple[int, int, int]]] = {}

    def read(self, pid: int) -> tuple[int, int, int] | None:
        kept = self._open.get(pid)
        if kept is None:
            if len(self._open) >= self.limit:
                return schedstat(pid)
            try:
                fd = os.open(f"{PROC}/{pid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            kept = self._open[pid] = (fd, b"", (0, 0, 0))
        try:
            raw = os.pread(kept[0], 256, 0)
            if raw != kept[1]:
                kept = self._open[pid] = (kept[0], raw, _parse_schedstat(raw))
            return kept[2]
        except (OSError, ValueError):
            self.forget(pid)
            return None

    def forget(self, pid: int) -> None:
        kept = self._open.pop(pid, None)
        if kept is not None:
            os.close(kept[0])

    def keep_only(self, pids: set[int]) -> None:
        """The descriptors of the other processes closed."""
        for pid in self._open.keys() - pids:
            self.forget(pid)

    def close(self) -> None:
        self.keep_only(set())


def run_count(pid: int) -> int | None:
    """How many times the kernel has put pid on a CPU (/proc/PID/schedstat, field 3)."""
    fields = schedstat(pid)
    return fields[2] if fields else None


class SchedCounters(NamedTuple):
    """The kernel's per-task scheduling counters, as /proc shows them (a tuple: hashed
    with each read's entries, thousands a refresh of `top`)."""

    cpu_ns: int  # time on CPU (schedstat field 1: se.sum_exec_runtime)
    runq_ns: int  # time runnable in a runqueue, waiting for a CPU (field 2: run_delay)
    runs: int  # times put on a CPU (field 3)
    sleeps: int  # voluntary switches (status: voluntary_ctxt_switches, the kernel's nvcsw)


_VOLUNTARY = "\nvoluntary_ctxt_switches:"


def sched_counters(pid: int) -> SchedCounters | None:
    """pid's counters (two files, read schedstat first), or None when it is gone."""
    fields = schedstat(pid)
    if fields is None:
        return None
    try:
        status = read_small(pid, "status")
        start = status.index(_VOLUNTARY) + len(_VOLUNTARY)
        sleeps = int(status[start : status.index("\n", start)])
    except (OSError, ValueError):
        return None
    return SchedCounters(*fields, sleeps)


def start_ticks(pid: int) -> int | None:
    """When pid started, in clock ticks since boot (/proc/PID/stat field 22); None when it
    is gone. The same pid number with another start time is another process."""
    try:
        stat = read_small(pid, "stat")
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def parent(pid: int) -> int | None:
    """pid's parent (/proc/PID/stat field 4); None when it is gone."""
    try:
        stat = read_small(pid, "stat")
        return int(stat[stat.rindex(")") + 2 :].split(None, 2)[1])
    except (OSError, ValueError, IndexError):
        return None


def asleep(pid: int) -> bool:
    """Whether pid is asleep now (/proc/PID/stat's state S or D: not running, not runnable)."""
    try:
        stat = read_small(pid, "stat")
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :][:1] in ("S", "D")


def read_link(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def cwd(pid: int) -> str | None:
    return read_link(PROC / str(pid) / "cwd")


def children(ppid: int) -> list[int]:
    """PIDs whose parent is `ppid`: /proc/PID/task/TID/children where the kernel has it (it
    costs what the children cost; scanning /proc took 0.15-0.24 s with 1,200 processes),
    else a scan of /proc/N/stat. The kernel says the children file may miss a child forked
    or reaped while it is read (a reap shifts the list under the reader: a CI run missed a
    child asleep throughout), so it is read twice and the two unioned; a scan may miss
    such a child as well, a moment later."""
    found: set[int] = set()
    try:
        for _ in range(2):
            for tid in os.listdir(PROC / str(ppid) / "task"):
                children = (PROC / str(ppid) / "task" / tid / "children").read_text()
                found.update(int(p) for p in children.split())
    except (OSError, ValueError):
        return _children_by_scan(ppid)
    return sorted(found)


def _children_by_scan(ppid: int) -> list[int]:
    out = []
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split(None, 2)
        if len(fields) > 1 and fields[1] == str(ppid):
            out.append(int(entry.name))
    return sorted(out)


def is_postgres(info: ProcInfo) -> bool:
    """A PostgreSQL server process (postmaster or backend), by comm or binary."""
    if info.comm in ("postgres", "postmaster"):
        return True
    return info.exe is not None and Path(info.exe.removesuffix(" (deleted)")).name in (
        "postgres",
        "postmaster",
    )
