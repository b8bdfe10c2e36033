"""`pgprobe top`'s data: the compiled time model running all along (with its query and lock
dimensions where this build has them), a Frame at each refresh, never a restart per refresh.

The object's maps keep running totals: a refresh reads them (engines.compiled's interval
snapshot) and its window is the difference with the read before (tools/waits/records.since),
so no time falls between two refreshes; `interval` may change between two reads (`+`, `-`).
Past records.RECYCLE_AFTER_EXITED exited processes in the maps (connection churn) the
capture is stopped and started again, as `waits --interval` does, and the refresh says so.
Beside it, with the lock dimension, pgprobe locks' SQL sampler (pgstats.locks: pg_locks and
pg_blocking_pids while someone waits) runs all along on a session of its own; each refresh
takes the samples since the last one into its window's blocking trees (tools/locks/trees).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import resource
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from pgprobe import discover, proc
from pgprobe.discover import Targets
from pgprobe.engines.base import RunInfo, Snapshot
from pgprobe.engines.compiled import CompiledCapture
from pgprobe.errors import EXIT_ENV, PgprobeError
from pgprobe.pgstats import relnames
from pgprobe.pgstats import statements as pgss
from pgprobe.pgstats.locks import LockSampler, Sample
from pgprobe.tools.locks import records as lock_records
from pgprobe.tools.locks import trees as lock_trees
from pgprobe.tools.queries import records as query_records
from pgprobe.tools.top import records
from pgprobe.tools.top.sessions import Sessions
from pgprobe.tools.waits import compiled, lockdim, probe, querydim
from pgprobe.tools.waits import records as waits_records
from pgprobe.tools.waits.targets import counted, identities, ours, present, run_counts, watched
from pgprobe.tools.waits.unmoved import Unmoved
from pgprobe.waitevents import address, lockwait, statement


@dataclass
class Dimensions:
    """What the capture keys beside the time model; a note for each it cannot."""

    query: querydim.Dimension | None
    locks: lockdim.Dimension | None
    notes: list[str] = field(default_factory=list)


def dimensions(targets: Targets, where: address.WaitEventAddress) -> Dimensions:
    """The statement and lock dimensions this build allows (each view without one says why)."""
    cluster, notes = targets.cluster, []
    found = statement.address_of(where, cluster.major)
    computed = True
    if cluster.conninfo is not None:
        with discover.connect_conninfo(cluster.conninfo) as conn:
            computed = pgss.query_ids(conn).computed
    query = querydim.Dimension(found, not computed, cluster.binary) if found else None
    if query is None:
        notes.append(f"no statements: {cluster.binary} has no MyBEEntry, or this major's "
                     "offsets are not known")  # fmt: skip
    lock = lockwait.find(where, cluster.major)
    if lock is None:
        notes.append(f"no locks: {cluster.binary} has no {lockwait.SYMBOL}, or this major's "
                     "offsets are not known")  # fmt: skip
    return Dimensions(query, lockdim.Dimension(lock) if lock else None, notes)


def check(ns: argparse.Namespace) -> None:
    """top runs on the compiled time model only: refused in one line without it."""
    why = compiled.why_not(ns)
    if why is not None:
        why = why or "it runs on bpftrace with libbpf only"
        raise PgprobeError(f"top needs the compiled time model: {why}", EXIT_ENV)


# The soft file limit top asks for, within the hard one: 8,064 schedstat files kept open.
FILES_WANTED = 16384


def kept_files() -> int:
    """How many /proc/PID/schedstat files a refresh keeps open: half the file limit left
    after 256 (SQL sessions, the object's maps and links, the terminal). The soft limit is
    raised to FILES_WANTED first where the hard one allows: at the usual 1,024, 384 were
    kept and a read of 1,000 backends took ~40 % longer (docs/benchmarks.md)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FILES_WANTED if hard == resource.RLIM_INFINITY else min(hard, FILES_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    return 65536 if soft == resource.RLIM_INFINITY else max(0, (soft - 256) // 2)


def still_present(discovered: dict[int, int], alive: list[int], unmoved: set[int]) -> list[int]:
    """present(discovered) now, from the last refresh's: a process present then that has not
    moved since (the read just made found its counters unchanged) is that process still,
    without its /proc/PID/stat read (1,000 idle backends: 1,000 files a refresh)."""
    kept = {pid for pid in alive if pid in unmoved}
    return sorted([*kept, *present({p: t for p, t in discovered.items() if p not in kept})])


class Source:
    """The running capture and what each refresh adds to it."""

    def __init__(self, targets: Targets, interval: int, duration: float | None) -> None:
        self.targets = targets
        cluster = targets.cluster
        self.where = address.find(cluster.postmaster_pid, cluster.binary)
        self.dims = dimensions(targets, self.where)
        self.sessions = Sessions(cluster.conninfo)
        self.names = relnames.RelationNames()
        self.interval = interval
        self.duration = duration
        self.started = time.monotonic()
        self.cpus = os.cpu_count() or 1
        self.capture: CompiledCapture | None = None
        self.on_tick: Callable[[RunInfo, float | None], None] | None = None
        self.gone = ""  # the server went away: why, in one line
        self.info: RunInfo | None = None
        self.snapshot = Snapshot(label="")  # the last refresh's (its common meta)
        self.sampler: LockSampler | None = None  # who blocks whom (with the lock dimension)
        self._blocking: lock_trees.Trees | None = None  # the last refresh's trees
        # the last refresh's snapshot, modelled and charged to statements (_window)
        self._last: (
            tuple[Snapshot, list[waits_records.ProcessTime], query_records.Charges] | None
        ) = None
        # ours(targets), each answer kept for the capture: both snapshots of a window are
        # modelled alike (a process that exits in between stays ours)
        self._is_ours: Callable[[int], bool] = ours(targets)
        self._stop = False

    def set_interval(self, seconds: int) -> None:
        """The next refreshes every `seconds` (from the one after the next)."""
        self.interval = seconds
        if self.capture is not None:
            self.capture.interval = seconds

    def stop(self) -> None:
        self._stop = True
        if self.capture is not None:
            self.capture.request_stop()

    def close(self) -> None:
        """The SQL sessions closed (the sampler's thread ended)."""
        if self.sampler is not None and self.sampler.is_alive():
            self.sampler.stop()
        self.sessions.close()

    def _start_sampler(self) -> None:
        if self.dims.locks is not None and self.targets.cluster.conninfo is not None:
            self.sampler = LockSampler(self.targets.cluster.conninfo)
            self.sampler.start()

    def _samples(self) -> tuple[list[Sample], str]:
        """The sampler's samples since the last refresh; its error, once, when it stopped
        (a new one is started: the trees miss the seconds between)."""
        sampler = self.sampler
        if sampler is None:
            return [], ""
        # taken out of the sampler's list (top runs for hours: the list would only grow);
        # the thread only appends, so the first n are these whatever it adds meanwhile
        n = len(sampler.samples)
        new = sampler.samples[:n]
        del sampler.samples[:n]
        if sampler.error is None or sampler.is_alive():
            return new, ""
        self._start_sampler()
        return new, f"{sampler.error} (started again: no tree in between)"

    def frames(self) -> Generator[records.Frame, None, None]:
        """A Frame at each refresh until stopped, the duration ends or the server is gone."""
        restarted = ""
        while not self._stop:
            left = None if self.duration is None else self.duration - (time.monotonic()
                                                                       - self.started)  # fmt: skip
            if left is not None and left < 1:
                return
            recycle = yield from self._one_capture(left, restarted)
            if recycle is None or self.gone:
                return
            restarted = (f"the capture was started again (its maps held {recycle:,} exited "
                         "processes): the seconds it took to attach are in no window")  # fmt: skip

    def _one_capture(
        self, duration: float | None, note: str
    ) -> Generator[records.Frame, None, int | None]:
        targets = self.targets
        discovered = identities(run_counts(watched(targets)))
        args = probe.script_args(targets, self.where, self.interval)
        reads = Unmoved(files=proc.SchedstatFiles(kept_files()))
        self._is_ours, self._last = functools.cache(ours(targets)), None
        capture = compiled.capture(args, duration, query=self.dims.query, locks=self.dims.locks,
                                   unmoved=reads)  # fmt: skip
        self.capture = capture
        if self.sampler is None:
            self._start_sampler()
        capture.on_tick = self.on_tick
        self.info = capture.info
        self.sessions.read()  # pg_stat_statements' first counters, before the first window
        previous: Snapshot | None = None
        recycle: int | None = None
        failed = 0
        alive: list[int] = []
        try:
            for event in capture.events():
                if not isinstance(event, Snapshot):
                    continue
                alive = still_present(discovered, alive, reads.confirmed)
                frame = self.frame(previous, event, alive, capture.info, failed)
                if note:
                    frame.lost.append(note)
                    note = ""
                failed = capture.info.failed_map_updates
                exited = waits_records.exited(event)
                if exited >= waits_records.RECYCLE_AFTER_EXITED and recycle is None:
                    recycle = exited
                    capture.request_stop()
                if not proc.exists(targets.cluster.postmaster_pid):
                    self.gone = (f"the server is gone: postmaster {targets.cluster.postmaster_pid} "
                                 "exited")  # fmt: skip
                    frame.lost.append(self.gone)
                    capture.request_stop()
                previous = self.snapshot = event
                yield frame
        finally:
            reads.close()
        return recycle

    def frame(
        self,
        previous: Snapshot | None,
        snapshot: Snapshot,
        alive: list[int],
        info: RunInfo,
        failed_before: int,
    ) -> records.Frame:
        """One refresh: the window since `previous` of every view."""
        targets, major = self.targets, self.targets.cluster.major
        reading = self.sessions.read()
        samples, sampler_error = self._samples()
        own = {self.sessions.own_pid, self.sampler.backend_pid if self.sampler else 0}
        keep = counted(targets)

        def kept(pid: int) -> bool:
            return pid not in own and keep(pid)

        window, charged = self._window(previous, snapshot, alive)
        procs = [p for p in window if kept(p.pid)]
        backends = records.backends(procs, major, reading.sessions)
        by_class, wall = records.totals(backends)
        statements = query_records.statements(major, charged, kept)
        query_records.add_counters(statements, reading.calls)
        ids = [s.query_id for s in statements[:50] if s.query_id is not None
               and not s.text_keyed]  # fmt: skip
        query_records.add_texts(statements, self.sessions.statement_texts(ids),
                                self.sessions.text_keys)  # fmt: skip
        waits = lock_records.since(lock_records.lock_waits(previous, kept) if previous else [],
                                   lock_records.lock_waits(snapshot, kept))  # fmt: skip
        dbs, rels = lock_records.oids(waits, major)
        if not self.names.covers(dbs, rels) and reading.error == "":
            self.names.update(relnames.read_conninfo(targets.cluster.conninfo, dbs, rels))
        names = self.names

        def label(row: lock_records.LockRow) -> str:
            return lock_records.label(row.tag, major, names)

        start, end = waits_records.window(snapshot, previous)
        lost = self._lost(snapshot, previous, info, failed_before, reading.error)
        if sampler_error:
            lost.append(sampler_error)
        blocking = None
        if self.sampler is not None:
            blocking = records.carry(lock_trees.window_trees(samples, waits), self._blocking,
                                     waits)  # fmt: skip
            self._blocking = blocking
        lock_of = lock_records.lock_of(waits, lambda tag: lock_records.label(tag, major, names))
        return records.Frame(start, end, time.time() - (time.monotonic_ns() - end) / 1e9,
                             self.cpus, by_class, wall, backends, records.waits(procs, major),
                             statements, lock_records.by_lock(waits), label, lost,
                             major, blocking, lock_of)  # fmt: skip

    def _window(
        self, previous: Snapshot | None, snapshot: Snapshot, alive: list[int]
    ) -> tuple[list[waits_records.ProcessTime], query_records.Charges]:
        """The window's processes (the time model) and its statements' charges: each
        snapshot modelled once, at its refresh, and kept for the next window's difference
        (modelled as it was: ours() answers kept, `alive` only shrinks in a capture)."""
        modelled = waits_records.records(snapshot, alive, self._is_ours)
        cumulative = query_records.charges(snapshot)
        window, charged = modelled, cumulative
        if previous is not None:
            last = self._last if self._last is not None and self._last[0] is previous else None
            before = (last[1] if last is not None
                      else waits_records.records(previous, alive, self._is_ours))  # fmt: skip
            window = waits_records.difference(modelled, before, snapshot, previous)
            charged = query_records.minus(cumulative, last[2] if last is not None
                                          else query_records.charges(previous))  # fmt: skip
        self._last = (snapshot, modelled, cumulative)
        return window, charged

    def _lost(
        self,
        snapshot: Snapshot,
        previous: Snapshot | None,
        info: RunInfo,
        failed_before: int,
        sql_error: str,
    ) -> list[str]:
        """What this window lost, one line each (the time model's own words)."""
        lost = []
        unseen = waits_records.unseen(snapshot, previous)
        line = waits_records.lost_warning(unseen, waits_records.gap_ns(snapshot, previous) / 1e6)
        if line:
            lost.append(line)
        if info.failed_map_updates > failed_before:
            lost.append(f"{info.failed_map_updates - failed_before} updates refused by full "
                        "BPF maps (counts are low)")  # fmt: skip
        if sql_error:
            lost.append(f"{sql_error} (names and calls are the last seen)")
        return lost
