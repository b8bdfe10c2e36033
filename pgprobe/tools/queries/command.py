"""`pgprobe queries`: the statements ranked by DB time over a window (thin CLI glue)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from pgprobe import discover, waitevents
from pgprobe.discover import Targets
from pgprobe.errors import EXIT_ENV, EXIT_USAGE, PgprobeError
from pgprobe.pgstats import statements as pgss
from pgprobe.tools import common
from pgprobe.tools.queries import records, view
from pgprobe.tools.waits import compiled, probe, querydim
from pgprobe.tools.waits.targets import counted
from pgprobe.waitevents import address, statement

NAME = "queries"
DEFAULT_LIMIT = 20


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="which statements the time goes to: DB time, CPU, waits per query id",
        description="Every part of the backends' time (on CPU, waiting for a CPU, each wait "
        "event) charged to the statement it ran, exactly, from each backend's own status "
        "entry (its query id, as pg_stat_statements shows it; 14+).",
    )
    common.add_tracing_arguments(parser, default_duration=10)
    parser.add_argument("--query-id", type=int, metavar="ID",
                        help="the full time model of one statement")  # fmt: skip
    parser.add_argument(
        "--event",
        metavar="TYPE:NAME",
        help="rank the statements by one wait event (e.g. Lock:transactionid)",
    )
    parser.add_argument("--limit", type=common.bounded(int, 1, 10000), default=DEFAULT_LIMIT,
                        metavar="N", help=f"rows shown (default {DEFAULT_LIMIT})")  # fmt: skip
    parser.add_argument("--no-text", action="store_true",
                        help="read no statement texts (ids and numbers only)")  # fmt: skip
    parser.set_defaults(run=run)


def event_value(major: int, text: str) -> int:
    wtype, _, wname = text.partition(":")
    wei = waitevents.number(major, wtype, wname) if wname else None
    if wei is None:
        raise PgprobeError(f"--event {text!r}: no such wait event in PostgreSQL {major} "
                           "(TYPE:NAME as pg_stat_activity shows them, e.g. "
                           "Lock:transactionid)", EXIT_USAGE)  # fmt: skip
    return wei


def dimension(
    ns: argparse.Namespace,
    targets: Targets,
    where: address.WaitEventAddress,
    ids: pgss.QueryIds,
) -> querydim.Dimension:
    """The query dimension for this server, or a one-line refusal."""
    why = compiled.why_not(ns)
    if why is not None:
        raise PgprobeError(
            f"queries needs the compiled time model: "
            f"{why or 'it runs on bpftrace with libbpf only'}",
            EXIT_ENV,
        )
    cluster = targets.cluster
    found = statement.address_of(where, cluster.major)
    if found is None:
        raise PgprobeError(
            f"queries cannot read the backends' statements: {cluster.binary} "
            "has no MyBEEntry, or this major's offsets are not known",
            EXIT_ENV,
        )
    return querydim.Dimension(found, not ids.computed, cluster.binary)


@dataclass
class Captured:
    """A window's statements, their meta and the capture's losses."""

    rows: list[records.StatementTime]
    meta: dict[str, Any]
    info: Any
    note: str | None
    window_ns: int


def capture_statements(ns: argparse.Namespace, targets: Targets) -> Captured:
    """The time model per statement over ns.duration (waits --by query's too)."""
    cluster = targets.cluster
    conninfo = cluster.conninfo
    assert conninfo is not None
    with discover.connect_conninfo(conninfo) as conn:
        ids = pgss.query_ids(conn)
        before = pgss.read_statements(conn)  # read again once the probes are in
    where = address.find(cluster.postmaster_pid, cluster.binary)
    dim = dimension(ns, targets, where, ids)
    no_text = getattr(ns, "no_text", False)
    sampler = None if no_text else pgss.TextSampler(conninfo)
    capture = compiled.capture(probe.script_args(targets, where, None), ns.duration, query=dim)
    if sampler is not None:
        sampler.start()

    def at_live() -> None:
        # pg_stat_statements' window opens when the probes are in: the same seconds
        nonlocal before
        with discover.connect_conninfo(conninfo) as conn:
            before = pgss.read_statements(conn)

    try:
        snapshot, info = None, None
        for got in common.snapshots(capture, ns, "time per statement", at_live):
            snapshot, info = got  # the last one: the whole window
    finally:
        if sampler is not None:
            sampler.stop()
    assert snapshot is not None and info is not None
    with discover.connect_conninfo(conninfo) as conn:
        after = pgss.read_statements(conn)
        own = sampler.own_pid if sampler is not None else 0
        keep = counted(targets)
        charged = records.charges(snapshot)
        rows = records.statements(cluster.major, charged, lambda pid: pid != own and keep(pid))
        if not no_text:
            ids_shown = [r.query_id for r in rows if r.query_id is not None
                         and not r.text_keyed]  # fmt: skip
            texts = {**(sampler.by_id if sampler else {}), **pgss.statement_texts(conn, ids_shown)}
            records.add_texts(rows, texts, sampler.by_key if sampler else {})
    records.add_counters(rows, pgss.statement_deltas(before, after))
    start, end = snapshot.get("window_ns").get((), 0), snapshot.get("now_ns").get((), 0)
    assert isinstance(start, int) and isinstance(end, int)
    db_ns = sum(r.db_ns for r in rows)
    note = ids.note()
    meta = common.meta(
        targets, info, snapshot,
        window_s=round((end - start) / 1e9, 6),
        window_unix_s=common.wall_clock(start, end),
        db_time_us=round(db_ns / 1000, 3),
        outside_statements_us=round(records.outside_ns(rows) / 1000, 3),
        not_split_us=round(records.spanned_ns(charged, keep) / 1000, 3),
        compute_query_id=ids.setting,
        query_ids=ids.computed,
        query_ids_note=note,
        statements_counters=before.by_id is not None,
        track_planning=before.track_planning,
        texts=not getattr(ns, "no_text", False),
        texts_error=(sampler.error or None) if sampler else None,
    )  # fmt: skip
    return Captured(rows, meta, info, note, end - start)


def run(ns: argparse.Namespace) -> int:
    targets = common.prepare(ns, probe.check_server, compiled.OBJECT)
    cluster = targets.cluster
    wei = event_value(cluster.major, ns.event) if ns.event else None
    got = capture_statements(ns, targets)
    rows, meta, info, note = got.rows, got.meta, got.info, got.note
    db_ns, end_start = int(meta["db_time_us"] * 1000), got.window_ns
    if ns.query_id is not None:
        rows = [r for r in rows if r.query_id == ns.query_id]
    if wei is not None:
        rows = records.by_event(rows, wei)
    shown = rows[: ns.limit]
    if ns.json:
        common.print_json(NAME, meta, [r.as_json(cluster.major, db_ns, end_start) for r in shown])
        _notes(meta, info, note, json=True)
        return 0
    title = common.title("DB time by statement", meta) + (
        f"; DB time {db_ns / 1e9:.3f} s, {db_ns / max(end_start, 1):.2f} active sessions"
    )
    if ns.query_id is not None and shown:
        view.show_model(title.replace("by statement", f"of statement {ns.query_id}"), shown[0],
                        cluster.major)  # fmt: skip
    else:
        view.show(title, shown, meta, cluster.major)
    _notes(meta, info, note, json=False)
    return 0


def _notes(meta: dict[str, Any], info: Any, note: str | None, json: bool) -> None:
    """The losses, and the lines a DBA must read beside the table (stderr)."""
    common.print_losses(info)
    outside = meta["outside_statements_us"] / 1e6
    if meta["db_time_us"] and not json:
        share = 100 * meta["outside_statements_us"] / meta["db_time_us"]
        common.warn(f"{outside:.3f} s of DB time ({share:.1f} %) belongs to no statement: "
                    "background processes, sessions between statements, parsing before an "
                    "id is set", "note")  # fmt: skip
    split = meta["not_split_us"] / 1e6
    if split and meta["db_time_us"] and not json:
        share = 100 * meta["not_split_us"] / meta["db_time_us"]
        common.warn(f"up to {split:.3f} s of DB time ({share:.1f} %) may be charged to a later "
                    "statement than the one that ran it: runs that began over 1 ms before their "
                    "last statement (statements back to back with no sleep between, or "
                    "preemptions before it began)", "note")  # fmt: skip
    if note:
        common.warn(note, "note")
    if meta.get("texts_error"):
        common.warn(f"statement texts not sampled from pg_stat_activity: {meta['texts_error']}")
