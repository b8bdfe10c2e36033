"""The query dimension of the compiled time model: each part of it charged to a statement.

bpf/waits.bpf.c, with query_span set, also keys what it measures by the statement a
backend runs (pgprobe.waitevents.statement): @query_ns[tid, kind, state, wei, id] in ns,
kinds CPU (a run), PREEMPTED (runqueue after a preemption), WOKEN (runqueue right after a
sleep, charged with that sleep), WAIT (a sleep, in wei). Like the rest of the model, a
live process keeps running totals in its @task entry (fields 63-74 here) and the
interval still open at a read is closed by pgprobe from /proc: its run charged to the
statement read from the backend's memory now, its sleep to the one read when it began.
The result is one more map in the snapshot, `query_ns`, keyed (tid, kind, state, wei,
id) as the object keys it; tools/queries/records.py reads it.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

from pgprobe.engines import libbpf
from pgprobe.engines.base import AggValue, Key
from pgprobe.waitevents import statement

CPU, PREEMPTED, WOKEN, WAIT = 1, 2, 3, 4
# qa_state, qa_id, cc0; r_state, r_id, r_cpu, r_rq2; s_state, s_id, s_wei, s_wait, s_rq3;
# span (runs' parts before their last statement)
FIELDS = 13
_KEY = struct.Struct("<IIIIQ")  # tid, kind << 16 | state, wei, pad, id
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Dimension:
    """The query dimension asked of a capture: where the statement is, and whether a
    statement without an id is keyed by its text (compute_query_id off)."""

    where: statement.StatementAddress
    text_hash: bool

    def rodata(self) -> dict[str, int]:
        return self.where.rodata(self.text_hash)

    def read(self, pid: int) -> statement.Read | None:
        """pid's statement now (None: its memory cannot be read)."""
        try:
            return statement.read(pid, self.where, self.text_hash)
        except (OSError, ValueError):
            return None

    def seed(self, pid: int) -> tuple[int, ...]:
        """A seeded @task entry's query fields: the statement read now, no totals."""
        now = self.read(pid)
        head = (now.state, now.query_id, now.changecount) if now else (statement.NO_ENTRY, 0, 0)
        return (*head, *[0] * (FIELDS - 3))


@dataclass(frozen=True)
class Open:
    """The interval still open at a read, split as compiled._closed splits it."""

    on_cpu: int
    preempted: int
    woken: int
    slept: int
    asleep_in: int | None  # the wait event of the open sleep (None: none under way)
    woken_in: int  # the wait event the runqueue time after a wakeup is charged with
    read_at: int = 0  # when the counters were read (monotonic ns): the open run's end


Charges = dict[tuple[int, int, int, int, int], int]


def _add(out: Charges, key: tuple[int, int, int, int, int], ns: int) -> None:
    if ns:
        out[key] = out.get(key, 0) + ns


def run_key(
    q: tuple[int, ...], now: statement.Read | None, major_rodata: dict[str, int]
) -> tuple[int, int]:
    """The statement of the run under way, as waits.bpf.c's run_key() decides at its end."""
    qa_state, qa_id, cc0 = q[0], q[1], q[2]
    if now is None or now.state & statement.NO_ENTRY or now.changecount == cc0:
        return qa_state, qa_id
    raw = now.state & 0xFF
    if (major_rodata["idle_states"] >> raw) & 1:
        return (now.state & ~0xFF) | major_rodata["active_state"], now.query_id
    return now.state, now.query_id


def _before_statement(
    q: tuple[int, ...], now: statement.Read | None, open_: Open, rodata: dict[str, int]
) -> int:
    """The part of the open run before the statement read now began (waits.bpf.c's
    Q_SPANNED): an earlier statement of the same run, past SPAN_MIN_NS."""
    run = open_.on_cpu + open_.preempted
    if now is None or not now.activity_start_us or now.changecount == q[2] or not run:
        return 0
    began = now.activity_start_us * 1000 - rodata["pg_clock_ns"]
    since = open_.read_at - run
    return min(began - since, run) if began - since > statement.SPAN_MIN_NS else 0


