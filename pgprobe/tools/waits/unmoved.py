"""What a read of the compiled time model keeps of each live process for the next read.

A process that has neither run nor been on a CPU since the last read (its /proc/PID/schedstat
the same: time on CPU, time waiting for one, times put on one) has the same @task entry
(bpf/waits.bpf.c writes it only at the process's own switch-outs) and the same statement in
its status entry (only the backend writes it): neither is read again. Most of a busy
server's backends are idle between two refreshes of `top` or two windows of `--interval`:
one file read each instead of a pidfd, two map lookups, /proc/PID/status and
/proc/PID/mem (measured: bench.top, docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from pgprobe import proc
from pgprobe.waitevents import statement

T = TypeVar("T")


@dataclass
class Kept:
    """A process's entry and counters at its last read, and its statement then (read: the
    statement is known; None in it: the memory could not be read)."""

    entry: bytes
    counters: proc.SchedCounters
    statement: statement.Read | None = None
    read: bool = False
    # what a read computes from the entry alone (its query fields and totals, its
    # histogram's slots), by name: kept with the entry (of_entry)
    derived: dict[str, Any] = field(default_factory=dict)


@dataclass
class Unmoved:
    """The live processes' last reads, kept for one capture (cleared when it starts again)."""

    kept: dict[int, Kept] = field(default_factory=dict)
    # the processes found not moved all through the last read: the same processes as at
    # the read before (a pid taken by a new process would have its own counters)
    confirmed: set[int] = field(default_factory=set)
    # schedstat kept open per process (a long-lived reader: top); None: opened at each read
    files: proc.SchedstatFiles | None = None

    def schedstat(self, pid: int) -> tuple[int, int, int] | None:
        return self.files.read(pid) if self.files is not None else proc.schedstat(pid)

    def still(self, pid: int) -> Kept | None:
        """pid's last read when it has not moved since (one read of /proc/PID/schedstat)."""
        kept = self.kept.get(pid)
        if kept is None:
            return None
        now = self.schedstat(pid)
        c = kept.counters
        if now is None or now != (c.cpu_ns, c.runq_ns, c.runs):
            del self.kept[pid]
            return None
        return kept

    def keep(self, pid: int, entry: bytes, counters: proc.SchedCounters) -> None:
        old = self.kept.get(pid)
        if old is None or old.entry != entry or old.counters != counters:
            self.kept[pid] = Kept(entry, counters)

    def statement(self, pid: int, read: statement.Read | None) -> None:
        """pid's statement as read now, kept with its entry."""
        kept = self.kept.get(pid)
        if kept is not None:
            kept.statement, kept.read = read, True

    def of_entry(self, pid: int, entry: bytes, name: str, compute: Callable[[], T]) -> T:
        """compute(), a pure function of pid's entry named `name`: kept from the read before
        when the entry is the same (a process that has not run: most of them)."""
        kept = self.kept.get(pid)
        if kept is None or kept.entry != entry:
            return compute()
        if name not in kept.derived:
            kept.derived[name] = compute()
        return cast(T, kept.derived[name])

    def known_statement(self, pid: int) -> Kept | None:
        """pid's kept read when its statement is known (read since it last moved)."""
        kept = self.kept.get(pid)
        return kept if kept is not None and kept.read else None

    def forget_gone(self, live: set[int]) -> None:
        for pid in self.kept.keys() - live:
            del self.kept[pid]
        if self.files is not None:
            self.files.keep_only(live)

    def close(self) -> None:
        if self.files is not None:
            self.files.close()
