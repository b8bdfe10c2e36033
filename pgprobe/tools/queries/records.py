"""The time model per statement, from the snapshot's `query_ns`: pure functions, no I/O.

query_ns (tools/waits/querydim.py) -> Charge per (process, kind, statement key, wait
event) -> StatementTime per row of the table: one per statement (its query id), one per
statement a session stayed idle in a transaction after, and the DB time outside any
statement. DB time = on CPU + runqueue + waits that are not idle (a ClientRead between
transactions, a background process's main loop, as the time model's `idle`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from pgprobe import waitevents
from pgprobe.engines.base import Snapshot
from pgprobe.tools.waits.querydim import CPU, PREEMPTED, WAIT, WOKEN
from pgprobe.waitevents import backend_state, statement

STATEMENT = "statement"  # active (or a fastpath call), with a query id
TEXT = "text"  # no query id on this server: grouped by the statement's text
IDLE_IN_XACT = "idle in transaction"  # after the statement named
NO_ID = "no query id"  # active without an id: parse analysis, statements without one
OUTSIDE = "outside statements"  # background processes, a session woken between statements

Charges = dict[tuple[int, int, int, int, int], int]  # (tid, kind, state, wei, id) -> ns


def charges(snapshot: Snapshot, previous: Snapshot | None = None) -> Charges:
    """The snapshot's query_ns, less previous's (the maps are cumulative)."""
    out: Charges = {}
    for key, value in snapshot.get("query_ns").items():
        # each part's type asked apart: a generator per key was half of this loop's time
        if isinstance(value, int) and len(key) == 5:
            tid, kind, state, wei, qid = key
            if type(tid) is type(kind) is type(state) is type(wei) is type(qid) is int:
                out[cast(tuple[int, int, int, int, int], key)] = value
    if previous is not None:
        return minus(out, charges(previous))
    return out


def minus(now: Charges, before: Charges) -> Charges:
    """One cumulative read of query_ns less an earlier one, without the keys that did not
    move (most of them: the keys of every process asleep all through the window)."""
    out = dict(now)
    for key, value in before.items():
        moved = out.get(key, 0) - value
        if moved:
            out[key] = moved
        elif key in out:
            del out[key]
    return out


@dataclass
class StatementTime:
    """One row: a statement (or what is outside any), its time in ns over the window."""

    kind: str
    query_id: int | None  # signed, as pg_stat_statements shows it (None: outside, no id)
    text_keyed: bool = False  # query_id is the probe's key of its text (no query ids)
    cpu_ns: int = 0
    preempted_ns: int = 0
    woken_ns: int = 0  # runqueue right after its sleeps (their wait event still set)
    wait_ns: dict[int, int] = field(default_factory=dict)  # wait_event_info -> ns asleep
    woken_by_event: dict[int, int] = field(default_factory=dict)
    pids: set[int] = field(default_factory=set)
    calls: int | None = None
    exec_ms: float | None = None
    plan_ms: float | None = None
    query: str = ""

    @property
    def db_ns(self) -> int:
        return self.cpu_ns + self.preempted_ns + self.woken_ns + sum(self.wait_ns.values())

    def as_json(self, major: int, db_ns: int, window_ns: int) -> dict[str, Any]:
        waits = sorted(self.wait_ns.items(), key=lambda kv: -kv[1])
        return {
            "kind": self.kind,
            "query_id": None if self.text_keyed else self.query_id,
            "text_key": self.query_id if self.text_keyed else None,
            "db_time_us": round(self.db_ns / 1000, 3),
            "share_pct": round(100 * self.db_ns / db_ns, 2) if db_ns else 0.0,
            "aas": round(self.db_ns / window_ns, 4) if window_ns else 0.0,
            "cpu_us": round(self.cpu_ns / 1000, 3),
            "runq_preempted_us": round(self.preempted_ns / 1000, 3),
            "runq_woken_us": round(self.woken_ns / 1000, 3),
            "waits": [
                dict(
                    zip(
                        ("wait_event_type", "wait_event"), waitevents.name(major, wei), strict=True
                    ),
                    wait_event_info=wei,
                    total_us=round(ns / 1000, 3),
                    runq_woken_us=round(self.woken_by_event.get(wei, 0) / 1000, 3),
                )
                for wei, ns in waits
            ],  # fmt: skip
            "calls": self.calls,
            "total_exec_ms": None if self.exec_ms is None else round(self.exec_ms, 3),
            "total_plan_ms": None if self.plan_ms is None else round(self.plan_ms, 3),
            "ms_per_call": round((self.exec_ms or 0.0) / self.calls, 3) if self.calls else None,
            "pids": sorted(self.pids),
            "query": self.query,
        }


def is_idle(major: int, wei: int) -> bool:
    """A wait that is no DB time: ClientRead while idle, Activity:* and the like."""
    state = backend_state.state_of(major, wei)
    if state is not None:
        return state == backend_state.IDLE
    wtype, wname = waitevents.name(major, wei)
    return waitevents.is_idle(wtype, wname)


def row_key(major: int, state: int, qid: int) -> tuple[str, int | None, bool]:
    """The row a charge belongs to, by the backend's state first and its id second (and
    whether that id is the key of its text)."""
    names = backend_state.STATE_NAMES.get(major, ())
    raw = state & 0xFF
    name = names[raw] if not state & statement.NO_ENTRY and raw < len(names) else ""
    if name in ("active", "fastpath function call"):
        if state & statement.TEXT:
            return TEXT, qid, True
        return (STATEMENT, statement.signed(qid), False) if qid else (NO_ID, None, False)
    if name in ("idle in transaction", "idle in transaction (aborted)") and qid:
        if state & statement.TEXT:
            return IDLE_IN_XACT, qid, True
        return IDLE_IN_XACT, statement.signed(qid), False
    return OUTSIDE, None, False


def statements(major: int, charged: Charges, keep: Callable[[int], bool]) -> list[StatementTime]:
    """The rows, by DB time (idle time left out), of the processes kept."""
    rows: dict[tuple[str, int | None, bool], StatementTime] = {}
    for (tid, kind, state, wei, qid), ns in charged.items():
        if not ns or not keep(tid) or state & statement.SPANNED:
            continue
        if kind in (WAIT, WOKEN) and is_idle(major, wei):
            continue
        key = row_key(major, state, qid)
        row = rows.setdefault(key, StatementTime(*key))
        row.pids.add(tid)
        if kind == CPU:
            row.cpu_ns += ns
        elif kind == PREEMPTED:
            row.preempted_ns += ns
        elif kind == WOKEN:
            row.woken_ns += ns
            row.woken_by_event[wei] = row.woken_by_event.get(wei, 0) + ns
        elif kind == WAIT:
            row.wait_ns[wei] = row.wait_ns.get(wei, 0) + ns
    return sorted((r for r in rows.values() if r.db_ns > 0), key=lambda r: -r.db_ns)


def add_counters(
    rows: Iterable[StatementTime], deltas: dict[int, tuple[int, float, float]] | None
) -> None:
    """pg_stat_statements' calls and times over the window, on the statements' rows."""
    if deltas is None:
        return
    for row in rows:
        if row.kind == STATEMENT and row.query_id is not None and not row.text_keyed:
            calls, exec_ms, plan_ms = deltas.get(row.query_id, (0, 0.0, 0.0))
            row.calls, row.exec_ms, row.plan_ms = calls, exec_ms, plan_ms


def add_texts(rows: Iterable[StatementTime], by_id: dict[int, str], by_key: dict[int, str]) -> None:
    for row in rows:
        if row.query_id is None:
            continue
        texts = by_key if row.text_keyed else by_id
        row.query = texts.get(row.query_id, row.query)


def outside_ns(rows: Iterable[StatementTime]) -> int:
    """DB time that belongs to no statement: outside any, or active without an id."""
    return sum(r.db_ns for r in rows if r.kind in (OUTSIDE, NO_ID))


def spanned_ns(charged: Charges, keep: Callable[[int], bool]) -> int:
    """The parts of runs before their last statement began (over 1 ms): at most this much
    DB time is charged to a later statement than the one that ran it (counted, not a row:
    statements() leaves these charges out, the time is the run's last statement's)."""
    return sum(ns for (tid, _k, state, _w, _q), ns in charged.items()
               if state & statement.SPANNED and keep(tid))  # fmt: skip


def by_event(rows: list[StatementTime], wei: int) -> list[StatementTime]:
    """The rows with time in one wait event, ranked by it (--event)."""
    return sorted((r for r in rows if r.wait_ns.get(wei)), key=lambda r: -r.wait_ns[wei])


def grouped(rows: list[StatementTime]) -> dict[str, int]:
    """DB time per kind of row, for the meta."""
    out: dict[str, int] = defaultdict(int)
    for r in rows:
        out[r.kind] += r.db_ns
    return dict(out)


def section(
    rows: list[StatementTime], major: int, window_ns: int, not_split_ns: int, top: int = 10
) -> dict[str, Any]:
    """The statements part of a triage document: the top rows and the DB time's split."""
    db_ns = sum(r.db_ns for r in rows)
    return {
        "db_time_us": round(db_ns / 1000, 3),
        "outside_statements_us": round(outside_ns(rows) / 1000, 3),
        "not_split_us": round(not_split_ns / 1000, 3),
        "rows": [r.as_json(major, db_ns, window_ns) for r in rows[:top]],
    }


