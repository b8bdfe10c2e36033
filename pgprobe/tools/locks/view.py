"""How `pgprobe locks` looks on a terminal: the lock waits per lock (or per waiter)."""

from __future__ import annotations

from collections.abc import Callable

from pgprobe.literal import one_line
from pgprobe.render import table
from pgprobe.tools.locks.records import LockRow, LockWait, Tag
from pgprobe.tools.locks.trees import Trees

LOCK, MODE = table.Column("lock", "LOCK"), table.Column("mode", "MODE WANTED")
TIMES = [
    table.Column("waits", "WAITS", numeric=True),
    table.Column("total_s", "TOTAL s", numeric=True),
    table.Column("max_s", "MAX s", numeric=True),
]
COLUMNS = [LOCK, table.Column("locktype", "TYPE"), MODE,
           table.Column("waiters", "WAITERS", numeric=True), *TIMES]  # fmt: skip
PID_COLUMNS = [table.Column("pid", "PID", numeric=True),
               table.Column("application_name", "APPLICATION"), LOCK, MODE, *TIMES]  # fmt: skip


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


TREE_COLUMNS = [
    table.Column("pid", "PID"),
    table.Column("state", "STATE"),
    table.Column("xact_s", "XACT AGE s", numeric=True),
    table.Column("waited_s", "WAITED s", numeric=True),
    table.Column("lock", "LOCK"),
    table.Column("mode", "MODE WANTED"),
    table.Column("application_name", "APPLICATION"),
    table.Column("query", "STATEMENT"),
]


def show_trees(title: str, trees: Trees, lock_of: dict[int, tuple[str, str]], width: int) -> None:
    """Each root blocker (its session, its tree's exact waited seconds), then the waiters
    behind it, indented by how far they are from it."""
    cells = []

    def session(pid: int, prefix: str) -> dict[str, str]:
        s = trees.sessions.get(pid)
        xact = "" if s is None or s.xact_age_s is None else f"{s.xact_age_s:,.1f}"
        return {"pid": f"{prefix}{pid}", "state": (s.state or "") if s else "(gone)",
                "xact_s": xact, "application_name": (s.application_name or "") if s else "",
                "query": one_line((s.query or "") if s else "", width)}  # fmt: skip

    for t in trees.trees:
        cells.append({**session(t.root, ""), "waited_s": f"{t.total_ns / 1e9:,.3f}",
                      "lock": f"root of {len(t.behind)} waiting"})  # fmt: skip
        for pid, depth in t.depth_first()[1:]:  # each waiter under the pid it waited behind
            lock, mode = lock_of.get(pid, ("(not measured)", ""))
            cells.append({**session(pid, "  " * depth + "└ "), "lock": lock,
                          "mode": mode, "waited_s": f"{t.waited_ns[pid] / 1e9:,.3f}"})  # fmt: skip
    empty = "no session waited behind another in the samples"
    table.render(title, TREE_COLUMNS, cells, empty=empty)
