"""The lock dimension of the compiled time model: each Lock sleep charged to its lock.

bpf/waits.bpf.c, with proc_addr set, reads at a switch-out into a sleep of the Lock class
the lock the backend is queued on, the mode it wants and when its wait began
(pgprobe.waitevents.lockwait), and charges the sleep to that lock: one *wait* is the
sleeps of one lock acquisition (the same lock, mode and start: a backend sleeps again at
each deadlock check and each spurious wakeup). @lock_ns[tid, mode, tag] holds (ns, sleeps,
waits, longest wait); a live process's wait under way is in its @task entry (w_*), and the
sleep still open at a read (lk_*): added here, from the entry the time model kept for its
own open sleep (compiled.py), so that the locks add up to the time model's Lock rows.

The result is one more map in the snapshot, `lock_ns`, keyed (tid, mode, field1, field2,
field3, field4, type, method) -> (ns, sleeps, waits, max_ns).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pgprobe.engines import libbpf
from pgprobe.engines.base import AggValue, Key
from pgprobe.waitevents import lockwait

# proc_ptr; lk (tag0, tag1, mode, start); lk_ok; w (tag0, tag1, mode, start); w_ns, w_sleeps
FIELDS = 12
_LK, _LK_OK, _W, _W_NS = 1, 5, 6, 10
_KEY = struct.Struct("<IIQQ")  # tid, mode, the LOCKTAG's 16 bytes as two words
_VALUE = struct.Struct("<4Q")  # ns, sleeps, waits, max_ns
_WORDS = struct.Struct("<QQ")

LockKey = tuple[int, int, int, int]  # tid, mode, tag0, tag1
Totals = dict[LockKey, tuple[int, int, int, int]]  # (ns, sleeps, waits, max_ns)


@dataclass(frozen=True)
class Dimension:
    """The lock dimension asked of a capture: where each backend's PGPROC is."""

    where: lockwait.LockAddress

    def rodata(self) -> dict[str, int]:
        return {"proc_addr": self.where.proc, "wait_lock_off": self.where.wait_lock_offset}

    def seed(self, pid: int, wei: int) -> tuple[int, ...]:
        """A seeded @task entry's lock fields: for a process asleep in a Lock wait event
        (wei, read just before), the lock it waits for now."""
        if wei >> 24 != lockwait.WAIT_CLASS_LOCK:
            return (0,) * FIELDS
        try:
            waited = lockwait.read(pid, self.where)
        except (OSError, ValueError):
            waited = None
        if waited is None:
            return (0,) * FIELDS
        tag0, tag1 = _WORDS.unpack(lockwait.pack_tag(waited.tag))
        return (0, tag0, tag1, waited.mode, waited.start, 1, *(0,) * 6)


def read_map(obj: libbpf.BpfObject) -> Totals:
    return {_KEY.unpack(k): _VALUE.unpack(v) for k, v in obj.items("lock_ns")}


def _same(a: tuple[int, ...], w: tuple[int, ...]) -> bool:
    """waits.bpf.c's charge_lock(): the same wait (a start not set yet matches any)."""
    return a[:3] == w[:3] and (not a[3] or not w[3] or a[3] == w[3])


@dataclass(frozen=True)
class Part:
    """A live process's entry as the lock dimension reads it: its lock fields, and its
    open sleep as the time model charges it (asleep_in: that sleep's wait event, None:
    none under way; wei: the entry's `a`, the event read at the sleep's switch-out)."""

    fields: tuple[int, ...]
    asleep_in: int | None
    wei: int
    slept: int


def collect(
    obj: libbpf.BpfObject,
    read: Totals,
    before: dict[int, Part],
    kept: dict[int, Part],
    after: dict[int, Part],
) -> dict[Key, AggValue]:
    """`lock_ns` for the snapshot: the map as read, each live process's wait under way and
    open sleep from the entry the time model kept (kept), and a wait that left an entry
    read before the map (before) for the map after the map's read.

    The time model keeps the entry read before the maps when its own map (@wait_ns) moved
    after their read; @lock_ns is read a moment later than @wait_ns, and a wait that left
    that entry in between is in the lock map's read already: then the entry read after
    (after) is the lock dimension's (a process ending there moves both at once)."""
    out = dict(read)
    for pid in before.keys() | kept.keys():
        old = before.get(pid)
        now = kept.get(pid)
        fresh = after.get(pid)
        if now is not None and now == old and fresh and _in_read(obj, pid, now, fresh, read):
            now = fresh
        if now is not None:
            add(out, live(pid, now))
        if old is not None and old != now:
            add(out, moved(obj, pid, old.fields, now.fields if now else (0,) * FIELDS, read))
    return snapshot_map(out)


