"""`pgprobe lwlocks`: LWLock wait time per tranche and mode (bpf/lwlock_wait.bt).

Long because both sources (USDT waits, scheduler sleeps) share its rows (see below).

The kernel times every wait and keeps, per (pid, tranche, mode), the count, the
total, the max and a log2 histogram; this module turns those into rows sorted
by total wait time, with percentiles estimated from the histogram.

On a build without USDT probes (or with --source sched) it falls back to
`pgprobe waits`' capture (bpf/waits.bt, PostgreSQL 14+): the LWLock-class
entries of its per-(pid, wait_event_info) sleeps, in the same rows. Those are
sleeps (switch-out to wakeup), not waits: a wait also spins and queues before
it sleeps and runs again after its wakeup, so the sleep time is a bit lower;
the mode is unknown. The title and meta.source say which one was measured.

(A little over 400 lines: both sources share the records, rows and table here;
the split into a tools/lwlocks/ package of issue 12 is a move of its own.)
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgprobe import histogram, usdt, waitevents
from pgprobe.discover import Targets
from pgprobe.engines.base import Capture, KeyKind, Log2Hist, MapSpec, RunInfo, Snapshot, Stats
from pgprobe.errors import EXIT_ENV, EXIT_USAGE, PgprobeError
from pgprobe.render import table
from pgprobe.tools import common
from pgprobe.tools.waits import probe as waits_probe
from pgprobe.tools.waits import records as waits_records
from pgprobe.waitevents import address

NAME = "lwlocks"
SCRIPT = "lwlock_wait"  # bpf/lwlock_wait.bt, d/lwlock_wait.d
PROBES = ("lwlock__wait__start", "lwlock__wait__done")
MIN_MAJOR = 13  # names in the probe equal pg_stat_activity's wait_event from 13 on

KEY: tuple[KeyKind, ...] = ("int", "str", "str")  # pid (0 unless keyed by pid), tranche, mode
MAPS = (
    MapSpec("wait_stats", KEY),
    MapSpec("wait_max_ns", KEY, combine="max"),
    MapSpec("wait_ns", KEY),
    MapSpec("wait_unfinished", ()),
)
# Unfinished waits beyond this and beyond 5 % of the waits: the done probe missed some.
UNFINISHED_MIN = 10
UNFINISHED_SHARE = 0.05
# Where the figures come from: the LWLock wait probes, or the scheduler (sleeps).
USDT, SCHED = "usdt", "sched_switch"
SLEEPS_TITLE = "LWLock sleeps (from the scheduler: sleeps, not waits; mode unknown)"


@dataclass(frozen=True)
class WaitRecord:
    """What the kernel aggregated for one (pid, tranche, mode)."""

    pid: int
    tranche: str
    mode: str
    waits: int
    total_ns: int
    max_ns: int
    hist: Log2Hist


@dataclass(frozen=True)
class WaitRow:
    """One line of the table (and one JSON row)."""

    tranche: str
    mode: str
    waits: int
    total_ns: int
    max_ns: int
    hist: Log2Hist
    share: float  # of all wait time in the snapshot, 0..1
    pid: int | None = None
    backend_type: str = ""
    application_name: str = ""

    def percentile_us(self, fraction: float) -> float:
        return histogram.percentile(self.hist, fraction, self.max_ns) / 1000

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {}
        if self.pid is not None:
            row.update(
                pid=self.pid,
                backend_type=self.backend_type,
                application_name=self.application_name,
            )
        row.update(
            tranche=self.tranche,
            mode=self.mode,
            waits=self.waits,
            total_us=round(self.total_ns / 1000, 3),
            avg_us=round(self.total_ns / self.waits / 1000, 3) if self.waits else 0.0,
            p50_us=round(self.percentile_us(0.50), 3),
            p95_us=round(self.percentile_us(0.95), 3),
            p99_us=round(self.percentile_us(0.99), 3),
            max_us=round(self.max_ns / 1000, 3),
            share_pct=round(100 * self.share, 2),
        )
        return row


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="LWLock waits per tranche and mode",
        description="Time every LWLock wait of the targets and show a table per tranche "
        "and mode, sorted by total wait time.",
    )
    common.add_tracing_arguments(parser, default_duration=10)
    parser.add_argument(
        "--by", choices=["pid"], help="one row per backend as well (pid, type, application)"
    )
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
        help="usdt: time each wait with the LWLock probes (a build with --enable-dtrace); "
        "sched: time each sleep in an LWLock from the scheduler (any 14+ build; sleeps, "
        "not waits; mode unknown); auto (default): usdt when the server has the probes",
    )
    parser.set_defaults(run=run)


def pick_source(ns: argparse.Namespace, targets: Targets) -> str:
    """USDT or SCHED for this server, as asked (--source) or as available (auto)."""
    cluster = targets.cluster
    wanted = getattr(ns, "source", "auto")
    if wanted == "auto":
        present = usdt.probe_names(cluster.binary)
        with_probes = all((usdt.PROVIDER, name) in present for name in PROBES)
        old = bool(cluster.version_num) and cluster.major < min(waitevents.MAJORS)
        wanted = "usdt" if with_probes or old else "sched"
        if wanted == "sched":
            print(
                f"pgprobe: note: {cluster.binary} has no LWLock USDT probes: showing LWLock "
                "sleeps from the scheduler instead (sleeps, not waits; mode unknown)",
                file=sys.stderr,
            )
    if wanted == "usdt":
        check_server(targets)
        return USDT
    if getattr(ns, "engine", "auto") == "dtrace":
        raise PgprobeError(
            "lwlocks --source sched needs bpftrace (no DTrace twin of bpf/waits.bt yet)",
            EXIT_USAGE,
        )
    waits_probe.check_server(targets)
    return SCHED


def check_server(targets: Targets) -> None:
    cluster = targets.cluster
    if cluster.version_num and cluster.major < MIN_MAJOR:
        raise PgprobeError(
            f"lwlocks supports PostgreSQL {MIN_MAJOR} and later; this server is "
            f"{cluster.version}: before 13 the lwlock__wait__start probe names individual "
            "locks 'main' (11-12) or passes a tranche number (10 and older)",
            EXIT_ENV,
        )
    usdt.require(cluster.binary, PROBES)
    for foreign in usdt.foreign_uprobes(cluster.binary, PROBES):
        print(f"pgprobe: warning: {foreign.describe()}", file=sys.stderr)


def script_args(targets: Targets, by_pid: bool, interval: int | None) -> list[int | Path]:
    """$1 binary, $2 postmaster, $3 key by pid, $4 interval, $5 single pid."""
    cluster = targets.cluster
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    # A subset of several pids is filtered here in Python, from per-pid keys.
    key_by_pid = by_pid or (not targets.whole_cluster and not single)
    return [Path(cluster.binary), cluster.postmaster_pid, int(key_by_pid), interval or 0, single]


def unmatched_warning(snapshot: Snapshot) -> str | None:
    """Waits that started and never ended in the probe: a site that did not attach.

    Every lwlock__wait__start is followed by an lwlock__wait__done in the same
    backend. A backend caught mid-wait when the probes attach leaves one
    unfinished wait at most; many more mean the done probe is not attached
    everywhere (e.g. another uprobe without the USDT semaphore on one of its
    sites): those waits are missing from the table, so say it.
    """
    unfinished = snapshot.get("wait_unfinished").get((), 0)
    assert isinstance(unfinished, int)
    waits = sum(v.count for v in snapshot.get("wait_stats").values() if isinstance(v, Stats))
    never_done = waits == 0 and unfinished > 1  # the done probe never fired at all
    many = unfinished > UNFINISHED_MIN and unfinished > UNFINISHED_SHARE * (waits + unfinished)
    if not (never_done or many):
        return None
    return (
        f"{unfinished:,} LWLock waits started and never ended in the probe "
        f"(lwlock__wait__done fired for {waits:,}): they are missing from the table; a probe "
        "site did not attach or stopped firing (`pgprobe doctor` lists other uprobes on the "
        "server's probe sites)"
    )


def sleeps_warning(snapshot: Snapshot) -> str | None:
    """Scheduler events bpf/waits.bt knows it missed (the sleeps' figures are short)."""
    lost = waits_records.unseen(snapshot)
    if not any(lost.values()):
        return None
    return (
        f"scheduler events lost: {lost['switch_in']} switch-ins and {lost['wakeup']} "
        "wakeups (those sleeps are missing or include their runqueue time)"
    )


def records(snapshot: Snapshot) -> list[WaitRecord]:
    stats, maxes, hists = (snapshot.get(m.name) for m in MAPS[:3])
    out = []
    for key, value in stats.items():
        assert isinstance(value, Stats)
        pid, tranche, mode = key
        max_ns = maxes.get(key, 0)
        hist = hists.get(key, Log2Hist(()))
        assert isinstance(max_ns, int) and isinstance(hist, Log2Hist)
        assert isinstance(pid, int) and isinstance(tranche, str) and isinstance(mode, str)
        out.append(WaitRecord(pid, tranche, mode, value.count, value.total, max_ns, hist))
    return out


def sleep_records(snapshot: Snapshot, major: int, clipped: bool) -> list[WaitRecord]:
    """The LWLock-class sleeps of a bpf/waits.bt snapshot, as WaitRecords (mode unknown).

    waits = complete sleeps (the histogram's count); total = the sleep time
    charged in the window; max = the top bound of the highest histogram
    bucket (waits.bt keeps no exact max): an upper bound within 2x, and at
    most the total unless `clipped` (with --interval a sleep that began in an
    earlier window is longer than the time charged to this one).
    """
    classes = waitevents.table(major)["classes"]
    lwlock_class = next(int(c) for c, name in classes.items() if name == "LWLock")
    hists = snapshot.get("wait_hist")
    out = []
    for key, total in snapshot.get("wait_ns").items():
        tid, wei = key
        assert isinstance(tid, int) and isinstance(wei, int) and isinstance(total, int)
        if wei >> 24 != lwlock_class:
            continue
        hist = hists.get(key, Log2Hist(()))
        assert isinstance(hist, Log2Hist)
        top = max((high for _, high, count in hist.buckets if count), default=0)
        top = top if clipped else min(top, total)
        tranche = waitevents.name(major, wei)[1]
        out.append(WaitRecord(tid, tranche, "unknown", hist.count, total, top, hist))
    return out


def rows(recs: Iterable[WaitRecord], targets: Targets, by_pid: bool) -> list[WaitRow]:
    """Records of the targets, grouped per (tranche, mode) or per (pid, tranche, mode)."""
    wanted = None if targets.whole_cluster else set(targets.pids)
    groups: dict[tuple[int | None, str, str], list[WaitRecord]] = defaultdict(list)
    for rec in recs:
        if wanted is not None and rec.pid and rec.pid not in wanted:
            continue
        groups[(rec.pid if by_pid else None, rec.tranche, rec.mode)].append(rec)
    grand_total = sum(r.total_ns for group in groups.values() for r in group)
    out = []
    for (pid, tranche, mode), group in groups.items():
        total = sum(r.total_ns for r in group)
        backend = targets.describe(pid) if pid is not None else None
        out.append(
            WaitRow(
                tranche=tranche,
                mode=mode,
                waits=sum(r.waits for r in group),
                total_ns=total,
                max_ns=max(r.max_ns for r in group),
                hist=histogram.merge(r.hist for r in group),
                share=total / grand_total if grand_total else 0.0,
                pid=pid,
                backend_type=backend.backend_type if backend else "",
                application_name=backend.application_name if backend else "",
            )
        )
    out.sort(key=lambda r: (-r.total_ns, r.tranche, r.mode, r.pid or 0))
    return out


COLUMNS = [
    table.Column("tranche", "TRANCHE"),
    table.Column("mode", "MODE"),
    table.Column("waits", "WAITS", numeric=True),
    table.Column("total_ms", "TOTAL ms", numeric=True),
    table.Column("avg_us", "AVG us", numeric=True),
    table.Column("p50_us", "P50 us", numeric=True),
    table.Column("p95_us", "P95 us", numeric=True),
    table.Column("p99_us", "P99 us", numeric=True),
    table.Column("max_us", "MAX us", numeric=True),
    table.Column("share_pct", "SHARE", numeric=True),
]
PID_COLUMNS = [
    table.Column("pid", "PID", numeric=True),
    table.Column("backend_type", "BACKEND TYPE"),
    table.Column("application_name", "APPLICATION"),
]


def table_cells(row: WaitRow) -> dict[str, str]:
    data = row.as_json()
    cells = {
        "tranche": row.tranche,
        "mode": row.mode,
        "waits": f"{row.waits:,}",
        "total_ms": f"{row.total_ns / 1e6:,.3f}",
        "avg_us": f"{data['avg_us']:,.1f}",
        "p50_us": f"{data['p50_us']:,.1f}",
        "p95_us": f"{data['p95_us']:,.1f}",
        "p99_us": f"{data['p99_us']:,.1f}",
        "max_us": f"{data['max_us']:,.1f}",
        "share_pct": f"{data['share_pct']:.1f}%",
    }
    if row.pid is not None:
        cells.update(
            pid=str(row.pid),
            backend_type=row.backend_type,
            application_name=row.application_name,
        )
    return cells


def start_sleeps(ns: argparse.Namespace, targets: Targets, interval: int | None) -> Capture:
    """bpf/waits.bt for the targets (the SCHED source), ready to run."""
    cluster = targets.cluster
    where = address.find(cluster.postmaster_pid, cluster.binary)
    args = waits_probe.script_args(targets, where, interval)
    return common.capture(ns, waits_probe.SCRIPT, args, waits_probe.MAPS, env=waits_probe.ENV)


def start(ns: argparse.Namespace, targets: Targets, by_pid: bool, interval: int | None) -> Capture:
    """lwlock_wait for the targets, ready to run (iterate its events)."""
    return common.capture(
        ns,
        SCRIPT,
        script_args(targets, by_pid, interval),
        MAPS,
        env={"BPFTRACE_MAP_KEYS_MAX": str(65536 if by_pid else 16384)},
        cluster_pid=targets.cluster.postmaster_pid,
    )


def run(ns: argparse.Namespace) -> int:
    by_pid = ns.by == "pid"
    if ns.interval and ns.interval > ns.duration:
        raise PgprobeError(
            f"--interval {ns.interval} is longer than the duration ({ns.duration:g} s)",
            EXIT_USAGE,
        )
    sources: list[str] = []
    targets = common.prepare(ns, lambda t: sources.append(pick_source(ns, t)))
    source = sources[0]
    if source == SCHED:
        capture = start_sleeps(ns, targets, ns.interval)
    else:
        capture = start(ns, targets, by_pid, ns.interval)
    what = "LWLock sleeps" if source == SCHED else "LWLock waits"
    for snapshot, info in common.snapshots(capture, ns, what):
        common.refresh_if_needed(targets, by_pid and snapshot.final)
        if source == SCHED:
            recs = sleep_records(snapshot, targets.cluster.major, bool(ns.interval))
        else:
            recs = records(snapshot)
        result = rows(recs, targets, by_pid)
        emit(ns, result, snapshot, info, targets, by_pid, source)
    return 0


def emit(
    ns: argparse.Namespace,
    result: list[WaitRow],
    snapshot: Snapshot,
    info: RunInfo,
    targets: Targets,
    by_pid: bool,
    source: str = USDT,
) -> None:
    warning = unmatched_warning(snapshot) if source == USDT else sleeps_warning(snapshot)
    if warning and warning not in info.warnings:
        info.warnings.append(warning)
    extra: dict[str, Any] = {"source": source}
    if source == SCHED:
        extra.update(measures="sleeps", mode="unknown", title=SLEEPS_TITLE)
    meta = common.meta(targets, info, snapshot, interval=ns.interval, **extra)
    if ns.json:
        common.print_json(NAME, meta, [r.as_json() for r in result])
        if info.ended_early and snapshot.final:  # meta says it too; a script's log should
            common.print_losses(RunInfo(ended_early=info.ended_early))
        return
    columns = (PID_COLUMNS if by_pid else []) + COLUMNS
    title = common.title(SLEEPS_TITLE if source == SCHED else "LWLock waits", meta)
    noun = "sleeps" if source == SCHED else "waits"
    empty = f"no LWLock {noun} in {meta['duration_s']:.1f} s" + (
        " (nothing contended, or the targets were idle)" if not ns.interval else ""
    )
    table.render(title, columns, [table_cells(r) for r in result], empty=empty)
    common.print_losses(info)
