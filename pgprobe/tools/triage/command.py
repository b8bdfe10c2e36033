"""`pgprobe triage`: the CLI glue: options, the window, findings, the report, the summary.

The time-model part (`pgprobe waits`' probe) is started here, with the helpers it needs
around the capture (run counts before it, the processes asleep all along, which tasks
are ours, names) from pgprobe.tools.waits.targets.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from pgprobe import discover, outfile
from pgprobe.discover import Targets
from pgprobe.engines.base import RunInfo, Snapshot
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.findings import findings_json
from pgprobe.pgstats import relnames, statements
from pgprobe.pgstats.locks import LockSampler
from pgprobe.render import flamegraph, report
from pgprobe.tools import common, flame, lwlocks, profiling
from pgprobe.tools.clog_reads import compiled as slru_compiled
from pgprobe.tools.locks import records as locks_records
from pgprobe.tools.locks import trees as locks_trees
from pgprobe.tools.lwlocks import compiled as lwlock_compiled
from pgprobe.tools.profiling import compiled as profile_compiled
from pgprobe.tools.queries import records as query_records
from pgprobe.tools.triage import parts, records, view
from pgprobe.tools.triage.window import NAME, capture_window
from pgprobe.tools.waits import compiled, lockdim, querydim
from pgprobe.tools.waits import probe as waits_probe
from pgprobe.tools.waits import records as waits_records
from pgprobe.tools.waits import targets as waits_targets
from pgprobe.waitevents import address, lockwait, statement

DEFAULT_DURATION_S = 30.0


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="everything at once over N seconds, as one HTML report",
        description="Capture the time model (on CPU, waiting for a CPU, each wait event), CPU "
        "samples, LWLock waits, SLRU reads and PostgreSQL's own statistics over the same "
        "window, and write a self-contained HTML report with findings first.",
    )
    common.add_tracing_arguments(parser, default_duration=DEFAULT_DURATION_S)
    parser.add_argument(
        "-F",
        "--frequency",
        dest="hz",
        type=profiling.hz_value,
        default=profiling.DEFAULT_HZ,
        metavar="HZ",
        help=f"CPU samples per second per CPU (default {profiling.DEFAULT_HZ})",
    )
    profiling.add_hz_alias(parser)
    profiling.add_unwind_argument(parser)
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="the HTML report, 0600 (default pgprobe-triage-<time>.html here; '-': stdout)",
    )
    parser.set_defaults(run=run, kernel=False)


def run(ns: argparse.Namespace) -> int:
    output = _output_path(ns)
    targets = common.prepare(ns, lambda _targets: None, OBJECTS)
    if targets.cluster.conninfo is None:
        raise PgprobeError("triage needs a connection to PostgreSQL (-h/-p/-U)", EXIT_USAGE)
    # the report's templates compiled in the background while the window runs
    doc = capture_window(ns, targets, starters(ns, targets), meanwhile=report.warm)
    profile = doc.pop("_profile", None)
    flame_svg = None
    if profile is not None:
        flame_svg = flamegraph.render_svg(
            doc["flame"]["folded"],
            title=flame.default_title(profile),
            subtitle=profile.facts(),
            module_of=flame.module_classifier(set()),
        )
    doc["findings"] = findings_json(doc)
    if ns.json:
        print(json.dumps(doc))
    html = report.render_html(doc, flame_svg)
    if output is None:  # -o -: stdout holds the report, stderr its warnings
        outfile.write(None, html)
        for warning in doc["meta"]["warnings"]:
            common.warn(warning)
        return 0
    try:
        # Private (0600): query texts, role, database and application names.
        outfile.write(output, html, private=True)
    except PgprobeError as exc:
        # The findings are not lost with the file: the JSON is out already, or the summary.
        if ns.json:
            kept = "the whole document is in the JSON on stdout"
        else:
            view.print_summary(doc, None)
            kept = "the summary above is what is kept"
        raise PgprobeError(f"{exc.message}; {kept}", exc.exit_code) from None
    if not ns.json:
        view.print_summary(doc, output)
    else:
        print(f"pgprobe: report written to {output}", file=sys.stderr)
    return 0


def _output_path(ns: argparse.Namespace) -> Path | None:
    """Where the report goes (None: stdout), checked before the capture."""
    if ns.output == "-":
        if ns.json or sys.stdout.isatty():
            why = "with --json, stdout holds the JSON" if ns.json else "stdout is a terminal"
            raise PgprobeError(f"-o -: {why}: give -o FILE", EXIT_USAGE)
        return None
    if ns.output:
        outfile.check(ns.output, "-o")
        return Path(ns.output)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(f"pgprobe-triage-{stamp}.html")


def waits_part(ns: argparse.Namespace, targets: Targets) -> parts.Part:
    """The time model (bpf/waits.bt) over the window, as `pgprobe waits` takes it."""
    waits_probe.check_server(targets)
    cluster = targets.cluster
    where = address.find(cluster.postmaster_pid, cluster.binary)
    runs_before = waits_targets.run_counts(waits_targets.watched(targets))
    discovered = waits_targets.identities(runs_before)
    args = waits_probe.script_args(targets, where, None)
    dimension = _query_dimension(ns, targets, where)
    locks = _lock_dimension(ns, targets, where)
    capture = waits_probe.capture(ns, args, query=dimension, locks=locks)
    # who blocked whom: pg_locks sampled while someone waits, from now to the section
    sampler = LockSampler(cluster.conninfo) if locks and cluster.conninfo else None
    if sampler is not None:
        sampler.start()

    lwlock_table = _lwlocks_from_model(ns, targets)

    def section(snapshot: Snapshot, info: RunInfo) -> dict[str, Any]:
        slept_in = waits_targets.asleep_all_along(targets, runs_before)
        alive = waits_targets.present(discovered)
        procs = waits_records.records(snapshot, alive, waits_targets.ours(targets), slept_in)
        if not targets.whole_cluster:
            procs = [p for p in procs if p.pid in targets.pids]
        start, end = waits_records.window(snapshot)
        meta = common.meta(
            targets,
            info,
            snapshot,
            window_s=round((end - start) / 1e9, 6),
            processes=len(procs),
            process_seconds=round(sum(p.wall_ns for p in procs) / 1e9, 6),
            exited_pids=[p.pid for p in procs if p.exited],
            wait_event_address=hex(where.address),
            asleep_all_along_pids=sorted(slept_in),
            missed_runs=info.missed_runs,
            unseen_events=waits_records.unseen(snapshot),
        )
        describe = waits_targets.describe(targets)
        out = records.time_model_section(procs, targets.cluster.major, describe, meta)
        out["_lost"] = sum(meta["unseen_events"].values())  # counted in meta.losses
        keep = waits_targets.counted(targets)
        if "query_ns" in snapshot.maps and dimension is not None:
            charged = query_records.charges(snapshot)
            rows = query_records.statements(cluster.major, charged, keep)
            split = query_records.spanned_ns(charged, keep)
            out["statements"] = query_records.section(rows, cluster.major, end - start, split)
            out["statements"]["query_ids"] = not dimension.text_hash
        if "lock_ns" in snapshot.maps:
            out["locks"] = _locks_section(snapshot, procs, targets, sampler)
        if lwlock_table:
            out["_also"] = {"lwlocks": _lwlocks_section(snapshot, info, targets)}
        return out

    return parts.Part("waits", capture, section, late=True)


def _lwlocks_from_model(ns: argparse.Namespace, targets: Targets) -> bool:
    """Whether the LWLock table comes from the time model (lwlocks' default source: it
    costs per context switch, not per wait; no LWLock probes, unguarded, on a busy server)
    rather than from its own USDT capture (13, DTrace: the lwlocks part)."""
    if lwlocks.wanted_source(ns, targets) != "sched":
        return False
    try:
        waits_probe.check_server(targets)  # the time model runs here
    except PgprobeError:
        return False
    return True


def _lwlocks_section(snapshot: Snapshot, info: RunInfo, targets: Targets) -> dict[str, Any]:
    """`pgprobe lwlocks`' document from the time model's LWLock sleeps (each with the
    runqueue time after it where measured); the mode is not read here (unknown)."""
    recs = lwlocks.sleep_records(snapshot, targets.cluster.major, clipped=False)
    meta = common.meta(targets, info, snapshot, source=lwlocks.SCHED,
                       **lwlocks.sched_meta(snapshot, modes_read=False))  # fmt: skip
    return {"meta": meta, "rows": [r.as_json() for r in lwlocks.rows(recs, targets, False)]}


def starters(ns: argparse.Namespace, targets: Targets) -> list[tuple[str, parts.Starter]]:
    """The parts this triage runs: the LWLock probes only where the time model's sleeps
    are not the LWLock table."""
    if not _lwlocks_from_model(ns, targets):
        return STARTERS
    return [(name, start) for name, start in STARTERS if name != "lwlocks"]


def _query_dimension(
    ns: argparse.Namespace, targets: Targets, where: address.WaitEventAddress
) -> querydim.Dimension | None:
    """The time model keyed by statement too, where the compiled object runs and the
    server's statements can be read (else the report says so in its statements part)."""
    cluster = targets.cluster
    found = statement.address_of(where, cluster.major)
    if found is None or compiled.why_not(ns) is not None or cluster.conninfo is None:
        return None
    try:
        with discover.connect_conninfo(cluster.conninfo) as conn:
            ids = statements.query_ids(conn)
    except PgprobeError:
        return None
    return querydim.Dimension(found, not ids.computed, cluster.binary)


