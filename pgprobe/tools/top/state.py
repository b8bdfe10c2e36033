"""What the `pgprobe top` screen is showing and how each key changes it: pure, no I/O.

Keys, in htop's and pg_activity's habits: 1-4 or Tab the view, < and > the sort column,
r the order, / a filter (Enter keeps it, Esc drops it), Space pause, + and - the refresh
interval, the arrows (or j, k) a row, Enter its details (Esc or Enter back; there, c samples
its CPU functions), q quits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgprobe.tools.top import records
from pgprobe.tools.top.records import BackendRow, Frame, WaitRow

INTERVALS = (1, 2, 3, 5, 10, 15, 30, 60)  # seconds: the steps of + and -
UP, DOWN, ENTER, ESC, BACKSPACE, TAB = "up", "down", "enter", "esc", "backspace", "tab"

Sort = tuple[str, Callable[[Any], Any]]  # the column's name, the row's value (largest first)
SORTS: dict[str, tuple[Sort, ...]] = {
    "statements": (
        ("DB time", lambda r: r.db_ns),
        ("calls", lambda r: r.calls or 0),
        ("ms/call", lambda r: (r.exec_ms or 0.0) / r.calls if r.calls else 0.0),
        ("CPU", lambda r: r.cpu_ns),
        ("runqueue", lambda r: r.preempted_ns + r.woken_ns),
    ),
    "backends": (
        ("DB time", lambda r: r.db_ns),
        ("CPU", lambda r: r.by_class.get("CPU", 0)),
        ("runqueue", lambda r: r.by_class.get("runqueue", 0)),
        ("xact age", lambda r: r.session.xact_age_s or 0.0),
        ("pid", lambda r: -r.pid),
    ),
    "waits": (
        ("seconds", lambda r: r.ns),
        ("sleeps", lambda r: r.sleeps),
        ("backends", lambda r: len(r.pids)),
    ),  # fmt: skip
    "locks": (
        ("seconds", lambda r: r.ns),
        ("waiters", lambda r: len(r.waiters)),
        ("waits", lambda r: r.waits),
    ),  # fmt: skip
}


def words(view: str, row: Any, frame: Frame) -> str:
    """What `/` matches in a row (case-insensitively): its names and texts."""
    if view == "statements":
        return f"{row.query_id} {row.kind} {row.query} {records.statement_waits(row, frame.major)}"
    if view == "backends":
        assert isinstance(row, BackendRow)
        s = row.session
        return (f"{row.pid} {s.backend_type} {s.application_name} {s.client} {s.state} "
                f"{s.wait_event} {row.top_wait} {s.datname} {s.usename} {s.query}")  # fmt: skip
    if view == "waits":
        assert isinstance(row, WaitRow)
        return f"{row.event} {row.wclass}"
    return f"{frame.lock_label(row)} {row.mode_name}"


@dataclass
class State:
    """The screen's state: view, sort, filter, pause, interval, the row chosen."""

    interval: int = 2
    view: str = "statements"
    sort: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SORTS, 0))
    ascending: bool = False
    filter: str = ""
    editing: str | None = None  # the filter being typed after `/`
    paused: bool = False
    selected: int = 0
    detail: bool = False
    cpu_asked: bool = False  # c on a details page: its CPU functions (command.py samples)
    quit: bool = False

    @property
    def sort_name(self) -> str:
        return SORTS[self.view][self.sort[self.view]][0]

    def rows(self, frame: Frame) -> list[Any]:
        """The view's rows of a frame, filtered and sorted."""
        found: list[Any] = getattr(frame, self.view)
        wanted = self.filter.lower()
        if wanted:
            found = [r for r in found if wanted in words(self.view, r, frame).lower()]
        value = SORTS[self.view][self.sort[self.view]][1]
        return sorted(found, key=value, reverse=not self.ascending)

    def key(self, key: str) -> None:
        """Apply one key (a character, or UP, DOWN, ENTER, ESC, BACKSPACE, TAB)."""
        if self.editing is not None:
            self._edit(key)
        elif self.detail and key == "c":
            self.cpu_asked = True
        elif self.detail and key not in ("q", " ", "+", "-"):
            self.detail = key not in (ENTER, ESC, BACKSPACE)
        elif key == "q":
            self.quit = True
        elif key in ("1", "2", "3", "4"):
            self._view(records.VIEWS[int(key) - 1])
        elif key == TAB:
            self._view(records.VIEWS[(records.VIEWS.index(self.view) + 1) % len(records.VIEWS)])
        elif key in ("<", ">"):
            step = 1 if key == ">" else -1
            self.sort[self.view] = (self.sort[self.view] + step) % len(SORTS[self.view])
        elif key == "r":
            self.ascending = not self.ascending
        elif key == "/":
            self.editing = self.filter
        elif key == " ":
            self.paused = not self.paused
        elif key in ("+", "-"):
            self.interval = step_interval(self.interval, 1 if key == "+" else -1)
        elif key in (UP, "k"):
            self.selected = max(0, self.selected - 1)
        elif key in (DOWN, "j"):
            self.selected += 1
        elif key == ENTER:
            self.detail = True

    def _view(self, view: str) -> None:
        if view != self.view:
            self.view, self.selected = view, 0

    def _edit(self, key: str) -> None:
        assert self.editing is not None
        if key == ENTER:
            self.filter, self.editing, self.selected = self.editing, None, 0
        elif key == ESC:
            self.filter, self.editing = "", None
        elif key == BACKSPACE:
            self.editing = self.editing[:-1]
        elif len(key) == 1 and key.isprintable():
            self.editing += key


def step_interval(now: int, step: int) -> int:
    """The next refresh interval up (+1) or down (-1) from `now` among INTERVALS."""
    if step > 0:
        return next((i for i in INTERVALS if i > now), INTERVALS[-1])
    return next((i for i in reversed(INTERVALS) if i < now), INTERVALS[0])
