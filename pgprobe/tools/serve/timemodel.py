"""One window of bpf/waits.bt as pgprobe waits' time-model rows, per process, named.

pgprobe waits decides which processes are the cluster's and names them once per
capture; the agent does it every window, for a cluster whose backends come and
go, so it keeps what it learnt (pid -> backend type) only for the pids of the
last window: memory stays bounded by the processes alive. With `lwlock_sleeps`
(serve's default LWLock source) it also gives the window's LWLock-class sleeps,
each with the runqueue time after it, as pgprobe lwlocks --source sched does (the mode
not read: unknown).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pgprobe.discover import Targets
from pgprobe.engines.base import Snapshot
from pgprobe.tools import lwlocks
from pgprobe.tools.queries import records as queries_records
from pgprobe.tools.waits import records as waits_records
from pgprobe.tools.waits import targets as waits_targets

# Past this many exited processes in waits.bt's maps (running totals) the agent starts
# the tracer again, said in one line and counted as a restart (shared with pgprobe waits).
RECYCLE_AFTER_EXITED = waits_records.RECYCLE_AFTER_EXITED
exited = waits_records.exited


@dataclass
class TimeModel:
    targets: Targets
    types: dict[int, tuple[str, str]] = field(default_factory=dict)  # pid -> (type, app)
    previous: Snapshot | None = None  # the last window's (the maps are cumulative)
    lost_events: int = 0  # what waits.bt knows it missed in the last window
    observed_s: float = 0.0  # how long the last window's probes counted (duty cycle: a part)
    lwlock_sleeps: bool = False  # also the LWLock sleeps of each window (lwlock_records)
    lwlock_records: list[lwlocks.WaitRecord] = field(default_factory=list)
    discovered: dict[int, int] = field(default_factory=dict)  # targets.identities at start
    statements: bool = False  # also each window's time per statement (--statements)
    statement_rows: list[queries_records.StatementTime] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.discovered = waits_targets.identities(self.targets.pids)

    def describe(self, pid: int) -> tuple[str, str]:
        if pid not in self.types:
            self.types[pid] = waits_targets.describe(self.targets)(pid)
        return self.types[pid]

    def rows(self, snapshot: Snapshot) -> list[waits_records.Row]:
        """The window's time model by pid (the caller sums it per backend type).

        The maps are cumulative since the capture began: a window is the
        difference of this snapshot and the last (records.since()), cut at
        their @now_ns; a snapshot of a new capture (a duty cycle's next part)
        is a window of its own. The pids found at discovery that are still the same
        processes are passed as targets (waits.targets.present): one asleep since before
        the capture, never woken, has no event to show it (its window is "asleep since
        before capture"). A pid born later has its fork in @task.
        """
        alive = waits_targets.present(self.discovered)
        is_ours = waits_targets.ours(self.targets)
        previous, self.previous = waits_records.continues(self.previous, snapshot), snapshot
        start, end = waits_records.window(snapshot, previous)
        self.observed_s = max(end - start, 0) / 1e9
        procs = waits_records.since(previous, snapshot, alive, is_ours)
        self.lost_events = sum(waits_records.unseen(snapshot, previous).values())
        major = self.targets.cluster.major
        if self.lwlock_sleeps:
            recs = lwlocks.sleep_records(snapshot, major, clipped=True, previous=previous)
            self.lwlock_records = recs
        if self.statements:
            # the object counts the cluster's processes only: all but the postmaster
            # (no statement; its main loop is idle) and the agent's own session
            charged = queries_records.charges(snapshot, previous)
            skip = {self.targets.cluster.postmaster_pid, self.targets.cluster.own_pid}
            self.statement_rows = queries_records.statements(
                major, charged, lambda pid: pid not in skip
            )
        out = waits_records.rows(procs, major, by_pid=True, describe=self.describe)
        seen = {p.pid for p in procs}
        self.types = {pid: t for pid, t in self.types.items() if pid in seen}
        return out
