"""How `pgprobe top` looks: the full screen (rich, drawn by rich.live in command.py), and
the plain text of --once, --batch and a pipe. Every name from the server is a rich Text
made literal (pgprobe.literal), never markup. The screen is laid out at each draw for the
terminal's size then (80x24 and up: the statement text takes what is left), and its
colours follow NO_COLOR (rich's Console): without colours the bar's classes are letters.
The locks view has the window's blocking trees under its table (records.tree_rows)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from pgprobe.literal import literal, literal_lines, one_line
from pgprobe.render import table
from pgprobe.tools.locks.trees import Tree
from pgprobe.tools.queries.records import components
from pgprobe.tools.top import cpu, records
from pgprobe.tools.top.cpu import CpuSampler
from pgprobe.tools.top.records import CLASSES, Frame
from pgprobe.tools.top.state import State

STYLE = {"CPU": "green", "runqueue": "yellow", "IO": "blue", "Lock": "red",
         "LWLock": "magenta", "Client": "cyan", "other": "white"}  # fmt: skip
GLYPH = {"CPU": "C", "runqueue": "r", "IO": "i", "Lock": "L", "LWLock": "W",
         "Client": "c", "other": "o"}  # fmt: skip
LABEL = {"runqueue": "runq"}  # the header's short names
SPARKS = "▁▂▃▄▅▆▇█"
HEADER_LINES = 7  # title, window, bar, legend, history, lost, tabs
TEXT_WIDTH = 200  # characters of a statement's text in a row (a cell cuts it to fit)

C = table.Column
COLUMNS: dict[str, list[C]] = {
    "statements": [C("db", "DB s", True), C("aas", "AAS", True), C("calls", "CALLS", True),
                   C("ms", "MS/CALL", True), C("cpu", "CPU s", True), C("runq", "RUNQ s", True),
                   C("waits", "TOP WAITS"), C("query", "QUERY")],
    "backends": [C("pid", "PID", True), C("app", "APPLICATION"), C("client", "CLIENT"),
                 C("state", "STATE"), C("xact", "XACT s", True), C("db", "DB s", True),
                 C("cpu", "CPU s", True), C("runq", "RUNQ s", True), C("wait", "WAITS s", True),
                 C("now", "WAIT NOW"), C("query", "STATEMENT")],
    "waits": [C("event", "WAIT EVENT"), C("class", "CLASS"), C("s", "SECONDS", True),
              C("aas", "AAS", True), C("sleeps", "SLEEPS", True), C("n", "BACKENDS", True)],
    "locks": [C("lock", "LOCK"), C("mode", "MODE WANTED"), C("waiters", "WAITERS", True),
              C("waits", "WAITS", True), C("s", "SECONDS", True), C("max", "MAX s", True)],
}  # fmt: skip
TREE_COLUMNS = [C("pid", "PID"), C("state", "STATE"), C("xact", "XACT s", True),
                C("waited", "WAITED s", True), C("lock", "LOCK"), C("mode", "MODE WANTED"),
                C("query", "STATEMENT")]  # fmt: skip
NARROW = {"backends": {"client", "wait"}, "trees": {"lock", "mode"}}  # left out below WIDE
WIDE = 110
FLEX = {"query", "waits", "app", "client", "now", "event", "lock"}  # cut to fit, in that order
TITLES = {"statements": "Statements", "backends": "Backends", "waits": "Wait events",
          "locks": "Locks"}  # fmt: skip
EMPTY = {"statements": "no statement ran in the window", "backends": "no process in the window",
         "waits": "no DB time in the window",
         "locks": "no heavyweight lock waits in the window"}  # fmt: skip
TREES_EMPTY = "no session waited behind another in the samples"
KEYS = ("1-4", "view", "<>", "sort", "r", "order", "/", "filter", "Space", "pause",
        "↑↓⏎", "details", "q", "quit")  # fmt: skip


def seconds(ns: int) -> str:
    return f"{ns / 1e9:,.3f}"


def cells(view: str, row: Any, frame: Frame) -> dict[str, str]:
    """A row's cells (plain strings; made literal where drawn)."""
    window = max(frame.end_ns - frame.start_ns, 1)
    if view == "statements":
        ms = f"{row.exec_ms / row.calls:,.2f}" if row.calls and row.exec_ms is not None else ""
        text = row.query or (f"({row.kind})" if row.query_id is None else f"id {row.query_id}")
        if row.kind == "idle in transaction":  # the session's wait after that statement
            text = f"(idle in transaction after) {text}"
        return {"db": seconds(row.db_ns), "aas": f"{row.db_ns / window:.2f}",
                "calls": "" if row.calls is None else f"{row.calls:,}", "ms": ms,
                "cpu": seconds(row.cpu_ns), "runq": seconds(row.preempted_ns + row.woken_ns),
                "waits": records.statement_waits(row, frame.major),
                "query": one_line(text, TEXT_WIDTH)}  # fmt: skip
    if view == "backends":
        s, by = row.session, row.by_class
        waited = row.db_ns - by.get("CPU", 0) - by.get("runqueue", 0)
        return {"pid": str(row.pid), "app": s.application_name or s.backend_type,
                "client": s.client, "state": s.state,
                "xact": "" if s.xact_age_s is None else f"{s.xact_age_s:,.1f}",
                "db": seconds(row.db_ns), "cpu": seconds(by.get("CPU", 0)),
                "runq": seconds(by.get("runqueue", 0)), "wait": seconds(waited),
                "now": s.wait_event, "query": one_line(s.query, TEXT_WIDTH)}  # fmt: skip
    if view == "waits":
        return {"event": row.event, "class": row.wclass, "s": seconds(row.ns),
                "aas": f"{row.ns / window:.2f}", "sleeps": f"{row.sleeps:,}" if row.sleeps else "",
                "n": str(len(row.pids))}  # fmt: skip
    return {"lock": frame.lock_label(row), "mode": row.mode_name, "waiters": str(len(row.waiters)),
            "waits": f"{row.waits:,}", "s": seconds(row.ns),
            "max": seconds(row.max_ns)}  # fmt: skip


