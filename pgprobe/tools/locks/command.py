"""`pgprobe locks`: heavyweight lock waits per lock and mode, exactly (thin CLI glue)."""

from __future__ import annotations

import argparse
from typing import Any

from pgprobe.discover import Targets
from pgprobe.engines.base import RunInfo, Snapshot
from pgprobe.errors import EXIT_ENV, PgprobeError
from pgprobe.pgstats import relnames
from pgprobe.pgstats.locks import LockSampler, Sample
from pgprobe.tools import common
from pgprobe.tools.locks import records, trees, view
from pgprobe.tools.waits import compiled, lockdim, probe
from pgprobe.tools.waits import records as waits_records
from pgprobe.tools.waits.targets import counted, identities, ours, present, run_counts, watched
from pgprobe.waitevents import address, lockwait

NAME = "locks"
TEXT_WIDTH = 60  # characters of a statement's text in the trees


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="heavyweight lock waits: which lock, which mode, how long, exactly",
        description="Every sleep in a Lock:* wait event charged to the lock the backend "
        "was queued on (the table, row or transaction) and the mode it wanted, read from "
        "its PGPROC at the switch-out: exact seconds per lock and waiter (14+).",
    )
    common.add_tracing_arguments(parser, default_duration=10)
    parser.add_argument("--by", choices=["pid"], help="pid: one row per waiter and lock")
    parser.add_argument(
        "--interval",
        type=common.positive_int,
        metavar="N",
        help="print a fresh table every N seconds until the duration ends",
    )
    parser.set_defaults(run=run)


def dimension(ns: argparse.Namespace, targets: Targets) -> tuple[address.WaitEventAddress,
                                                                  lockdim.Dimension]:  # fmt: skip
    """Where the wait event and each backend's PGPROC are, or a one-line refusal."""
    why = compiled.why_not(ns)
    if why is not None:
        raise PgprobeError(f"locks needs the compiled time model: "
                           f"{why or 'it runs on bpftrace with libbpf only'}",
                           EXIT_ENV)  # fmt: skip
    cluster = targets.cluster
    where = address.find(cluster.postmaster_pid, cluster.binary)
    found = lockwait.find(where, cluster.major)
    if found is None:
        raise PgprobeError(f"locks cannot read the backends' lock waits: {cluster.binary} has "
                           f"no {lockwait.SYMBOL}, or this major's offsets are not known",
                           EXIT_ENV)  # fmt: skip
    return where, lockdim.Dimension(found)


def run(ns: argparse.Namespace) -> int:
    common.check_interval(ns)
    targets = common.prepare(ns, probe.check_server, compiled.OBJECT)
    where, dim = dimension(ns, targets)
    discovered = identities(run_counts(watched(targets)))
    args = probe.script_args(targets, where, ns.interval)
    capture = compiled.capture(args, ns.duration, locks=dim)
    conninfo = targets.cluster.conninfo
    sampler = LockSampler(conninfo) if conninfo is not None else None
    names = relnames.RelationNames()  # read as the windows name new OIDs
    previous = None  # the maps are cumulative: each window is the difference of two
    used = 0  # the samples of the windows before
    try:
        for snapshot, info in common.snapshots(capture, ns, "lock waits",
                                               sampler.start if sampler else None):  # fmt: skip
            samples = sampler.samples[used:] if sampler else []
            used += len(samples)
            emit(ns, targets, snapshot, info, previous, present(discovered), samples, names)
            previous = snapshot
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
    if sampler is not None and sampler.error:
        common.warn(sampler.error)
    return 0


def emit(
    ns: argparse.Namespace,
    targets: Targets,
    snapshot: Snapshot,
    info: RunInfo,
    previous: Snapshot | None,
    alive: list[int],
    samples: list[Sample],
    names: relnames.RelationNames,
) -> None:
    """One window's lock waits (the whole capture's, or an interval's) on stdout."""
    cluster, keep = targets.cluster, counted(targets)
    waits = records.since(records.lock_waits(previous, keep) if previous else [],
                          records.lock_waits(snapshot, keep))  # fmt: skip
    procs = waits_records.since(previous, snapshot, alive, ours(targets))
    model = records.model_lock_ns(p for p in procs if keep(p.pid))
    not_read = records.not_read_ns(waits, model)
    dbs, rels = records.oids(waits, cluster.major)
    if not names.covers(dbs, rels):  # a window with new locks: their names, once
        names.update(relnames.read_conninfo(cluster.conninfo, dbs, rels))

    def label(tag: lockwait.LockTag) -> str:
        return records.label(tag, cluster.major, names)

    start, end = waits_records.window(snapshot, previous)
    rows = records.by_lock(waits)
    blocking = trees.window_trees(samples, waits)
    lock_of = records.lock_of(waits, label)
    meta = common.meta(
        targets, info, snapshot,
        interval=ns.interval,
        window_s=round((end - start) / 1e9, 6),
        window_unix_s=common.wall_clock(start, end),
        lock_wait_us=round(sum(w.ns for w in waits) / 1000, 3),
        lock_model_us=round(sum(model.values()) / 1000, 3),
        lock_not_read_us=round(sum(not_read.values()) / 1000, 3),
        lock_not_read_pids=sorted(not_read),
        blocking=trees.as_json(blocking, lock_of),
    )  # fmt: skip
    if ns.json:
        if ns.by == "pid":
            out = [{"pid": w.pid, **_pid_row(w, cluster.major, label)} for w in waits]
        else:
            out = [r.as_json(cluster.major, label(r.tag)) for r in rows]
        common.print_json(NAME, meta, out)
    else:
        title = common.title("Heavyweight lock waits", meta) + (
            f"; {meta['lock_wait_us'] / 1e6:.3f} s waited"
        )
        if ns.by == "pid":
            view.show_by_pid(title, waits, label,
                             lambda pid: targets.describe(pid).application_name)  # fmt: skip
        else:
            view.show(title, rows, cluster.major, label)
        if waits:
            print()
            view.show_trees(f"Blocking trees ({blocking.samples} samples of pg_locks with "
                            "waiters; each waiter under the root it was seen behind most)",
                            blocking, lock_of, TEXT_WIDTH)  # fmt: skip
    common.print_losses(info)
    if blocking.unsampled_ns:
        common.warn(f"{blocking.unsampled_ns / 1e9:.3f} s of lock waits (pids "
                    f"{', '.join(map(str, blocking.unsampled_pids))}) ended between two "
                    "samples of pg_locks: who blocked them is not known", "note")  # fmt: skip
    if not_read:
        common.warn(f"{sum(not_read.values()) / 1e9:.3f} s of Lock waits (pids "
                    f"{', '.join(map(str, sorted(not_read)))}) have no lock: their sleep began "
                    "before the capture and the lock could not be read then")  # fmt: skip


def _pid_row(w: records.LockWait, major: int, label: Any) -> dict[str, Any]:
    return {"lock": label(w.tag), "locktype": w.tag.locktype(major), **w.tag.columns(major),
            "mode": lockwait.mode_name(w.mode), "total_us": round(w.ns / 1000, 3),
            "waits": w.waits, "sleeps": w.sleeps, "max_us": round(w.max_ns / 1000, 3)}  # fmt: skip
