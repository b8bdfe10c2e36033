"""`pgprobe lwlocks` on the command line: options, the capture loop, JSON or the table."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any

from pgprobe.discover import Targets
from pgprobe.engines.base import RunInfo, Snapshot
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.tools import bystatement, common
from pgprobe.tools.lwlocks import bystatement as lwlock_statements
from pgprobe.tools.lwlocks import compiled as lwlock_compiled
from pgprobe.tools.lwlocks import guard, view
from pgprobe.tools.lwlocks.probe import (
    DEFAULT_MAX_FIRES_PER_S,
    MAX_FIRES_LIMIT,
    SCHED,
    USDT,
    pick_source,
    start,
    start_sleeps,
)
from pgprobe.tools.lwlocks.records import (
    WaitRow,
    records,
    rows,
    sched_meta,
    sleep_records,
    sleeps_warning,
    unmatched_warning,
)
from pgprobe.tools.queries import command as queries_command
from pgprobe.tools.waits import compiled as waits_compiled
from pgprobe.tools.waits import probe as waits_probe

NAME = "lwlocks"


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="LWLock waits per tranche and mode",
        description="Time every LWLock wait of the targets and show a table per tranche "
        "and mode, sorted by total wait time.",
    )
    common.add_tracing_arguments(parser, default_duration=10)
    parser.add_argument(
        "--by",
        choices=["pid", "query"],
        help="pid: one row per backend as well (pid, type, application); query: LWLock sleeps "
        "per statement (query id) from the time model (PostgreSQL 14+, the compiled object)",
    )
    bystatement.add_filters(parser)
    parser.add_argument(
        "--interval",
        type=common.positive_int,
        metavar="N",
        help="print a fresh table every N seconds until the duration ends",
    )
    parser.add_argument(
        "--source",
        choices=["auto", "usdt", "sched"],
        default="auto",
        help="sched: each LWLock sleep and the runqueue time after it, with its mode, from the "
        "scheduler (any 14+ build; costs per context switch, not per wait: stays attached on "
        "a busy server); usdt: time each wait with the LWLock probes (a build with "
        "--enable-dtrace; exact counts, a uprobe trap per fire, hence its guard); auto "
        "(default): sched (usdt on 13 and with DTrace)",
    )
    parser.add_argument(
        "--max-events-per-sec",
        type=common.bounded(int, 0, MAX_FIRES_LIMIT, unit="probe fires per second"),
        default=DEFAULT_MAX_FIRES_PER_S,
        metavar="N",
        help="usdt source: stop early (keeping what was collected) when the LWLock "
        "probes fire more than N times in a second (two fires per wait, each paid in CPU "
        f"while the probes are attached): the default {DEFAULT_MAX_FIRES_PER_S:,} bounds "
        "that cost (see docs/lwlocks.md); 0: no guard. The sched source costs per context "
        "switch, not per wait, and has no guard",
    )
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    if bystatement.wanted(ns):
        return by_query(ns)
    by_pid = ns.by == "pid"
    common.check_interval(ns)
    sources: list[str] = []
    # the object of the source asked for (auto: the scheduler's but on 13, known only later)
    usdt = ns.source == "usdt"
    targets = common.prepare(ns, lambda t: sources.append(pick_source(ns, t)),
                             lwlock_compiled.OBJECT if usdt else waits_compiled.OBJECT)  # fmt: skip
    source = sources[0]
    modes_read = True  # the USDT probes pass the mode
    if source == SCHED:
        capture, modes_read = start_sleeps(ns, targets, ns.interval)
    else:
        capture = guard.Guarded(start(ns, targets, by_pid, ns.interval, ns.max_events_per_sec))
    what = "LWLock waits"
    previous = None  # waits.bt's maps are running totals: a window is the difference
    for snapshot, info in common.snapshots(capture, ns, what):
        common.refresh_if_needed(targets, by_pid and snapshot.final)
        if source == SCHED:
            recs = sleep_records(snapshot, targets.cluster.major, bool(ns.interval), previous)
            previous = snapshot
        else:
            recs = records(snapshot)
        result = rows(recs, targets, by_pid)
        stop = capture.stop if isinstance(capture, guard.Guarded) else None
        emit(ns, result, snapshot, info, targets, by_pid, source,
             stop if snapshot.final else None, modes_read)  # fmt: skip
    return 0


def emit(
    ns: argparse.Namespace,
    result: list[WaitRow],
    snapshot: Snapshot,
    info: RunInfo,
    targets: Targets,
    by_pid: bool,
    source: str = USDT,
    stop: guard.GuardStop | None = None,
    modes_read: bool = True,
) -> None:
    warning = unmatched_warning(snapshot) if source == USDT else sleeps_warning(snapshot)
    if warning and warning not in info.warnings:
        info.warnings.append(warning)
    extra: dict[str, Any] = {"source": source}
    if source == SCHED:
        extra.update(sched_meta(snapshot, modes_read))
    else:
        limit = getattr(ns, "max_events_per_sec", 0)
        extra.update(stop.meta(limit) if stop else guard.no_guard_meta(limit))
    meta = common.meta(targets, info, snapshot, interval=ns.interval, **extra)
    if stop is not None:
        print(stop.sentence(), file=sys.stderr, flush=True)
    if ns.json:
        common.print_json(NAME, meta, [r.as_json() for r in result])
        if info.ended_early and snapshot.final:  # meta says it too; a script's log should
            common.print_losses(RunInfo(ended_early=info.ended_early))
        return
    view.show(result, by_pid, meta, interval=ns.interval)
    common.print_losses(info)


def by_query(ns: argparse.Namespace) -> int:
    """--by query / --query-id: each statement's LWLock sleeps (pgprobe queries' capture)."""
    if ns.interval:
        raise PgprobeError("--by query takes no --interval (one table per capture)", EXIT_USAGE)
    if ns.source == "usdt":
        raise PgprobeError("--by query comes from the time model keyed by statement: not with "
                           "--source usdt (its waits are not kept per statement)",
                           EXIT_USAGE)  # fmt: skip
    targets = common.prepare(ns, waits_probe.check_server, waits_compiled.OBJECT)
    got = queries_command.capture_statements(ns, targets)
    rows = got.rows
    if ns.query_id is not None:
        rows = [r for r in rows if r.query_id == ns.query_id and not r.text_keyed]
    found = lwlock_statements.sleeps(rows, targets.cluster.major)
    meta = {**got.meta, "source": SCHED, "measures": "sleeps", "mode": "unknown", "by": "query"}
    if ns.json:
        common.print_json(NAME, meta, [r.as_json() for r in found])
    else:
        title = common.title("LWLock sleeps by statement (from the scheduler: sleeps, not "
                             "waits; mode unknown)", meta)  # fmt: skip
        view.show_by_query(title, found, max(shutil.get_terminal_size((160, 24)).columns - 70, 30))
    common.print_losses(got.info)
    if got.note:
        common.warn(got.note, "note")
    return 0