def tree_cells(frame: Frame, tree: Tree, pid: int, depth: int) -> dict[str, str]:
    """A row of a blocking tree: the root's session and its tree's seconds, or a waiter
    indented under the pid it waited behind, with its own seconds (the window's)."""
    assert frame.blocking is not None
    s = frame.blocking.sessions.get(pid)
    if depth:
        lock, mode = frame.lock_of.get(pid, ("(not measured)", ""))
    else:
        lock, mode = f"root of {len(tree.behind)} waiting", ""
    return {"pid": f"{'  ' * depth}└ {pid}" if depth else str(pid),
            "state": (s.state or "") if s else "(gone)",
            "xact": "" if s is None or s.xact_age_s is None else f"{s.xact_age_s:,.1f}",
            "waited": seconds(tree.waited_ns.get(pid, 0) if depth else tree.total_ns),
            "lock": lock, "mode": mode,
            "query": one_line((s.query or "") if s else "", TEXT_WIDTH)}  # fmt: skip


def trees_title(frame: Frame, more: str = "", short: bool = False) -> str:
    """What the trees are made of (the screen's within 80 columns), and the seconds no
    sample placed."""
    assert frame.blocking is not None
    b = frame.blocking
    unsampled = (f"; {b.unsampled_ns / 1e9:.3f} s of waits no sample saw (pids "
                 f"{', '.join(map(str, b.unsampled_pids))})" if b.unsampled_ns else "")  # fmt: skip
    how = "" if short else "; each waiter under the root it was seen behind most"
    return f"Blocking trees ({b.samples} samples of pg_locks with waiters{how}){more}{unsampled}"


def title_line(frame: Frame, version: str, postmaster: int) -> str:
    return (
        f"pgprobe top: PostgreSQL {version.split()[0]} (postmaster {postmaster}), "
        f"{frame.cpus} CPUs, window {frame.window_s:.3f} s to {clock(frame.end_unix_s)}"
    )


def screen_title(frame: Frame, version: str, postmaster: int) -> str:
    """The title of the screen, within 80 columns."""
    return (f"PostgreSQL {version.split()[0]}, postmaster {postmaster}, {frame.cpus} CPUs; "
            f"window {frame.window_s:.3f} s to {clock(frame.end_unix_s)}")  # fmt: skip


