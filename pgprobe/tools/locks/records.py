"""Heavyweight lock waits from the snapshot's `lock_ns`: pure functions, no I/O.

lock_ns (tools/waits/lockdim.py) -> LockWait per (waiter, lock, mode) -> LockRow per (lock,
mode) over its waiters. Beside them, each waiter's Lock time in the time model of the same
capture (its Lock:* wait events): what is there and not under a lock is a sleep whose lock
was not read (begun before the capture and not readable at its start, or a failed read),
said, never dropped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pgprobe.engines.base import Snapshot
from pgprobe.pgstats.locks import LockTarget
from pgprobe.pgstats.relnames import RelationNames
from pgprobe.tools.waits.records import ProcessTime
from pgprobe.waitevents import lockwait

Tag = lockwait.LockTag  # the lock, as the backend holds it


@dataclass(frozen=True)
class LockWait:
    """One waiter's sleeps on one lock in one mode, over the window."""

    pid: int
    tag: lockwait.LockTag
    mode: int
    ns: int
    sleeps: int
    waits: int  # lock acquisitions waited for (a wait sleeps again at each deadlock check)
    max_ns: int  # the longest of them (its part in the window)

    @property
    def mode_name(self) -> str:
        return lockwait.mode_name(self.mode)


def lock_waits(snapshot: Snapshot, keep: Callable[[int], bool]) -> list[LockWait]:
    """The snapshot's lock waits of the processes kept, longest first."""
    out = []
    for key, value in snapshot.get("lock_ns").items():
        if len(key) != 8 or not isinstance(value, tuple) or len(value) != 4:
            continue
        tid, mode, f1, f2, f3, f4, kind, method = (int(str(k)) for k in key)
        if keep(tid) and value[0] > 0:
            tag = lockwait.LockTag(f1, f2, f3, f4, kind, method)
            out.append(LockWait(tid, tag, mode, *value))
    return sorted(out, key=lambda w: (-w.ns, w.pid))


def since(before: list[LockWait], now: list[LockWait]) -> list[LockWait]:
    """The waits of a window: now's cumulative totals less before's, key by key (the
    longest wait is the capture's so far: a maximum has no difference)."""
    old = {(w.pid, w.tag, w.mode): w for w in before}
    out = []
    for w in now:
        b = old.get((w.pid, w.tag, w.mode))
        if b is None:
            out.append(w)
        elif w.ns > b.ns:
            out.append(LockWait(w.pid, w.tag, w.mode, w.ns - b.ns, w.sleeps - b.sleeps,
                                w.waits - b.waits, w.max_ns))  # fmt: skip
    return out


def model_lock_ns(procs: Iterable[ProcessTime]) -> dict[int, int]:
    """Each process's time in Lock:* wait events, by the time model."""
    out = {}
    for p in procs:
        ns = sum(v for wei, v in p.wait_ns.items() if wei >> 24 == lockwait.WAIT_CLASS_LOCK)
        if ns:
            out[p.pid] = ns
    return out


def not_read_ns(waits: Iterable[LockWait], model: dict[int, int]) -> dict[int, int]:
    """Per waiter, its Lock time in the time model not charged to any lock."""
    charged: dict[int, int] = defaultdict(int)
    for w in waits:
        charged[w.pid] += w.ns
    return {pid: ns - charged[pid] for pid, ns in model.items() if ns - charged[pid] > 0}


@dataclass
class LockRow:
    """One lock in one mode, over its waiters."""

    tag: lockwait.LockTag
    mode: int
    ns: int = 0
    sleeps: int = 0
    waits: int = 0
    max_ns: int = 0
    waiters: dict[int, int] = field(default_factory=dict)  # pid -> ns

    @property
    def mode_name(self) -> str:
        return lockwait.mode_name(self.mode)

    def as_json(self, major: int, label: str) -> dict[str, Any]:
        return {
            "lock": label,
            "locktype": self.tag.locktype(major),
            **self.tag.columns(major),
            "mode": lockwait.mode_name(self.mode),
            "total_us": round(self.ns / 1000, 3),
            "waits": self.waits,
            "sleeps": self.sleeps,
            "max_us": round(self.max_ns / 1000, 3),
            "waiters": [{"pid": pid, "total_us": round(ns / 1000, 3)}
                        for pid, ns in sorted(self.waiters.items(), key=lambda x: -x[1])],
        }  # fmt: skip


def by_lock(waits: Iterable[LockWait]) -> list[LockRow]:
    """The waits summed per (lock, mode), longest total first."""
    rows: dict[tuple[lockwait.LockTag, int], LockRow] = {}
    for w in waits:
        row = rows.setdefault((w.tag, w.mode), LockRow(w.tag, w.mode))
        row.ns += w.ns
        row.sleeps += w.sleeps
        row.waits += w.waits
        row.max_ns = max(row.max_ns, w.max_ns)
        row.waiters[w.pid] = row.waiters.get(w.pid, 0) + w.ns
    return sorted(rows.values(), key=lambda r: -r.ns)


def label(tag: lockwait.LockTag, major: int, names: RelationNames) -> str:
    """The lock for a DBA, as the SQL sampler names the locks it sees (LockTarget.label):
    the table (and block, row) it is on, the transaction, ..."""
    return target(tag, major, names).label()


def target(tag: lockwait.LockTag, major: int, names: RelationNames) -> LockTarget:
    """The lock as pg_locks gives it (pgprobe.pgstats.locks), its names resolved."""
    columns = tag.columns(major)
    db = int(columns.get("database") or 0)
    rel = int(columns.get("relation") or 0)
    local = db in (0, names.here)
    return LockTarget(locktype=tag.locktype(major), **columns,  # type: ignore[arg-type]
                      local=local, relname=names.relname(rel) if local and rel else None,
                      datname=names.databases.get(db))  # fmt: skip


def oids(waits: Iterable[LockWait], major: int) -> tuple[set[int], set[int]]:
    """The database and relation OIDs the waits' locks name."""
    dbs, rels = set(), set()
    for w in waits:
        c = w.tag.columns(major)
        if c.get("database"):
            dbs.add(int(c["database"] or 0))
        if c.get("relation"):
            rels.add(int(c["relation"] or 0))
    return dbs, rels


SECTION_ROWS = 20  # locks in triage's section: the longest waited on


def lock_of(waits: Iterable[LockWait], label: Callable[[Tag], str]) -> dict[int, tuple[str, str]]:
    """Each waiter's lock (the one it waited on longest) and mode, named."""
    out: dict[int, tuple[str, str, int]] = {}
    for w in waits:
        if w.pid not in out or w.ns > out[w.pid][2]:
            out[w.pid] = (label(w.tag), w.mode_name, w.ns)
    return {pid: (lock, mode) for pid, (lock, mode, _) in out.items()}


def section(
    waits: list[LockWait],
    major: int,
    names: RelationNames,
    not_read: dict[int, int],
    blocking: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """triage's `locks` section (in its time model): the locks waited on longest, and the
    blocking trees (pgprobe locks' meta.blocking) when the sampler ran."""
    rows = by_lock(waits)
    return {
        **({"blocking": blocking} if blocking is not None else {}),
        "rows": [r.as_json(major, label(r.tag, major, names)) for r in rows[:SECTION_ROWS]],
        "more_locks": max(len(rows) - SECTION_ROWS, 0),
        "lock_wait_us": round(sum(w.ns for w in waits) / 1000, 3),
        "lock_not_read_us": round(sum(not_read.values()) / 1000, 3),
    }