def _locks_section(
    snapshot: Snapshot,
    procs: list[waits_records.ProcessTime],
    targets: Targets,
    sampler: LockSampler | None,
) -> dict[str, Any]:
    """The time model's `locks`: the locks its Lock rows waited on and the blocking trees
    (pgprobe locks' rows and meta.blocking)."""
    cluster, keep = targets.cluster, waits_targets.counted(targets)
    waits = locks_records.lock_waits(snapshot, keep)
    model = locks_records.model_lock_ns(p for p in procs if keep(p.pid))
    names = relnames.read_conninfo(cluster.conninfo, *locks_records.oids(waits, cluster.major))
    not_read = locks_records.not_read_ns(waits, model)
    blocking = None
    if sampler is not None:
        sampler.stop()
        trees = locks_trees.window_trees(sampler.samples, waits)
        lock_of = locks_records.lock_of(waits, lambda t: locks_records.label(t, cluster.major,
                                                                              names))  # fmt: skip
        blocking = {**locks_trees.as_json(trees, lock_of), "error": sampler.error}
    return locks_records.section(waits, cluster.major, names, not_read, blocking)


def _lock_dimension(
    ns: argparse.Namespace, targets: Targets, where: address.WaitEventAddress
) -> lockdim.Dimension | None:
    """Each Lock sleep keyed by its lock too, where the compiled object runs."""
    found = lockwait.find(where, targets.cluster.major)
    if found is None or compiled.why_not(ns) is not None:
        return None
    return lockdim.Dimension(found)


# The parts' objects (the LWLock probes' for 13, which has no time model): where they all
# load, triage needs no bpftrace.
OBJECTS = (compiled.OBJECT, profile_compiled.OBJECT, slru_compiled.OBJECT, lwlock_compiled.OBJECT)
# The parts, the time model first (its section comes first in the report).
STARTERS: list[tuple[str, parts.Starter]] = [
    ("waits", waits_part),
    ("profile", parts.profile_part),
    ("lwlocks", parts.lwlocks_part),
    ("clog_reads", parts.clog_part),
]
