"""The triage window: every part's capture and the SQL readings over the same seconds.

The parts run as parallel tracer processes, each in a thread of ours. The SQL window (the
cumulative statistics, pg_stat_activity sampling) opens once every part has its probes in,
and closes after they stop; pg_stat_slru is read again at the SLRU capture's own edges. If
the server goes away during the capture, the SQL side is cut at its last good reading and
the document says when and why; the probes' data is kept. A part that produced nothing is
said in meta.warnings, and the document is built from the others.
"""

from __future__ import annotations

import argparse
import datetime as dt
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from pgprobe import discover, pgstats
from pgprobe.discover import Targets
from pgprobe.engines.runner import STARTUP_TIMEOUT_S
from pgprobe.errors import PgprobeError
from pgprobe.tools import common
from pgprobe.tools.triage.parts import Part, Starter, start_parts

NAME = "triage"


def capture_window(
    ns: argparse.Namespace,
    targets: Targets,
    starters: Sequence[tuple[str, Starter]],
    meanwhile: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Every part and the SQL readings over one window: the triage document, without findings.
    meanwhile: started when the window opens (work for the end that need not wait for it)."""
    cluster = targets.cluster
    conninfo = cluster.conninfo
    assert conninfo is not None
    warnings: list[str] = []
    parts = start_parts(with_slack(ns), targets, starters, warnings)
    sampler = pgstats.ActivitySampler(conninfo, keep_counters=True)
    texts = pgstats.TextSampler(conninfo)  # the statements' texts, by id and by text key
    window: dict[str, Any] = {"before": None, "max_connections": None}

    def on_attached() -> None:
        # The SQL window opens when the probes are in, so both see the same seconds.
        meanwhile()
        window["started_at"] = dt.datetime.now(dt.timezone.utc)
        try:
            with discover.connect_conninfo(conninfo) as conn:
                window["before"] = pgstats.read_counters(conn)
                window["max_connections"] = _setting(conn, "max_connections")
        except Exception as exc:  # noqa: BLE001 - the server went away: the probes go on
            window["lost"] = _reason(exc)
            return
        sampler.start()
        texts.start()

    def on_edge(edge: str) -> None:
        # pg_stat_slru beside the SLRU capture: read when its probes start and stop counting.
        try:
            with discover.connect_conninfo(conninfo) as conn:
                window[edge] = pgstats.read_counters(conn)
        except Exception:  # noqa: BLE001 - the server went away: said by the window's close
            return

    ran = _run_parts(parts, ns.duration, on_attached, on_edge)
    if "started_at" not in window:  # stopped before every probe was in
        on_attached()
    if sampler.is_alive():
        # Names while pgprobe's own sampler still runs: the time model leaves it out.
        discover.refresh_backends(targets.cluster)
        sampler.stop()
    if texts.is_alive():
        texts.stop()
    before, started_at = window["before"], window["started_at"]
    after, gone = _close_window(conninfo, before, sampler, window.get("lost"))
    if sampler.error:
        warnings.append(sampler.error)
    doc: dict[str, Any] = {
        "tool": NAME,
        "meta": {},
        "waits": None,
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
        # Triage stops every part at the window's end through request_stop, which a tool
        # records as interrupted: only Ctrl-C or SIGTERM interrupt the window (the parts'
        # meta, the flame graph's subtitle).
        info.interrupted = ran.interrupted
        section = part.section(snapshot, info)
        doc.update(section.pop("_also", {}))  # the time model's LWLock table (lwlocks)
        losses[part.name] = info.lost_events + info.failed_map_updates + section.pop("_lost", 0)
        if info.ended_early:
            warnings.append(f"{part.name} is partial: {info.ended_early}")
        warnings.extend(f"{part.name}: {w}" for w in info.warnings)
        if part.name == "profile":
            unresolved_pct = section.pop("_unresolved_pct")
            doc.update(section)  # the hot and flame sections, and the profile for the SVG
        else:
            doc[part.name] = section
    _statement_texts(conninfo, doc, texts, warnings)
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
    doc["meta"] = _meta(
        ns, targets, parts, ran, started_at, window["max_connections"], losses, warnings
    )
    doc["meta"]["unresolved_pct"] = unresolved_pct
    doc["meta"]["server_went_away"] = gone
    doc["meta"]["slru_stats_window_s"] = window.get("slru_window_s")
    return doc


def _statement_texts(
    conninfo: str, doc: dict[str, Any], sampled: pgstats.TextSampler, warnings: list[str]
) -> None:
    """The texts of the statements shown, read once for both parts (pg_stat_statements'
    deltas and the time model's statements): pg_stat_statements' text by query id, else the
    first that pg_stat_activity showed in the window (by id, or by text key)."""
    stats_rows = (doc["stats"] or {}).get("statements") or []
    rows = ((doc.get("waits") or {}).get("statements") or {}).get("rows") or []
    ids = sorted({r["queryid"] for r in stats_rows if r.get("queryid") is not None}
                 | {r["query_id"] for r in rows if r.get("query_id") is not None})  # fmt: skip
    texts: dict[int, str] = {}
    try:
        if ids:
            with discover.connect_conninfo(conninfo) as conn:
                texts = pgstats.statement_texts(conn, ids)
    except Exception as exc:  # noqa: BLE001 - the server went away: ids without texts
        warnings.append(f"stats: statement texts not read ({_reason(exc)})")
    for stat in stats_rows:
        stat["query"] = texts.get(stat.get("queryid"), "")
    for row in rows:
        if row.get("text_key") is not None:
            row["query"] = sampled.by_key.get(row["text_key"], "")
        elif row.get("query_id") is not None:
            qid = row["query_id"]
            row["query"] = texts.get(qid) or sampled.by_id.get(qid, "")


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


@dataclass
class Window:
    """When the parts' common window ran (time.monotonic()), and whether Ctrl-C ended it."""

    opened_at: float | None = None
    closed_at: float | None = None
    interrupted: bool = False

    @property
    def seconds(self) -> float:
        if self.opened_at is None:
            return 0.0
        return (self.closed_at or time.monotonic()) - self.opened_at


def with_slack(ns: argparse.Namespace) -> argparse.Namespace:
    """The options the parts start with: their own timers run longer than the window.

    Each tracer counts its duration from its own attach, and attaching takes from under a
    second to STARTUP_TIMEOUT_S on a loaded machine: timed by themselves, the parts that
    attach first would stop before the last one starts. _run_parts stops them all together
    `duration` after the last attached; their own timer is only a backstop.
    """
    return argparse.Namespace(**{**vars(ns), "duration": ns.duration + STARTUP_TIMEOUT_S})


def _run_parts(
    parts: list[Part],
    duration: float,
    on_attached: Callable[[], None],
    on_edge: Callable[[str], None] = lambda edge: None,
) -> Window:
    """Run every capture in its own thread over one window; Ctrl-C / SIGTERM stop them all,
    data kept.

    The window opens once every capture has its probes in (or has ended), and closes
    `duration` later (or at Ctrl-C), when every capture is asked to stop at once.
    on_attached is called when it opens;
    on_edge("clog_live") and on_edge("clog_stopped") when the SLRU capture starts
    and stops counting (within the 0.1 s of this loop), for its pg_stat_slru window.
    """
    edges: set[str] = set()
    window = Window()

    def check_edges() -> None:
        for p in parts:
            info = p.capture.info
            for edge, reached in (("clog_live", info.probes_attached),
                                  ("clog_stopped", info.stopped_counting)):  # fmt: skip
                if p.name == "clog_reads" and reached and edge not in edges:
                    edges.add(edge)
                    on_edge(edge)

    for part in parts:
        if not part.late:
            part.start()

    def stop_all(signum: int | None = None, frame: FrameType | None = None) -> None:
        if window.closed_at is None:
            window.closed_at = time.monotonic()
            window.interrupted = signum is not None
        for part in parts:
            part.capture.request_stop()

    old = {sig: signal.signal(sig, stop_all) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with common.Countdown(
            "triage (time model, CPU, LWLocks, SLRU, SQL)", duration
        ) as countdown:
            while any(p.running or (p.thread is None and not window.closed_at) for p in parts):
                if all(p.attached_or_ended for p in parts if not p.late):
                    for p in parts:
                        if p.thread is None and not window.closed_at:
                            p.start()
                check_edges()
                if window.opened_at is None and all(p.attached_or_ended for p in parts):
                    window.opened_at = time.monotonic()
                    on_attached()
                if window.opened_at is not None:
                    left = max(0.0, duration - (time.monotonic() - window.opened_at))
                    countdown.tick(parts[0].capture.info, left)
                    if left == 0.0 and window.closed_at is None:
                        stop_all()
                time.sleep(0.1)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    # The SLRU capture may stop counting and end within the loop's last 0.1 s: its edge
    # would be missed, and stats.slru left over the SQL window.
    check_edges()
    if window.closed_at is None:  # every part ended by itself
        window.closed_at = time.monotonic()
    for part in parts:
        if part.thread is None:
            part.error = "stopped before it started (it starts once the others are in)"
    return window


def _meta(
    ns: argparse.Namespace,
    targets: Targets,
    parts: list[Part],
    ran: Window,
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
        "duration_s": round(ran.seconds, 3),  # the common window (each part's: its meta)
        "target": "cluster" if targets.whole_cluster else "pids",
        "pids": targets.pids,
        "engine": infos[0].engine if infos else "",
        "engine_version": infos[0].engine_version if infos else "",
        "hz": ns.hz,
        "losses": losses,
        "max_connections": max_connections,
        "interrupted": ran.interrupted,
        "parts": [p.name for p in parts if p.final is not None],
        "warnings": warnings,
    }
