"""lwlocks --by query: LWLock sleep time per statement and tranche, from the time model
keyed by statement (`pgprobe queries`' capture, the compiled object, PostgreSQL 14+).

The LWLock probes' waits are keyed by (pid, tranche, mode) in the kernel; per statement
they come from the scheduler instead: each LWLock-class sleep charged to the statement
read at its switch-out (queries' rows), and the runqueue time after its wakeup, while
pg_stat_activity still shows the wait event ("woken"). Sleeps, not waits: no count, no
mode, no histogram. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pgprobe import waitevents
from pgprobe.tools.queries.records import StatementTime


@dataclass(frozen=True)
class StatementSleep:
    """One statement's sleeps in one tranche."""

    kind: str  # queries' row kind: statement, idle in transaction, no query id, ...
    query_id: int | None
    query: str
    tranche: str
    sleep_ns: int
    woken_ns: int
    share: float  # of every row's sleep + woken time, 0..1

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "query_id": self.query_id, "tranche": self.tranche,
                "sleep_us": round(self.sleep_ns / 1000, 3),
                "woken_us": round(self.woken_ns / 1000, 3),
                "share_pct": round(100 * self.share, 2), "query": self.query}  # fmt: skip


def sleeps(rows: Iterable[StatementTime], major: int) -> list[StatementSleep]:
    """The LWLock-class sleeps of each statement row, the longest first."""
    found: list[tuple[StatementTime, str, int, int]] = []
    for row in rows:
        for wei, ns in row.wait_ns.items():
            wait_type, tranche = waitevents.name(major, wei)
            if wait_type == "LWLock":
                found.append((row, tranche, ns, row.woken_by_event.get(wei, 0)))
    total = sum(ns + woken for _, _, ns, woken in found)
    out = [StatementSleep(r.kind, None if r.text_keyed else r.query_id, r.query, tranche, ns,
                          woken, (ns + woken) / total if total else 0.0)
           for r, tranche, ns, woken in found]  # fmt: skip
    out.sort(key=lambda s: (-(s.sleep_ns + s.woken_ns), s.tranche, s.query_id or 0))
    return out