def charges(
    tid: int, q: tuple[int, ...], open_: Open, now: statement.Read | None, rodata: dict[str, int]
) -> Charges:
    """One live process's running totals and open interval, as @query_ns keys."""
    qa_state, qa_id = q[0], q[1]
    r_state, r_id, r_cpu, r_rq2, s_state, s_id, s_wei, s_wait, s_rq3 = q[3:12]
    out: Charges = {}
    _add(out, (tid, CPU, r_state, 0, r_id), r_cpu)
    _add(out, (tid, PREEMPTED, r_state, 0, r_id), r_rq2)
    _add(out, (tid, WAIT, s_state, s_wei, s_id), s_wait)
    _add(out, (tid, WOKEN, s_state, s_wei, s_id), s_rq3)
    _add(out, (tid, CPU, statement.SPANNED, 0, 0), q[12])
    rs, rid = run_key(q, now, rodata)
    before = _before_statement(q, now, open_, rodata)
    cpu_before = open_.on_cpu * before // (open_.on_cpu + open_.preempted) if before else 0
    _add(out, (tid, CPU, statement.SPANNED, 0, 0), before)
    _add(out, (tid, CPU, rs, 0, rid), open_.on_cpu - cpu_before)
    _add(out, (tid, PREEMPTED, rs, 0, rid), open_.preempted - (before - cpu_before))
    _add(out, (tid, WOKEN, qa_state, open_.woken_in, qa_id), open_.woken)
    if open_.asleep_in is not None:
        _add(out, (tid, WAIT, qa_state, open_.asleep_in, qa_id), open_.slept)
    return out


def read_map(obj: libbpf.BpfObject) -> Charges:
    out: Charges = {}
    for k, v in obj.items("query_ns"):
        tid, kind_state, wei, _pad, qid = _KEY.unpack(k)
        out[(tid, kind_state >> 16, kind_state & 0xFFFF, wei, qid)] = _U64.unpack(v)[0]
    return out


def _lookup(obj: libbpf.BpfObject, key: tuple[int, int, int, int, int]) -> int:
    tid, kind, state, wei, qid = key
    value = obj.lookup("query_ns", _KEY.pack(tid, kind << 16 | state, wei, 0, qid))
    return _U64.unpack(value)[0] if value is not None else 0


def _flushed_after_read(obj: libbpf.BpfObject, q: tuple[int, ...], read: Charges) -> bool:
    """Whether the running totals of entry fields q moved to @query_ns after it was read
    (the key grown since): then that entry's totals are in no map read."""
    tid = q[-1]
    keys = [(tid, CPU, q[3], 0, q[4]), (tid, PREEMPTED, q[3], 0, q[4]),
            (tid, WAIT, q[7], q[9], q[8]), (tid, WOKEN, q[7], q[9], q[8])]  # fmt: skip
    return any(
        _lookup(obj, k) > read.get(k, 0)
        for k, n in zip(keys, (q[5], q[6], q[10], q[11]), strict=True)
        if n
    )


def _keys(q: tuple[int, ...]) -> tuple[int, ...]:
    """The keys of an entry's running totals: when they change, the totals were moved."""
    return (q[3], q[4], q[7], q[8], q[9])


def snapshot_map(
    obj: libbpf.BpfObject,
    read: Charges,
    before: dict[int, tuple[int, ...]],
    after: dict[int, tuple[int, ...]],
    live: Callable[[int, tuple[int, ...]], Charges],
) -> dict[Key, AggValue]:
    """@query_ns as read, plus each live process's running totals and open interval
    (live(pid, fields) with the entry kept: read after the map, unless its totals moved to
    the map in between, read before; fields end with the pid)."""
    out: Charges = dict(read)
    for pid in before.keys() | after.keys():
        old, new = before.get(pid), after.get(pid)
        kept = new
        moved = old is not None and (new is None or _keys(old) != _keys(new))
        if old is not None and moved and _flushed_after_read(obj, old, read):
            kept = old
        if kept is None:
            continue
        with contextlib.suppress(KeyError):
            for key, ns in live(pid, kept).items():
                out[key] = out.get(key, 0) + ns
    result: dict[Key, AggValue] = {}
    result.update(out.items())
    return result
