"""Which processes a waits capture is about: ours or not, named how, and asleep
through the whole capture (read from /proc and pg_stat_activity). Used by
`pgprobe waits`, triage's time model and serve's."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pgprobe import discover, proc, waitevents
from pgprobe.discover import Targets
from pgprobe.tools.waits import records
from pgprobe.waitevents import backend_state


def identities(pids: Iterable[int]) -> dict[int, int]:
    """pid -> its start time, read before a capture, for present()."""
    started = {pid: proc.start_ticks(pid) for pid in pids}
    return {pid: t for pid, t in started.items() if t is not None}


def present(before: dict[int, int]) -> list[int]:
    """The processes of `before` that are still the same now (same pid, same start time).

    These are the targets records() may charge a whole window "asleep" when no event of
    theirs shows: a process of the discovery gone since (it exited before the probes were
    in, so no exit was seen) lived none of the window, and a pid number reused by another
    process is not the one discovered."""
    return sorted(pid for pid, t in before.items() if proc.start_ticks(pid) == t)


def watched(targets: Targets) -> list[int]:
    """The processes to read before a capture: the targets, and for the whole cluster every
    child of the postmaster now (the backends born since the discovery too: one asleep
    when the probes attach is named by this read, not "asleep since before the capture")."""
    if not targets.whole_cluster:
        return list(targets.pids)
    postmaster = targets.cluster.postmaster_pid
    return sorted({*targets.pids, postmaster, *proc.children(postmaster)})


def run_counts(pids: list[int]) -> dict[int, int]:
    counts = {pid: proc.run_count(pid) for pid in pids}
    return {pid: n for pid, n in counts.items() if n is not None}


def asleep_at(targets: Targets, runs_before: dict[int, int]) -> dict[int, tuple[int, int]]:
    """pid -> (run count, wait_event_info): asleep in that event across a fresh
    pg_stat_activity read (its run count the same before and after the read)."""
    out = {}
    for pid, wei in asleep_all_along(targets, runs_before).items():
        out[pid] = (runs_before[pid], wei)
    return out


def asleep_all_along(targets: Targets, runs_before: dict[int, int]) -> dict[int, int]:
    """pid -> wait_event_info, for the targets that slept through the whole capture.

    Read after a fresh pg_stat_activity: a process whose run count did not move
    from before the capture until after that read slept all the while in the
    event pg_stat_activity shows (the same uint32 the probe reads at a switch-out).
    """
    discover.refresh_backends(targets.cluster)
    out = {}
    for pid, runs in run_counts(list(runs_before)).items():
        backend = targets.cluster.backend(pid)
        if runs_before.get(pid) != runs or backend is None or not backend.wait_event_type:
            continue
        major = targets.cluster.major
        wei = waitevents.number(major, backend.wait_event_type, backend.wait_event)
        if wei is not None:  # ClientRead: with the state read with it (idle, in a transaction)
            out[pid] = backend_state.with_state(major, wei, backend.state)
    return out


def ours(targets: Targets) -> Any:
    postmaster = targets.cluster.postmaster_pid
    wanted = None if targets.whole_cluster else set(targets.pids)

    def is_ours(pid: int) -> bool:
        if wanted is not None:
            return pid in wanted
        if pid == postmaster or pid in targets.pids:
            return True
        info = proc.read_info(pid)
        return info is not None and info.ppid == postmaster

    return is_ours


def counted(targets: Targets) -> Callable[[int], bool]:
    """The processes a tool counts from the compiled object's maps (which hold the cluster's
    alone, the exited ones too): the targets', never the postmaster (it runs no statement
    and takes no lock; its main loop sleeps with no wait event: idle, not DB time)."""
    postmaster = targets.cluster.postmaster_pid
    if targets.whole_cluster:
        return lambda pid: pid != postmaster
    pids = set(targets.pids) - {postmaster}
    return lambda pid: pid in pids


def describe(targets: Targets) -> records.Describe:
    def named(pid: int) -> tuple[str, str]:
        if pid == targets.cluster.postmaster_pid:
            return "postmaster", ""
        backend = targets.describe(pid)
        return backend.backend_type or "(exited)", backend.application_name

    return named