def live(pid: int, part: Part) -> Totals:
    """A live process's wait under way and its open sleep."""
    fields, slept = part.fields, part.slept
    lk, lk_ok, w = fields[_LK:_LK_OK], fields[_LK_OK], fields[_W:_W_NS]
    w_ns, w_sleeps = fields[_W_NS], fields[_W_NS + 1]
    out: Totals = {}
    open_lock = part.asleep_in is not None and part.asleep_in == part.wei and lk_ok and slept > 0
    if open_lock and w_sleeps and _same(lk, w):
        w_ns, w_sleeps = w_ns + slept, w_sleeps + 1
    elif open_lock:
        out[(pid, lk[2], lk[0], lk[1])] = (slept, 1, 1, slept)
    if w_sleeps:
        key = _wait_key(pid, fields)
        out[key] = merge(out.get(key), (w_ns, w_sleeps, 1, w_ns))
    return out


def merge(
    a: tuple[int, int, int, int] | None, b: tuple[int, int, int, int]
) -> tuple[int, int, int, int]:
    """Two totals of one key: the times, sleeps and waits added, the longest wait kept."""
    if a is None:
        return b
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], max(a[3], b[3]))


def moved(
    obj: libbpf.BpfObject, pid: int, before: tuple[int, ...], after: tuple[int, ...], read: Totals
) -> Totals:
    """The wait under way in the entry read before the map, when it left the entry for the
    map after the map's read (another wait began between the reads): the map has grown
    for its key since."""
    key, w_ns, w_sleeps = _wait_key(pid, before), before[_W_NS], before[_W_NS + 1]
    if not _left(before, after) or not _grown(obj, key, read):
        return {}
    return {key: (w_ns, w_sleeps, 1, w_ns)}


def _wait_key(pid: int, fields: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The lock map's key of the wait under way in an entry: (tid, mode, tag0, tag1)."""
    w = fields[_W:_W_NS]
    return (pid, w[2], w[0], w[1])


def _left(before: tuple[int, ...], after: tuple[int, ...]) -> bool:
    """Whether the wait under way in `before` left the entry by `after`: another wait began
    (its lock, mode or start differ), or it went to the map (its sleeps zeroed: the exit)."""
    w, sleeps = before[_W:_W_NS], before[_W_NS + 1]
    return bool(sleeps) and (after[_W:_W_NS] != w or after[_W_NS + 1] < sleeps)


def _grown(obj: libbpf.BpfObject, key: tuple[int, int, int, int], read: Totals) -> bool:
    """Whether the lock map holds more sleeps for key now than at its read."""
    now = obj.lookup("lock_ns", _KEY.pack(*key))
    return now is not None and _VALUE.unpack(now)[1] > read.get(key, (0, 0, 0, 0))[1]


def _in_read(obj: libbpf.BpfObject, pid: int, old: Part, new: Part, read: Totals) -> bool:
    """Whether the wait under way in `old` left the entry (by `new`) before the lock map's
    read, which then holds it."""
    return _left(old.fields, new.fields) and not _grown(obj, _wait_key(pid, old.fields), read)


def snapshot_map(totals: Totals) -> dict[Key, AggValue]:
    """`lock_ns` as the snapshot holds it: (tid, mode, field1..4, type, method) -> totals."""
    out: dict[Key, AggValue] = {}
    for (tid, mode, tag0, tag1), value in totals.items():
        tag = lockwait.LockTag.unpack(_WORDS.pack(tag0, tag1))
        out[(tid, mode, tag.field1, tag.field2, tag.field3, tag.field4, tag.type,
             tag.method)] = tuple(value)  # fmt: skip
    return out


def add(into: Totals, more: Totals) -> None:
    for key, value in more.items():
        into[key] = merge(into.get(key), value)