def components(row: StatementTime, major: int) -> list[dict[str, Any]]:
    """One statement's time model, part by part (waits --by query's rows)."""
    parts: list[tuple[str, str, str, int]] = [
        ("on CPU", "CPU", "on CPU", row.cpu_ns),
        ("runqueue", "CPU", "runqueue (preempted)", row.preempted_ns),
        ("runqueue", "CPU", "runqueue (woken, not yet running)", row.woken_ns),
    ]
    for wei, ns in sorted(row.wait_ns.items(), key=lambda kv: -kv[1]):
        wtype, wname = waitevents.name(major, wei)
        parts.append(("wait", wtype, wname, ns))
    head = {"kind": row.kind, "query_id": None if row.text_keyed else row.query_id,
            "query": row.query}  # fmt: skip
    return [
        {
            **head,
            "category": c,
            "wait_event_type": t,
            "wait_event": e,
            "total_us": round(ns / 1000, 3),
            "share_pct": round(100 * ns / row.db_ns, 2) if row.db_ns else 0.0,
        }  # fmt: skip
        for c, t, e, ns in parts
        if ns or c == "on CPU"
    ]


def named_waits(row: StatementTime, major: int, top: int | None = None) -> list[tuple[str, int]]:
    """A row's waits as "Type:Name" and ns, the longest first."""
    waits = sorted(row.wait_ns.items(), key=lambda kv: -kv[1])[:top]
    return [(":".join(p for p in waitevents.name(major, wei) if p), ns) for wei, ns in waits]
