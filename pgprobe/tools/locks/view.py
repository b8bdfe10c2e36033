"""How `pgprobe locks` looks on a terminal: the lock waits per lock (or per waiter)."""

from __future__ import annotations

from collections.abc import Callable

from pgprobe.render import table
from pgprobe.tools.locks.records import LockRow, LockWait, Tag

COLUMNS = [
    table.Column("lock", "LOCK"),
    table.Column("locktype", "TYPE"),
    table.Column("mode", "MODE WANTED"),
    table.Column("waiters", "WAITERS", numeric=True),
    table.Column("waits", "WAITS", numeric=True),
    table.Column("total_s", "TOTAL s", numeric=True),
    table.Column("max_s", "MAX s", numeric=True),
]
PID_COLUMNS = [
    table.Column("pid", "PID", numeric=True),
    table.Column("application_name", "APPLICATION"),
    table.Column("lock", "LOCK"),
    table.Column("mode", "MODE WANTED"),
    table.Column("waits", "WAITS", numeric=True),
    table.Column("total_s", "TOTAL s", numeric=True),
    table.Column("max_s", "MAX s", numeric=True),
]


def show(title: str, rows: list[LockRow], major: int, label: Callable[[Tag], str]) -> None:
    cells = [{"lock": label(r.tag), "locktype": r.tag.locktype(major),
              "mode": r.mode_name, "waiters": f"{len(r.waiters):,}",
              "waits": f"{r.waits:,}", "total_s": f"{r.ns / 1e9:,.3f}",
              "max_s": f"{r.max_ns / 1e9:,.3f}"} for r in rows]  # fmt: skip
    table.render(title, COLUMNS, cells, empty="no heavyweight lock waits in the window")


def show_by_pid(
    title: str,
    waits: list[LockWait],
    label: Callable[[Tag], str],
    application: Callable[[int], str],
) -> None:
    cells = [{"pid": str(w.pid), "application_name": application(w.pid), "lock": label(w.tag),
              "mode": w.mode_name, "waits": f"{w.waits:,}",
              "total_s": f"{w.ns / 1e9:,.3f}", "max_s": f"{w.max_ns / 1e9:,.3f}"}
             for w in waits]  # fmt: skip
    table.render(title, PID_COLUMNS, cells, empty="no heavyweight lock waits in the window")
