"""`pgprobe triage`: everything pgprobe knows about N seconds, in one HTML report.

Long because the edges of every part's window meet here (see below).

Over the same window: CPU samples (flame graph, hot functions), LWLock waits,
SLRU reads, pg_stat_activity sampled every second, and the deltas of
PostgreSQL's cumulative views. The captures run as parallel bpftrace
processes, each in a thread of ours; a part that cannot run here (an old
server, no USDT probes) is left out with the reason, and the others go on.
Findings (pgprobe.findings) come first in the report, then the evidence.

Over 400 lines: the window's edges (the parts, the SQL readings when probes
start and stop counting, the server going away) are one story and stay together.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from pgprobe import discover, pgstats
from pgprobe.discover import Targets
from pgprobe.engines.base import Capture, RunInfo, Snapshot
from pgprobe.errors import EXIT_TRACER, EXIT_USAGE, PgprobeError
from pgprobe.tools import clog_reads, common, lwlocks, profiling

NAME = "triage"
DEFAULT_DURATION_S = 30.0
TOP_FUNCTIONS = 30


@dataclass
class Part:
    """One capture of the triage window and how its result becomes a document section."""

    name: str
    capture: Capture
    section: Callable[[Snapshot, RunInfo], dict[str, Any]]
    final: tuple[Snapshot, RunInfo] | None = None
    error: str | None = None
    thread: threading.Thread | None = field(default=None, repr=False)

    def run(self) -> None:
        try:
            for event in self.capture.events():
                if isinstance(event, Snapshot) and event.final:
                    self.final = (event, self.capture.info)
        except PgprobeError as exc:
            self.error = exc.message


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="everything at once over N seconds, as one HTML report",
        description="Capture CPU samples, LWLock waits, SLRU reads and PostgreSQL's own "
        "statistics over the same window, and write a self-contained HTML report with "
        "findings first.",
    )
    common.add_tracing_arguments(parser, default_duration=DEFAULT_DURATION_S)
    parser.add_argument(
        "-F",
        "--hz",
        type=profiling.hz_value,
        default=profiling.DEFAULT_HZ,
        help=f"CPU sampling rate (default {profiling.DEFAULT_HZ})",
    )
    profiling.add_unwind_argument(parser)
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="the HTML report (default pgprobe-triage-<time>.html here)",
    )
    parser.set_defaults(run=run, kernel=False)


def run(ns: argparse.Namespace) -> int:
    output = _output_path(ns)
    targets = common.prepare(ns, lambda _targets: None)
    if targets.cluster.conninfo is None:
        raise PgprobeError("triage needs a connection to PostgreSQL (-h/-p/-U)", EXIT_USAGE)
    doc = capture_window(ns, targets)
    flame_svg = doc.pop("_flame_svg", None)
    doc["findings"] = _findings(doc)
    if ns.json:
        print(json.dumps(doc))
    html = _render_html(doc, flame_svg)
    try:
        output.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise PgprobeError(f"cannot write {output}: {exc.strerror or exc}", EXIT_USAGE) from None
    if not ns.json:
        print_summary(doc, output)
    else:
        print(f"pgprobe: report written to {output}", file=sys.stderr)
    return 0


def _output_path(ns: argparse.Namespace) -> Path:
    if ns.output:
        path = Path(ns.output)
        if path.is_dir() or not path.parent.exists():
            raise PgprobeError(f"cannot write the report to {ns.output}", EXIT_USAGE)
        return path
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(f"pgprobe-triage-{stamp}.html")


# -- the window ------------------------------------------------------------------------------


def start_parts(ns: argparse.Namespace, targets: Targets, warnings: list[str]) -> list[Part]:
    """The captures that can run against this server; the reason for each that cannot."""
    parts = []
    starters: list[tuple[str, Callable[[], Part]]] = [
        ("profile", lambda: _profile_part(ns, targets)),
        ("lwlocks", lambda: _lwlocks_part(ns, targets)),
        ("clog_reads", lambda: _clog_part(ns, targets)),
    ]
    for name, starter in starters:
        try:
            parts.append(starter())
        except PgprobeError as exc:
            warnings.append(f"{name} left out: {exc.message}")
    if not parts:
        raise PgprobeError("no capture can run here: " + "; ".join(warnings), EXIT_TRACER)
    return parts


def _lwlocks_part(ns: argparse.Namespace, targets: Targets) -> Part:
    lwlocks.check_server(targets)
    capture = lwlocks.start(ns, targets, by_pid=False, interval=None)

    def section(snapshot: Snapshot, info: RunInfo) -> dict[str, Any]:
        rows = lwlocks.rows(lwlocks.records(snapshot), targets, by_pid=False)
        meta = common.meta(targets, info, snapshot)
        return {"meta": meta, "rows": [r.as_json() for r in rows]}

    return Part("lwlocks", capture, section)


def _profile_part(ns: argparse.Namespace, targets: Targets) -> Part:
    from pgprobe.render import flamegraph
    from pgprobe.tools import flame, hot

    profiling.check_server(targets)
    profile_run = profiling.start(ns, targets)

    def section(snapshot: Snapshot, info: RunInfo) -> dict[str, Any]:
        profile = profile_run.finish(snapshot, info)
        rows = hot.hot_rows(profile.stacks, by_module=False)[:TOP_FUNCTIONS]
        folded = profile.folded()
        svg = flamegraph.render_svg(
            folded,
            title=flame.default_title(profile),
            subtitle=profile.facts(),
            module_of=flame.module_classifier(set()),
        )
        return {
            "hot": {"meta": profile.meta(), "rows": [r.as_json() for r in rows]},
            "flame": {"folded": folded, "samples": profile.samples},
            "_flame_svg": svg,
            "_unresolved_pct": round(profile.unresolved_pct, 2),
            "_lost": profile.lost_samples,
        }

    return Part("profile", profile_run.capture, section)


def _clog_part(ns: argparse.Namespace, targets: Targets) -> Part:
    clog_reads.check_server(targets)
    major = targets.cluster.major if targets.cluster.version_num else 99
    slrus = clog_reads.selected_slrus([("all",)], major)
    capture = clog_reads.start(ns, targets, slrus, clog_reads.MODE_AGGREGATE, None)
    wanted = None if targets.whole_cluster else set(targets.pids)

    def section(snapshot: Snapshot, info: RunInfo) -> dict[str, Any]:
        recs = [r for r in clog_reads.records(snapshot) if wanted is None or r.pid in wanted]
        rows = clog_reads.group_rows(recs, by="file", describe=targets.describe)
        return {"meta": common.meta(targets, info, snapshot), "rows": [r.as_json() for r in rows]}

    return Part("clog_reads", capture, section)


def capture_window(ns: argparse.Namespace, targets: Targets) -> dict[str, Any]:
    cluster = targets.cluster
    conninfo = cluster.conninfo
    assert conninfo is not None
    warnings: list[str] = []
    parts = start_parts(ns, targets, warnings)
    sampler = pgstats.ActivitySampler(conninfo, keep_counters=True)
    window: dict[str, Any] = {"before": None, "max_connections": None}

    def on_attached() -> None:
        # The SQL window opens when the probes are in, so both see the same seconds.
        window["started_at"] = dt.datetime.now(dt.timezone.utc)
        try:
            with discover.connect_conninfo(conninfo) as conn:
                window["before"] = pgstats.read_counters(conn)
                window["max_connections"] = _setting(conn, "max_connections")
        except Exception as exc:  # noqa: BLE001 - the server went away: the probes go on
            window["lost"] = _reason(exc)
            return
        sampler.start()

    def on_edge(edge: str) -> None:
        # pg_stat_slru beside the SLRU capture: read when its probes start and stop counting.
        try:
            with discover.connect_conninfo(conninfo) as conn:
                window[edge] = pgstats.read_counters(conn)
        except Exception:  # noqa: BLE001 - the server went away: said by the window's close
            return

    _run_parts(parts, ns.duration, on_attached, on_edge)
    if "started_at" not in window:  # stopped before every probe was in
        on_attached()
    if sampler.is_alive():
        sampler.stop()
    before, started_at = window["before"], window["started_at"]
    after, gone = _close_window(conninfo, before, sampler, window.get("lost"))
    if sampler.error:
        warnings.append(sampler.error)
    doc: dict[str, Any] = {
        "tool": NAME,
        "meta": {},
        "lwlocks": None,
        "clog_reads": None,
        "hot": None,
        "flame": None,
        "activity": sampler.document() if before is not None else None,
        "stats": pgstats.deltas(before, after) if before and after else None,
    }
    if gone is not None:
        warnings.append(
            f"stats, activity: {gone['what']} at {gone['at']}: PostgreSQL's statistics and "
            f"pg_stat_activity cover {gone['sql_window_s']:.1f} s of the window ({gone['reason']})"
        )
    losses: dict[str, int] = {}
    unresolved_pct = 0.0
    for part in parts:
        info = part.capture.info
        if part.final is None:
            why = part.error or info.ended_early or "no output"
            warnings.append(f"{part.name} produced nothing: {why}")
            continue
        snapshot, info = part.final
        section = part.section(snapshot, info)
        losses[part.name] = info.lost_events + info.failed_map_updates + section.pop("_lost", 0)
        if info.ended_early:
            warnings.append(f"{part.name} is partial: {info.ended_early}")
        warnings.extend(f"{part.name}: {w}" for w in info.warnings)
        if part.name == "profile":
            unresolved_pct = section.pop("_unresolved_pct")
            doc.update(section)  # the hot and flame sections, and the SVG for the report
        else:
            doc[part.name] = section
    live, stopped = window.get("clog_live"), window.get("clog_stopped")
    if (
        doc["stats"] is not None
        and live
        and stopped
        and live.server_started == stopped.server_started
    ):
        # pg_stat_slru over the SLRU capture's own window (its probes' start and stop)
        doc["stats"]["slru"] = pgstats.slru_deltas(live.slru, stopped.slru)
        window["slru_window_s"] = round(stopped.taken_at - live.taken_at, 3)
    if doc["clog_reads"] is not None and doc["stats"] is not None:
        # the same window's pg_stat_slru, beside the probe's reads
        doc["clog_reads"]["meta"]["slru_stats"] = doc["stats"]["slru"]
    doc["meta"] = _meta(ns, targets, parts, started_at, window["max_connections"], losses, warnings)
    doc["meta"]["unresolved_pct"] = unresolved_pct
    doc["meta"]["server_went_away"] = gone
    doc["meta"]["slru_stats_window_s"] = window.get("slru_window_s")
    return doc


def _reason(exc: BaseException) -> str:
    return exc.message if isinstance(exc, PgprobeError) else pgstats.first_line(exc)


def _close_window(
    conninfo: str,
    before: pgstats.Counters | None,
    sampler: pgstats.ActivitySampler,
    lost: str | None,
) -> tuple[pgstats.Counters | None, dict[str, Any] | None]:
    """The counters that close the SQL window, and what happened if the server went away.

    Normally a fresh reading now. If the server stopped, crashed or restarted
    during the capture (no answer now, or another pg_postmaster_start_time), the
    window is cut at the sampler's last good reading, and `gone` says so.
    """
    if before is None:
        return None, _gone("the server went away", before, None, lost or "not reachable")
    try:
        with discover.connect_conninfo(conninfo) as conn:
            now = pgstats.read_counters(conn)
    except Exception as exc:  # noqa: BLE001
        return sampler.last_counters, _gone(
            "the server stopped", before, sampler, sampler.error or _reason(exc)
        )
    if now.server_started != before.server_started:
        return sampler.last_counters, _gone(
            "the server restarted",
            before,
            sampler,
            f"it started again at {now.server_started}, counters reset",
        )
    return now, None


def _gone(
    what: str,
    before: pgstats.Counters | None,
    sampler: pgstats.ActivitySampler | None,
    reason: str,
) -> dict[str, Any]:
    """meta.server_went_away: when the SQL side lost the server, and how much it kept."""
    lost_at = sampler.lost_at if sampler is not None and sampler.lost_at else time.monotonic()
    wall = dt.datetime.now() - dt.timedelta(seconds=time.monotonic() - lost_at)
    last = sampler.last_counters if sampler is not None else None
    kept = last.taken_at - before.taken_at if last is not None and before is not None else 0.0
    return {
        "what": what,
        "at": wall.strftime("%H:%M:%S"),
        "sql_window_s": round(kept, 3),
        "reason": reason,
    }


def _setting(conn: Any, name: str) -> int | None:
    with conn.cursor() as cur:
        cur.execute("SELECT setting FROM pg_settings WHERE name = %s", (name,))
        row = cur.fetchone()
    return int(row[0]) if row else None


def _run_parts(
    parts: list[Part],
    duration: float,
    on_attached: Callable[[], None],
    on_edge: Callable[[str], None] = lambda edge: None,
) -> None:
    """Run every capture in its own thread; Ctrl-C / SIGTERM stop them all, data kept.

    on_attached is called once every capture has its probes in (or has ended);
    on_edge("clog_live") and on_edge("clog_stopped") when the SLRU capture starts
    and stops counting (within the 0.1 s of this loop), for its pg_stat_slru window.
    """
    edges: set[str] = set()
    for part in parts:
        part.thread = threading.Thread(target=part.run, name=part.name, daemon=True)
        part.thread.start()

    def stop_all(signum: int, frame: FrameType | None) -> None:
        for part in parts:
            part.capture.request_stop()

    def running(part: Part) -> bool:
        return part.thread is not None and part.thread.is_alive()

    old = {sig: signal.signal(sig, stop_all) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with common.Countdown("triage (CPU, LWLocks, SLRU, SQL)", duration) as countdown:
            attached_at: float | None = None
            while any(running(p) for p in parts):
                for p in parts:
                    info = p.capture.info
                    for edge, reached in (("clog_live", info.probes_attached),
                                          ("clog_stopped", info.stopped_counting)):  # fmt: skip
                        if p.name == "clog_reads" and reached and edge not in edges:
                            edges.add(edge)
                            on_edge(edge)
                if attached_at is None and all(
                    p.capture.info.probes_attached or not running(p) for p in parts
                ):
                    attached_at = time.monotonic()
                    on_attached()
                if attached_at is not None:
                    left = max(0.0, duration - (time.monotonic() - attached_at))
                    countdown.tick(parts[0].capture.info, left)
                time.sleep(0.1)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _meta(
    ns: argparse.Namespace,
    targets: Targets,
    parts: list[Part],
    started_at: dt.datetime,
    max_connections: int | None,
    losses: dict[str, int],
    warnings: list[str],
) -> dict[str, Any]:
    cluster = targets.cluster
    infos = [p.capture.info for p in parts]
    return {
        "host": socket.gethostname(),
        "postgres_version": cluster.version,
        "postgres_version_num": cluster.version_num,
        "postmaster_pid": cluster.postmaster_pid,
        "data_directory": cluster.data_directory,
        "server_binary": cluster.binary,
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(max((i.duration_seconds for i in infos), default=0.0), 3),
        "target": "cluster" if targets.whole_cluster else "pids",
        "pids": targets.pids,
        "engine": infos[0].engine if infos else "",
        "engine_version": infos[0].engine_version if infos else "",
        "hz": ns.hz,
        "losses": losses,
        "max_connections": max_connections,
        "interrupted": any(i.interrupted for i in infos),
        "parts": [p.name for p in parts if p.final is not None],
        "warnings": warnings,
    }


# -- findings and output ---------------------------------------------------------------------


def _findings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    from pgprobe import findings

    return [f.as_json() for f in findings.evaluate(doc)]


def _render_html(doc: dict[str, Any], flame_svg: str | None) -> str:
    from pgprobe.render import report

    return report.render_html(doc, flame_svg)


def print_summary(doc: dict[str, Any], output: Path) -> None:
    meta = doc["meta"]
    print(
        f"pgprobe triage: {meta['duration_s']:.0f} s of PostgreSQL "
        f"{meta['postgres_version'].split()[0]} (postmaster {meta['postmaster_pid']})"
    )
    for finding in doc["findings"]:
        print(f"\n[{finding['severity'].upper()}] {finding['title']}")
        if finding.get("evidence"):
            print(f"  evidence: {finding['evidence']}")
        if finding.get("next_step"):
            print(f"  next: {finding['next_step']}")
    for warning in meta["warnings"]:
        print(f"pgprobe: warning: {warning}", file=sys.stderr)
    print(f"\nreport: {output.resolve()}")
