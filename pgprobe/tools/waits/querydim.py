"""The query dimension of the compiled time model: each part of it charged to a statement.

bpf/waits.bpf.c, with query_span set, also keys what it measures by the statement a
backend runs (pgprobe.waitevents.statement): @query_ns[tid, kind, state, wei, id] in ns,
kinds CPU (a run), PREEMPTED (runqueue after a preemption), WOKEN (runqueue right after a
sleep, charged with that sleep), WAIT (a sleep, in wei). Like the rest of the model, a
live process keeps running totals in its @task entry (and the earlier keys' totals in
a cache of QSLOTS slots there, moved to the map when a slot is taken over) and the
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
from typing import NamedTuple, cast

from pgprobe.engines import libbpf
from pgprobe.engines.base import AggValue, Key
from pgprobe.waitevents import statement

CPU, PREEMPTED, WOKEN, WAIT = 1, 2, 3, 4
# qa_state, qa_id, cc0; r_state, r_id, r_cpu, r_rq2; s_state, s_id, s_wei, s_wait, s_rq3;
# span (runs' parts before their last statement); b_state, b_cpu, b_rq2 (between
# statements: after an idle report, id 0); q_next (moves of slots' totals to the map so
# far: a slot taken over, or all of them at the proc_exit()); the slots, 4 fields each:
# pair << 16 | state and wei << 32, id, a, b (waits.bpf.c's qslot)
QSLOTS = 32
_SLOTS_AT = 17
FIELDS = _SLOTS_AT + 4 * QSLOTS
# The marks (waits.bpf.c's mark()), after slept_p: the last one (mk_ns, mk_rd, mk_cc,
# mk_state, mk_id), the first (f_ns, f_rd, f_state, f_id, f_act), what marks charged
# (mk_cpu, mk_pre); mk_ns 0: no mark since the entry's `since`
MARK_FIELDS = 12
PAIR_RUN, PAIR_SLEEP = 1, 2

_KEY = struct.Struct("<IIIIQ")  # tid, pair << 16 | state, wei, pad, id
_PAIR_NS = struct.Struct("<QQ")  # the pair's kinds: (CPU, PREEMPTED) or (WAIT, WOKEN)
_KINDS = {PAIR_RUN: (CPU, PREEMPTED), PAIR_SLEEP: (WAIT, WOKEN)}
# a kind's place in the map: (pair, 0 for a / 1 for b)
_PLACE = {kind: (pair, i) for pair, kinds in _KINDS.items() for i, kind in enumerate(kinds)}
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class Dimension:
    """The query dimension asked of a capture: where the statement is, whether a
    statement without an id is keyed by its text (compute_query_id off), and the server's
    binary (its proc_exit(): where a backend's last statement is read)."""

    where: statement.StatementAddress
    text_hash: bool
    binary: str

    def rodata(self) -> dict[str, int]:
        return self.where.rodata(self.text_hash)

    def uprobes(self) -> dict[str, tuple[str, str]]:
        """The object's uprobe programs: name -> (binary, function)."""
        return {"on_proc_exit": (self.binary, "proc_exit")}

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


class Open(NamedTuple):
    """The interval still open at a read, split as compiled._closed splits it (a tuple:
    made for each process at each read)."""

    on_cpu: int
    preempted: int
    woken: int
    slept: int
    asleep_in: int | None  # the wait event of the open sleep (None: none under way)
    woken_in: int  # the wait event the runqueue time after a wakeup is charged with
    read_at: int = 0  # when the counters were read (monotonic ns): the open run's end
    rd0: int = 0  # run_delay at the entry's `since` (a first mark's runqueue part)


Charges = dict[tuple[int, int, int, int, int], int]


def _add(out: Charges, key: tuple[int, int, int, int, int], ns: int) -> None:
    if ns:
        out[key] = out.get(key, 0) + ns


Slot = tuple[tuple[int, int, int, int, int], int, tuple[int, int, int, int, int], int]


def _slots(tid: int, q: tuple[int, ...]) -> dict[int, Slot]:
    """An entry's slots in use, by index: (key a, ns, key b, ns) as @query_ns keys them."""
    out: dict[int, Slot] = {}
    for i in range(QSLOTS):
        head, qid, a, b = q[_SLOTS_AT + 4 * i : _SLOTS_AT + 4 * i + 4]
        kinds = _KINDS.get((head >> 16) & 0xFFFF)
        if kinds is not None:
            state, wei = head & 0xFFFF, head >> 32
            out[i] = ((tid, kinds[0], state, wei, qid), a, (tid, kinds[1], state, wei, qid), b)
    return out


def run_key(
    base: tuple[int, int, int], now: statement.Read | None, major_rodata: dict[str, int]
) -> tuple[int, int]:
    """The statement of the run under way, as waits.bpf.c's run_key() decides at its end;
    base: (state, id, change count) of the sleep before it or of its last mark."""
    if now is None or now.state & statement.NO_ENTRY or now.changecount == base[2]:
        return base[0], base[1]
    if _ended(now, major_rodata):
        return (now.state & ~0xFF) | major_rodata["active_state"], now.query_id
    return now.state, now.query_id


def _ended(now: statement.Read, rodata: dict[str, int]) -> bool:
    """Between statements (idle, or in a transaction): with reports made since the run's
    start, a statement ended in it."""
    return not now.state & statement.NO_ENTRY and bool(
        (rodata["idle_states"] >> (now.state & 0xFF)) & 1
    )


def _spanned(act_us: int, start: int, length: int, rodata: dict[str, int]) -> int:
    """waits.bpf.c's spanned(): the part of a run (length ns from start) before the
    statement that began at act_us (PostgreSQL's clock), past SPAN_MIN_NS."""
    if not act_us or not length:
        return 0
    began = act_us * 1000 - rodata["pg_clock_ns"]
    return min(began - start, length) if began - start > statement.SPAN_MIN_NS else 0


def _after_report(at_us: int, end: int, cpu: int, rodata: dict[str, int]) -> int:
    """waits.bpf.c's after_report(): the time from the backend's idle report (at_us, its
    clock) to end, at most cpu."""
    at = at_us * 1000 - rodata["pg_clock_ns"]
    return min(max(end - at, 0), cpu) if at_us and at > 0 else 0


def totals(tid: int, q: tuple[int, ...]) -> Charges:
    """What a live process's entry (fields q) holds, not yet in @query_ns: its running
    totals and its slots, as @query_ns keys."""
    r_state, r_id, r_cpu, r_rq2, s_state, s_id, s_wei, s_wait, s_rq3 = q[3:12]
    out: Charges = {}
    _add(out, (tid, CPU, r_state, 0, r_id), r_cpu)
    _add(out, (tid, PREEMPTED, r_state, 0, r_id), r_rq2)
    _add(out, (tid, WAIT, s_state, s_wei, s_id), s_wait)
    _add(out, (tid, WOKEN, s_state, s_wei, s_id), s_rq3)
    _add(out, (tid, CPU, statement.SPANNED, 0, 0), q[12])
    b_state, b_cpu, b_rq2 = q[13:16]
    _add(out, (tid, CPU, b_state, 0, 0), b_cpu)
    _add(out, (tid, PREEMPTED, b_state, 0, 0), b_rq2)
    for key_a, a, key_b, b in _slots(tid, q).values():
        _add(out, key_a, a)
        _add(out, key_b, b)
    return out


def charges(
    tid: int,
    q: tuple[int, ...],
    open_: Open,
    now: statement.Read | None,
    rodata: dict[str, int],
    known_totals: Charges | None = None,
    out: Charges | None = None,
) -> Charges:
    """One live process's running totals and open interval, as @query_ns keys (fields q:
    the query dimension's, the marks', the pid). Its run is split at its marks as
    waits.bpf.c's close_interval splits one: the first mark's part from the run's start,
    the rest (less what marks charged) to the statement read now. known_totals: totals(tid,
    q) when the caller has them (the same entry as at the read before: not copied out).
    out: added into it (a read's map, one dict for all its processes) and returned."""
    out = {} if out is None else out
    _merge(out, known_totals if known_totals is not None else totals(tid, q))
    if open_.on_cpu or open_.preempted or open_.woken or q[FIELDS]:
        _add_run(out, tid, q, open_, now, rodata)
    # else no run since the entry's `since` and no mark (asleep all along: most processes
    # at most reads): every part of the run is 0 (tests/test_querydim.py)
    if open_.asleep_in is not None:
        _add(out, (tid, WAIT, q[0], open_.asleep_in, q[1]), open_.slept)
    return out


Key5 = tuple[int, int, int, int, int]


def sleep_alone(tid: int, q: tuple[int, ...], open_: Open) -> Key5 | None:
    """The key of the open interval's sleep when that sleep is the whole of it (no run since
    the entry's `since`, no mark): charges() then adds the totals and this key's `slept`
    alone (add_asleep). None: charges() must split a run."""
    if open_.on_cpu or open_.preempted or open_.woken or q[FIELDS] or open_.asleep_in is None:
        return None
    return (tid, WAIT, q[0], open_.asleep_in, q[1])


def add_asleep(out: Charges, totals_: Charges, key: Key5, slept: int) -> None:
    """charges() of a process whose open interval is one sleep (sleep_alone: its key), from
    its totals: added into out."""
    _merge(out, totals_)
    _add(out, key, slept)


def _merge(out: Charges, more: Charges) -> None:
    """more added into out. A process's keys are its own (they start with its tid): most
    often none is in out yet, and the dict's own update does it."""
    if out.keys().isdisjoint(more):
        out.update(more)
        return
    for key, ns in more.items():
        out[key] = out.get(key, 0) + ns


def _add_run(
    out: Charges, tid: int, q: tuple[int, ...], open_: Open, now: statement.Read | None,
    rodata: dict[str, int],
) -> None:  # fmt: skip
    """The open interval's run and the runqueue time after its wakeup, split (charges)."""
    qa_state, qa_id = q[0], q[1]
    mk_ns, _rd, mk_cc, mk_state, mk_id, f_ns, f_rd, f_state, f_id, f_act, mk_cpu, mk_pre = q[
        FIELDS : FIELDS + MARK_FIELDS
    ]
    cpu, pre = open_.on_cpu, open_.preempted
    start = open_.read_at - cpu - pre
    base = (qa_state, qa_id, q[2])
    spanned = 0
    if mk_ns:
        w1 = min(max(f_ns - start, 0), cpu + pre)
        q1 = min(max(f_rd - open_.rd0 - open_.woken, 0), w1, pre)
        c1 = min(w1 - q1, cpu)
        _add(out, (tid, CPU, f_state, 0, f_id), c1)
        _add(out, (tid, PREEMPTED, f_state, 0, f_id), q1)
        spanned += _spanned(f_act, start, w1, rodata)
        cpu, pre = max(cpu - c1 - mk_cpu, 0), max(pre - q1 - mk_pre, 0)
        start, base = mk_ns, (mk_state, mk_id, mk_cc)
    rs, rid = run_key(base, now, rodata)
    idle = 0
    if now is not None and now.changecount != base[2]:
        spanned += _spanned(now.activity_start_us, start, max(open_.read_at - start, 0), rodata)
        if _ended(now, rodata):  # its time after the idle report is between statements
            idle = _after_report(now.state_start_us, open_.read_at, cpu, rodata)
            _add(out, (tid, CPU, now.state, 0, 0), idle)
    _add(out, (tid, CPU, statement.SPANNED, 0, 0), spanned)  # counted, not moved
    _add(out, (tid, CPU, rs, 0, rid), cpu - idle)
    _add(out, (tid, PREEMPTED, rs, 0, rid), pre)
    _add(out, (tid, WOKEN, qa_state, open_.woken_in, qa_id), open_.woken)


def read_map(obj: libbpf.BpfObject) -> Charges:
    out: Charges = {}
    for k, v in obj.items("query_ns"):
        tid, pair_state, wei, _pad, qid = _KEY.unpack(k)
        kinds = _KINDS.get(pair_state >> 16)
        if kinds is None:
            continue
        state = pair_state & 0xFFFF
        for kind, ns in zip(kinds, _PAIR_NS.unpack(v), strict=True):
            _add(out, (tid, kind, state, wei, qid), ns)
    return out


def _lookup(obj: libbpf.BpfObject, key: tuple[int, int, int, int, int]) -> int:
    tid, kind, state, wei, qid = key
    pair, half = _PLACE[kind]
    value = obj.lookup("query_ns", _KEY.pack(tid, pair << 16 | state, wei, 0, qid))
    return _PAIR_NS.unpack(value)[half] if value is not None else 0


def _grown(
    obj: libbpf.BpfObject, keys: list[tuple[int, int, int, int, int]], read: Charges
) -> bool:
    """Whether @query_ns holds more for any of these keys now than it did at the read."""
    return any(_lookup(obj, k) > read.get(k, 0) for k in keys)


def snapshot_map(
    obj: libbpf.BpfObject,
    read: Charges,
    before: dict[int, tuple[int, ...]],
    after: dict[int, tuple[int, ...]],
    live: Callable[[Charges, int, tuple[int, ...]], None],
) -> dict[Key, AggValue]:
    """@query_ns as read, plus each live process's totals and open interval (live(out,
    pid, fields) adds them into out), from its entry read after the map. Totals that left
    the entry between its two reads (a slot taken over, or the process's exit) are in the
    map read when they moved before it, else only in the entry read before the map: added
    from there when the map has grown for their keys since its read (fields end with the
    pid)."""
    out: Charges = dict(read)
    for pid in before.keys() | after.keys():
        old, new = before.get(pid), after.get(pid)
        if new is None:
            # exited between the reads: all of it went to the map at its last switch-out
            if old is not None and _grown(obj, list(totals(pid, old)), read):
                with contextlib.suppress(KeyError):
                    live(out, pid, old)
            continue
        with contextlib.suppress(KeyError):
            live(out, pid, new)
        if old is None or old[_SLOTS_AT - 1] == new[_SLOTS_AT - 1]:
            continue  # no slot's totals moved between the reads
        kept = _slots(pid, new)
        for i, (key_a, a, key_b, b) in _slots(pid, old).items():
            now = kept.get(i)
            moved = now is None or now[0] != key_a or now[1] < a or now[3] < b
            if moved and _grown(obj, [key_a, key_b], read):
                _add(out, key_a, a)
                _add(out, key_b, b)
    return cast(dict[Key, AggValue], out)