def legend(frame: Frame, width: int, letters: bool) -> Iterator[Text]:
    """Each class's AAS, in its colour (its letter in the bar without colours), on as few
    lines as the width allows."""
    line = Text(no_wrap=True, overflow="crop")
    for c in CLASSES:
        item = f"{GLYPH[c] + '=' if letters else ''}{LABEL.get(c, c)} {frame.aas(c):.2f}"
        if line.plain and len(line.plain) + 2 + len(item) > width:
            yield line
            line = Text(no_wrap=True, overflow="crop")
        line.append("  " if line.plain else "")
        line.append(item, style=STYLE[c])
    yield line


def clock(unix_s: float) -> str:
    import time

    return time.strftime("%H:%M:%S", time.localtime(unix_s)) + f".{int(unix_s * 1000) % 1000:03d}"


def split_line(frame: Frame) -> str:
    """The AAS split by class, as words."""
    parts = "  ".join(f"{LABEL.get(c, c)} {frame.aas(c):.2f}" for c in CLASSES)
    return f"AAS {frame.aas():.2f} of {frame.cpus} CPUs: {parts}"


def plain(frame: Frame, version: str, postmaster: int, views: Sequence[str], limit: int) -> None:
    """One refresh as text on stdout: the header, then each view's first `limit` rows."""
    print(title_line(frame, version, postmaster))
    print(split_line(frame))
    for line in frame.lost:
        print(literal(f"lost: {line}"))
    state = State()
    for view in views:
        state.view = view
        rows = state.rows(frame)
        shown = [cells(view, r, frame) for r in rows[:limit]]
        more = f" (first {limit} of {len(rows)})" if len(rows) > limit else ""
        print()
        table.render(f"{TITLES[view]}{more}", COLUMNS[view], shown, empty=EMPTY[view])
        if view == "locks" and frame.blocking is not None and frame.locks:
            trees = records.tree_rows(frame.blocking)
            more = f" (first {limit} of {len(trees)} rows)" if len(trees) > limit else ""
            print()
            table.render(trees_title(frame, more), TREE_COLUMNS,
                         [tree_cells(frame, *row) for row in trees[:limit]],
                         empty=TREES_EMPTY)  # fmt: skip
    print(flush=True)


