"""Statements: which one a finding's time belongs to, from the time model's `statements`.

`pgprobe triage` keys the exact time model by statement too (pgprobe queries' rows, in
``waits.statements.rows``) where the compiled time model runs. A finding about a wait
event, or about the CPU, names the statement with the largest part of that time, as a
DBA acts on it: "72 % of it is `UPDATE pgbench_branches ...` (queryid ...)".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pgprobe.findings import fmt
from pgprobe.findings.base import Doc
from pgprobe.literal import one_line

TEXT_CHARS = 60  # of a statement's text in a finding's title
NAMED = ("statement", "idle in transaction", "text")


def statement_rows(doc: Doc) -> list[dict[str, Any]]:
    waits = doc.get("waits") if isinstance(doc.get("waits"), dict) else None
    statements = (waits or {}).get("statements")
    rows = statements.get("rows") if isinstance(statements, dict) else None
    return [r for r in rows or [] if isinstance(r, dict) and r.get("kind") in NAMED]


def wait_seconds(row: dict[str, Any], events: set[tuple[str, str]]) -> float:
    """A row's seconds asleep in these (wait_event_type, wait_event), as the time model
    counts a wait event (the runqueue time after the sleeps is the model's runqueue)."""
    total = 0.0
    for w in row.get("waits") or []:
        if (w.get("wait_event_type"), w.get("wait_event")) in events:
            total += float(w.get("total_us") or 0)
    return total / 1e6


def in_events(events: set[tuple[str, str]]) -> Callable[[dict[str, Any]], float]:
    """wait_seconds of these events, as a function of a row."""
    return lambda row: wait_seconds(row, events)


def cpu_seconds(row: dict[str, Any]) -> float:
    """On CPU and waiting for one, as the model's "on CPU or waiting for one"."""
    parts = ("cpu_us", "runq_preempted_us", "runq_woken_us")
    return sum(float(row.get(k) or 0) for k in parts) / 1e6


def named(row: dict[str, Any]) -> str:
    """`text…` (queryid N), or idle in transaction after it."""
    text = one_line(str(row.get("query") or ""), TEXT_CHARS)
    what = f"`{text}`" if text else "a statement whose text was not seen"
    if row.get("kind") == "idle in transaction":
        what = f"sessions idle in transaction after {what}"
    qid = row.get("query_id")
    return f"{what} (queryid {qid})" if qid is not None else what


def top_part(doc: Doc, seconds_of: Callable[[dict[str, Any]], float], total_s: float) -> str:
    """ ", {pct} of it is {statement}" for the statement with the most of total_s, else ""."""
    rows: Iterable[dict[str, Any]] = statement_rows(doc)
    best = max(rows, key=seconds_of, default=None)
    if best is None or total_s <= 0 or seconds_of(best) <= 0:
        return ""
    return f"; {fmt.pct(100 * min(seconds_of(best) / total_s, 1.0))} of it is {named(best)}"
