"""`pgprobe waits`: where the time of every PostgreSQL process goes (thin CLI glue)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pgprobe import discover, proc, waitevents
from pgprobe.discover import Targets
from pgprobe.engines.base import RunInfo, Snapshot
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.tools import common
from pgprobe.tools.waits import probe, records, view
from pgprobe.waitevents import address

NAME = "waits"


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="time model: on CPU, waiting for a CPU, each wait event",
        description="Where the time of the targets goes, exactly, from the scheduler and "
        "PostgreSQL's own wait_event_info (14+, any build): on CPU, runqueue, each wait "
        "event as pg_stat_activity names it, idle, not accounted.",
    )
    common.add_tracing_arguments(parser, default_duration=10)
    parser.add_argument("--by", choices=["pid"], help="one time model per process")
    parser.add_argument(
        "--interval",
        type=common.positive_int,
        metavar="N",
        help="print a fresh table every N seconds until the duration ends",
    )
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    by_pid = ns.by == "pid"
    if ns.interval and ns.interval > ns.duration:
        raise PgprobeError(
            f"--interval {ns.interval} is longer than the duration ({ns.duration:g} s)",
            EXIT_USAGE,
        )
    targets = common.prepare(ns, probe.check_server)
    cluster = targets.cluster
    where = address.find(cluster.postmaster_pid, cluster.binary)
    runs_before = run_counts(targets.pids)
    capture = common.capture(
        ns, probe.SCRIPT, probe.script_args(targets, where, ns.interval), probe.MAPS, env=probe.ENV
    )
    for snapshot, info in common.snapshots(capture, ns, "time per wait event"):
        slept_in = asleep_all_along(targets, runs_before)
        emit(ns, snapshot, info, targets, by_pid, where, slept_in)
    return 0


def run_counts(pids: list[int]) -> dict[int, int]:
    counts = {pid: proc.run_count(pid) for pid in pids}
    return {pid: n for pid, n in counts.items() if n is not None}


def asleep_all_along(targets: Targets, runs_before: dict[int, int]) -> dict[int, int]:
    """pid -> wait_event_info, for the targets that slept through the whole capture.

    Read after a fresh pg_stat_activity: a process whose run count did not move
    from before the capture until after that read slept all the while in the
    event pg_stat_activity shows (the same uint32 the probe reads at a switch-out).
    """
    discover.refresh_backends(targets.cluster)
    out = {}
    for pid, runs in run_counts(targets.pids).items():
        backend = targets.cluster.backend(pid)
        if runs_before.get(pid) != runs or backend is None or not backend.wait_event_type:
            continue
        major = targets.cluster.major
        wei = waitevents.number(major, backend.wait_event_type, backend.wait_event)
        if wei is not None:
            out[pid] = wei
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


def describe(targets: Targets) -> records.Describe:
    def named(pid: int) -> tuple[str, str]:
        if pid == targets.cluster.postmaster_pid:
            return "postmaster", ""
        backend = targets.describe(pid)
        return backend.backend_type or "(exited)", backend.application_name

    return named


def emit(
    ns: argparse.Namespace,
    snapshot: Snapshot,
    info: RunInfo,
    targets: Targets,
    by_pid: bool,
    where: address.WaitEventAddress,
    slept_in: dict[int, int],
) -> None:
    is_ours = ours(targets)
    procs = records.records(snapshot, targets.pids, is_ours, slept_in)
    if not targets.whole_cluster:
        procs = [p for p in procs if p.pid in targets.pids]
    result = records.rows(procs, targets.cluster.major, by_pid, describe(targets))
    start, end = records.window(snapshot)
    meta = common.meta(
        targets,
        info,
        snapshot,
        interval=ns.interval,
        window_s=round((end - start) / 1e9, 6),
        processes=len(procs),
        process_seconds=round(sum(p.wall_ns for p in procs) / 1e9, 6),
        exited_pids=[p.pid for p in procs if p.exited],
        born_pids=[p.pid for p in procs if p.born],
        wait_event_address=hex(where.address),
        asleep_all_along_pids=sorted(slept_in),
        missed_runs=info.missed_runs,
        unseen_events=records.unseen(snapshot),
    )
    if ns.json:
        common.print_json(NAME, meta, [r.as_json() for r in result])
        return
    title = common.title("Time model", meta) + (
        f"; {meta['processes']} processes, {meta['process_seconds']:.1f} process-seconds"
    )
    view.show(title, result, by_pid, meta)
    common.print_losses(info)
    lost = meta["unseen_events"]
    if any(lost.values()):
        print(
            f"pgprobe: warning: events lost: {lost['switch_in']} switch-ins (those intervals "
            f"are missing) and {lost['wakeup']} wakeups (that runqueue time is charged to the "
            "wait event)",
            file=sys.stderr,
        )
