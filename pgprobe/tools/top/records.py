"""What `pgprobe top` shows of one refresh: pure functions, no I/O.

The time model's window (tools/waits/records: each process's time since the last refresh),
its statements (tools/queries/records) and lock waits (tools/locks/records), and the
sessions pg_stat_activity showed at the refresh, into one Frame: DB time split by class
(average active sessions, against the CPUs), one row per backend, per wait event, per
statement and per lock, with the window's blocking trees (tools/locks/trees: each
waiter under the root blocker the SQL sampler saw it behind most, with its exact seconds).
DB time = on CPU + waiting for a CPU + the waits that are not idle (as the time model's
`idle`: a ClientRead between transactions, a main loop).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pgprobe import waitevents
from pgprobe.tools.locks import trees as lock_trees
from pgprobe.tools.locks.records import LockRow, LockWait
from pgprobe.tools.locks.trees import Tree, Trees
from pgprobe.tools.queries.records import StatementTime, named_waits
from pgprobe.tools.waits.records import ProcessTime
from pgprobe.waitevents import backend_state

# The header's classes of DB time, in the order drawn; then what is not DB time.
CLASSES = ("CPU", "runqueue", "IO", "Lock", "LWLock", "Client", "other")
IDLE, UNKNOWN = "idle", "unknown"  # not DB time: idle; asleep since before the capture
VIEWS = ("statements", "backends", "waits", "locks")
_DB_CLASSES = frozenset(CLASSES)


@functools.cache  # pure, asked for each process's each event at every refresh
def wait_class(major: int, wei: int) -> str:
    """The class of a sleep in wait event `wei`: one of CLASSES, IDLE or UNKNOWN."""
    if wei == waitevents.BEFORE_CAPTURE:
        return UNKNOWN
    state = backend_state.state_of(major, wei)
    if state is not None:  # ClientRead with the backend's state
        category = backend_state.category(state)
        return IDLE if category == "idle" else UNKNOWN if category == "unknown" else "Client"
    wtype, wname = waitevents.name(major, wei)
    if waitevents.is_idle(wtype, wname):
        return IDLE
    return wtype if wtype in CLASSES else "other"


@functools.cache
def event_name(major: int, wei: int) -> str:
    """The "Type:Name" pg_stat_activity shows a wait event (with ClientRead's state)."""
    wtype, wname = waitevents.name(major, wei)
    state = backend_state.state_of(major, wei)
    name = f"{wname} ({state})" if state else wname
    return f"{wtype}:{name}" if wtype else name


class Session(NamedTuple):
    """A backend as pg_stat_activity showed it at the refresh (a tuple: a thousand a
    refresh)."""

    pid: int
    backend_type: str = ""
    application_name: str = ""
    client: str = ""
    state: str = ""
    xact_age_s: float | None = None
    wait_event: str = ""  # "Type:Name" now, "" when none
    query: str = ""
    datname: str = ""
    usename: str = ""


@dataclass
class BackendRow:
    """One process over the window: its time by class (ns) and its session now."""

    pid: int
    wall_ns: int
    by_class: dict[str, int]
    top_wait: str  # the wait event it slept longest in (DB time only), "" when none
    session: Session
    exited: bool = False

    @property
    def db_ns(self) -> int:
        return sum(ns for c, ns in self.by_class.items() if c in _DB_CLASSES)

    def as_json(self) -> dict[str, Any]:
        s = self.session
        numbers = zip(NUMBER_KEYS, row_numbers(self), strict=True)
        return {"view": "backends", "pid": self.pid, "backend_type": s.backend_type,
                "application_name": s.application_name, "client": s.client,
                "datname": s.datname, "usename": s.usename, "state": s.state,
                "xact_age_s": s.xact_age_s, "wait_event_now": s.wait_event, **dict(numbers),
                "top_wait": self.top_wait, "exited": self.exited, "query": s.query}  # fmt: skip


@dataclass
class WaitRow:
    """One wait event (or on CPU, runqueue) over the window, all processes."""

    event: str  # "Type:Name", or "CPU:on CPU", "CPU:runqueue"
    wclass: str
    ns: int = 0
    sleeps: int = 0
    pids: set[int] = field(default_factory=set)

    def as_json(self) -> dict[str, Any]:
        return {"view": "waits", "event": self.event, "class": self.wclass,
                "total_us": _us(self.ns), "sleeps": self.sleeps,
                "backends": len(self.pids)}  # fmt: skip


@dataclass
class Frame:
    """One refresh: the window's time model and what was seen with it."""

    start_ns: int  # the window on the kernel's monotonic clock
    end_ns: int
    end_unix_s: float
    cpus: int
    by_class: dict[str, int]  # DB time classes, IDLE, UNKNOWN: ns over every process
    process_ns: int  # the processes' wall time in the window (the sum of by_class + rest)
    backends: list[BackendRow]
    waits: list[WaitRow]
    statements: list[StatementTime]
    locks: list[LockRow]
    lock_label: Callable[[LockRow], str]
    lost: list[str]  # one line each: what the capture lost in this window
    major: int
    blocking: Trees | None = None  # who blocked whom; None: no SQL sampler (no session)
    lock_of: dict[int, tuple[str, str]] = field(default_factory=dict)  # waiter: lock, mode

    @property
    def window_s(self) -> float:
        return max(self.end_ns - self.start_ns, 0) / 1e9

    @property
    def db_ns(self) -> int:
        return sum(self.by_class.get(c, 0) for c in CLASSES)

    def aas(self, cls: str | None = None) -> float:
        """Average active sessions: DB time (of one class) per second of the window."""
        ns = self.db_ns if cls is None else self.by_class.get(cls, 0)
        return ns / (self.end_ns - self.start_ns) if self.end_ns > self.start_ns else 0.0


def _key(cls: str) -> str:
    return cls.lower().replace(" ", "_")


def _us(ns: int) -> float:
    # round(ns / 1000, 3) for an int: the same float (a third of the time: 1,000 rows)
    return ns / 1000


CLASS_KEYS = tuple((c, f"{_key(c)}_us") for c in (*CLASSES, IDLE, UNKNOWN))  # JSON's keys
# a backend row's numbers (row_numbers), in its JSON
NUMBER_KEYS = ("wall_us", "db_time_us", *(key for _, key in CLASS_KEYS), "not_accounted_us")


def row_numbers(row: BackendRow) -> tuple[float, ...]:
    """A backend row's numbers in its JSON (µs): wall, DB time, each class, not accounted."""
    by_class = row.by_class
    return (_us(row.wall_ns), _us(row.db_ns),
            *[_us(by_class[c]) if c in by_class else 0.0 for c, _ in CLASS_KEYS],
            _us(row.wall_ns - sum(by_class.values())))  # fmt: skip


def process_classes(p: ProcessTime, major: int) -> dict[str, int]:
    """One process's window by class (ns): CLASSES, IDLE, UNKNOWN."""
    out = {"CPU": p.cpu_ns, "runqueue": sum(p.runq_ns.values())}
    for wei, ns in p.wait_ns.items():
        cls = wait_class(major, wei)
        out[cls] = out.get(cls, 0) + ns
    return out


def backends(
    procs: Iterable[ProcessTime], major: int, sessions: dict[int, Session]
) -> list[BackendRow]:
    """One row per process of the window, the most DB time first."""
    keyed = []
    for p in procs:
        waits = [(ns, wei) for wei, ns in p.wait_ns.items()
                 if ns > 0 and wait_class(major, wei) in CLASSES]  # fmt: skip
        top = event_name(major, max(waits)[1]) if waits else ""
        session = sessions.get(p.pid) or Session(p.pid, "(exited)" if p.exited else "")
        row = BackendRow(p.pid, p.wall_ns, process_classes(p, major), top, session, p.exited)
        keyed.append((-row.db_ns, p.pid, row))  # db_ns summed once, not at each comparison
    keyed.sort(key=lambda k: k[:2])
    return [row for _, _, row in keyed]


def waits(procs: Iterable[ProcessTime], major: int) -> list[WaitRow]:
    """One row per wait event with DB time (and on CPU, runqueue), the longest first."""
    rows: dict[str, WaitRow] = {}

    def add(event: str, cls: str, pid: int, ns: int, sleeps: int = 0) -> None:
        if ns <= 0:
            return
        row = rows.setdefault(event, WaitRow(event, cls))
        row.ns += ns
        row.sleeps += sleeps
        row.pids.add(pid)

    for p in procs:
        add("CPU:on CPU", "CPU", p.pid, p.cpu_ns)
        add("CPU:runqueue", "runqueue", p.pid, sum(p.runq_ns.values()))
        for wei, ns in p.wait_ns.items():
            cls = wait_class(major, wei)
            if cls in CLASSES:
                hist = p.wait_hist.get(wei)
                add(event_name(major, wei), cls, p.pid, ns, hist.count if hist else 0)
    return sorted(rows.values(), key=lambda r: -r.ns)


def totals(rows: Iterable[BackendRow]) -> tuple[dict[str, int], int]:
    """The classes summed over the processes, and their wall time."""
    out: dict[str, int] = defaultdict(int)
    wall = 0
    for r in rows:
        wall += r.wall_ns
        for cls, ns in r.by_class.items():
            out[cls] += ns
    return dict(out), wall


def statement_waits(row: StatementTime, major: int) -> str:
    """A statement's two longest waits, "Type:Name 1.23" (seconds)."""
    return ", ".join(f"{name} {ns / 1e9:.2f}" for name, ns in named_waits(row, major, 2))


def meta(frame: Frame) -> dict[str, Any]:
    """The refresh's header as data (the JSON document's meta, beside the common keys)."""
    return {
        "window_s": round(frame.window_s, 6),
        "cpus": frame.cpus,
        "db_time_us": _us(frame.db_ns),
        "aas": round(frame.aas(), 4),
        "aas_by_class": {_key(c): round(frame.aas(c), 4) for c in CLASSES},
        "seconds_by_class": {
            _key(c): round(frame.by_class.get(c, 0) / 1e9, 6) for c in (*CLASSES, IDLE, UNKNOWN)
        },  # fmt: skip
        "process_seconds": round(frame.process_ns / 1e9, 6),
        "processes": len(frame.backends),
        "lost": list(frame.lost),
        "blocking": None if frame.blocking is None else lock_trees.as_json(frame.blocking,
                                                                           frame.lock_of),
    }  # fmt: skip


def carry(now: Trees, before: Trees | None, waits: Iterable[LockWait]) -> Trees:
    """A window's trees, with each wait that goes on from the window before (none of its
    waits began in this one) and that no sample of this window saw (it ended before the
    first) kept where the samples placed it then, with its seconds of this window."""
    if before is None or not now.unsampled_pids:
        return now
    placed = {pid: (t, t.behind[pid]) for t in before.trees for pid in t.behind}
    begun: dict[int, int] = defaultdict(int)
    exact: dict[int, int] = defaultdict(int)
    for w in waits:
        begun[w.pid] += w.waits
        exact[w.pid] += w.ns
    trees = {t.root: t for t in now.trees}
    left = []
    for pid in now.unsampled_pids:
        if pid not in placed or begun[pid]:
            left.append(pid)
            continue
        old, ahead = placed[pid]
        tree = trees.setdefault(old.root, Tree(old.root, old.session))
        tree.behind[pid], tree.waited_ns[pid] = ahead, exact[pid]
    ordered = sorted(trees.values(), key=lambda t: (-t.total_ns, -len(t.behind), t.root))
    sessions = {**before.sessions, **now.sessions}
    return Trees(ordered, sessions, sum(exact[p] for p in left), left, now.samples)


def tree_rows(blocking: Trees | None) -> list[tuple[Tree, int, int]]:
    """The trees as rows, each root then its waiters depth first (Tree.depth_first):
    (tree, pid, depth), depth 0 the root."""
    trees = blocking.trees if blocking is not None else []
    return [(tree, pid, depth) for tree in trees for pid, depth in tree.depth_first()]


def rows(frame: Frame, backends: bool = True) -> list[dict[str, Any]]:
    """Every row of every view, each with its `view` key (the JSON document's rows);
    backends=False: all but the backends' (jsonline writes those)."""
    window = frame.end_ns - frame.start_ns
    db = frame.db_ns
    out: list[dict[str, Any]] = [r.as_json() for r in frame.backends] if backends else []
    out += [w.as_json() for w in frame.waits]
    out += [{"view": "statements", **s.as_json(frame.major, db, window)}
            for s in frame.statements]  # fmt: skip
    out += [{"view": "locks", **r.as_json(frame.major, frame.lock_label(r))} for r in frame.locks]
    return out