@dataclass
class Screen:
    """The whole screen at one moment: rich lays it out for the terminal's size."""

    frame: Frame | None
    state: State
    history: Sequence[tuple[float, str]]  # per refresh: AAS, its largest class
    version: str
    postmaster: int
    status: str = ""  # a note for the bottom line (the interval changes at the next refresh)
    cpu: CpuSampler | None = None  # the details page's CPU functions (c), when sampled

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width, height = options.max_width, options.height or console.height
        lines = list(self._header(width, not console.color_system or console.no_color))
        body = max(height - len(lines) - 1, 1)
        yield from lines
        if self.frame is None:
            yield Text("attaching the probes: the first refresh comes after one interval")
            body -= 1
        elif self.state.detail:
            shown = list(self._detail(width))[:body]
            body -= len(shown)
            yield from shown
        else:
            trees, taken = self._trees(width, body)
            grid, used = self._table(width, body - taken)
            yield grid
            yield from trees
            body -= used + taken
        yield from [Text("")] * max(body, 0)
        yield self._keys(width)

    def _header(self, width: int, letters: bool) -> Iterator[Text]:
        frame, state = self.frame, self.state
        pause = "PAUSED " if state.paused else ""
        if frame is None:
            yield Text(f"{pause}pgprobe top: PostgreSQL {self.version.split()[0]}",
                       style="bold")  # fmt: skip
            return
        yield Text(pause + literal(screen_title(frame, self.version, self.postmaster)),
                   style="bold", no_wrap=True, overflow="ellipsis")  # fmt: skip
        yield self._bar(frame, width, letters)
        yield from legend(frame, width, letters)
        yield self._history(width)
        lost = frame.lost
        more = f" (+{len(lost) - 1} more)" if len(lost) > 1 else ""
        yield Text(literal(f"lost: {lost[0]}{more}" if lost else "lost: nothing"),
                   style="red" if lost else "dim", no_wrap=True, overflow="ellipsis")  # fmt: skip
        tabs = Text(no_wrap=True, overflow="ellipsis")
        for n, view in enumerate(records.VIEWS, 1):
            tab = f"{n} {view.title()}"
            tabs.append(
                f"{' ' if n == 1 else ''}{tab} ", style="reverse" if view == state.view else ""
            )
        order = "▲" if state.ascending else "▼"
        tabs.append(f" sort: {state.sort_name} {order}")
        if state.editing is not None:
            tabs.append(literal(f"  filter: {state.editing}_"), style="bold")
        elif state.filter:
            tabs.append(literal(f"  filter: {state.filter}"), style="bold")
        yield tabs

    def _bar(self, frame: Frame, width: int, letters: bool) -> Text:
        """DB time as one bar of classes, scaled to the CPUs (a | where they end) or to the
        AAS when it is more."""
        label = f"{frame.aas():5.2f} AAS "
        room = max(width - len(label) - 1, 10)
        scale = max(frame.aas(), float(frame.cpus))
        bar = Text(label, no_wrap=True, overflow="crop")
        used = 0
        for c in CLASSES:
            n = round(frame.aas(c) / scale * room) if scale else 0
            n = min(n, room - used)
            bar.append((GLYPH[c] if letters else "█") * n, style=STYLE[c])
            used += n
        cpu_at = round(frame.cpus / scale * room) if scale else room
        rest = "".join("|" if i == cpu_at - 1 else "." if letters else " "
                       for i in range(used, room))  # fmt: skip
        bar.append(rest, style="dim")
        return bar

    def _history(self, width: int) -> Text:
        room = max(width - 20, 10)
        points = list(self.history)[-room:]
        top = max([a for a, _ in points] + [float(self.frame.cpus if self.frame else 1)])
        line = Text("history ", no_wrap=True, overflow="crop")
        for aas, cls in points:
            level = min(int(aas / top * (len(SPARKS) - 1) + 0.5), len(SPARKS) - 1) if top else 0
            line.append(SPARKS[level], style=STYLE.get(cls, ""))
        line.append(f" max {top:.2f}", style="dim")
        return line

    def _table(self, width: int, height: int) -> tuple[Table, int]:
        frame, state = self.frame, self.state
        assert frame is not None
        view = state.view
        rows = state.rows(frame)
        room = max(height - 1, 0)
        state.selected = min(state.selected, max(len(rows) - 1, 0))
        first = max(0, state.selected - room + 1)
        grid = Table(box=None, expand=True, padding=(0, 1), show_edge=False, width=width,
                     header_style="bold reverse")  # fmt: skip
        columns = [c for c in COLUMNS[view] if width >= WIDE or c.key not in NARROW.get(view, ())]
        for col in columns:
            flex = col.key in FLEX
            ratio = (2 if col.key == "query" else 1) if flex else None
            grid.add_column(col.header, justify="right" if col.numeric else "left",
                            no_wrap=True, overflow="ellipsis", ratio=ratio,
                            min_width=8 if flex else len(col.header))  # fmt: skip
        if not rows:
            grid.add_row(Text(EMPTY[view] + (" (filtered)" if state.filter else ""), style="dim"))
        for i, row in enumerate(rows[first : first + room], first):
            texts = cells(view, row, frame)
            grid.add_row(*(Text(literal(texts[c.key])) for c in columns),
                         style="reverse" if i == state.selected else None)  # fmt: skip
        return grid, 1 + max(min(len(rows) - first, room), 1)

    def _trees(self, width: int, body: int) -> tuple[list[Text | Table], int]:
        """Under the locks view's table: the blocking trees in what its rows leave (at least
        half the height when they need it), and the lines they take."""
        frame = self.frame
        if self.state.view != "locks" or frame is None or frame.blocking is None:
            return [], 0
        if not frame.locks:
            return [], 0
        rows = records.tree_rows(frame.blocking)
        room = min(len(rows), max(body - 3 - len(frame.locks), body // 2 - 2))
        more = f", first {max(room, 0)} of {len(rows)} rows" if room < len(rows) else ""
        title = Text(literal(trees_title(frame, more, short=True) if rows else TREES_EMPTY),
                     style="dim", no_wrap=True, overflow="ellipsis")  # fmt: skip
        if room < 1:
            return [title], 1
        grid = Table(box=None, expand=True, padding=(0, 1), show_edge=False, width=width,
                     header_style="bold reverse")  # fmt: skip
        columns = [c for c in TREE_COLUMNS if width >= WIDE or c.key not in NARROW["trees"]]
        for col in columns:
            flex = col.key in FLEX
            grid.add_column(col.header, justify="right" if col.numeric else "left",
                            no_wrap=True, overflow="ellipsis", ratio=2 if flex else None,
                            min_width=8 if flex else len(col.header))  # fmt: skip
        for row in rows[:room]:
            texts = tree_cells(frame, *row)
            grid.add_row(*(Text(literal(texts[c.key])) for c in columns))
        return [title, grid], 2 + room

    def _detail(self, width: int) -> Iterator[Text]:
        frame, state = self.frame, self.state
        assert frame is not None
        rows = state.rows(frame)
        if not rows:
            yield Text("no row to show")
            return
        row = rows[min(state.selected, len(rows) - 1)]
        for line in detail_lines(state.view, row, frame):
            yield Text(literal_lines(line), no_wrap=False)
        for line in cpu.page_lines(self.cpu, row):  # names from binaries: one line each
            yield Text(literal(line), no_wrap=False)

    def _keys(self, width: int) -> Text:
        bar = Text(no_wrap=True, overflow="crop")
        for key, what in zip(KEYS[::2], KEYS[1::2], strict=True):
            bar.append(key, style="bold reverse")
            bar.append(f" {what} ")
        bar.append("+-", style="bold reverse")
        bar.append(f" refresh {self.state.interval} s")
        if self.status:
            bar.append(literal(f"  {self.status}"), style="dim")
        return bar


def detail_lines(view: str, row: Any, frame: Frame) -> Iterable[str]:
    """Enter's page: a row's full time model and its texts (several lines)."""
    if view == "statements":
        yield f"{TITLES[view][:-1]} {row.query_id if row.query_id is not None else row.kind}"
        yield f"calls {row.calls if row.calls is not None else '?'}, backends " + ", ".join(
            map(str, sorted(row.pids))
        )
        for part in components(row, frame.major):
            name = ":".join(p for p in (part["wait_event_type"], part["wait_event"]) if p)
            yield f"  {name:<44} {part['total_us'] / 1e6:9.3f} s {part['share_pct']:6.1f} %"
        yield ""
        yield row.query or "(no text seen)"
    elif view == "backends":
        s = row.session
        yield f"pid {row.pid}: {s.backend_type} {s.application_name} {s.client}".rstrip()
        yield (f"database {s.datname or '-'}, user {s.usename or '-'}, state {s.state or '-'}, "
               f"wait now {s.wait_event or '-'}")  # fmt: skip
        for cls, ns in sorted(row.by_class.items(), key=lambda kv: -kv[1]):
            yield f"  {cls:<12} {ns / 1e9:9.3f} s {100 * ns / max(row.wall_ns, 1):6.1f} %"
        yield f"  longest wait: {row.top_wait or '-'}"
        yield ""
        yield s.query or "(no statement)"
    elif view == "waits":
        yield f"{row.event} ({row.wclass}): {row.ns / 1e9:.3f} s, {row.sleeps:,} sleeps"
        yield "backends: " + ", ".join(map(str, sorted(row.pids)))
    else:
        yield f"{frame.lock_label(row)}, mode {row.mode_name}: {row.ns / 1e9:.3f} s"
        placed = {pid: (t.root, t.behind[pid]) for t, pid, depth in
                  records.tree_rows(frame.blocking) if depth}  # fmt: skip
        for pid, ns in sorted(row.waiters.items(), key=lambda kv: -kv[1]):
            root, ahead = placed.get(pid, (None, None))
            where = f"  behind {ahead} (root blocker {root})" if root is not None else ""
            yield f"  pid {pid:<8} {ns / 1e9:9.3f} s{where}"
