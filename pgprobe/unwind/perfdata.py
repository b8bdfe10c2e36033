"""Samples from a perf.data file written by ``perf record --call-graph dwarf``.

Reads only what pgprobe asks perf for: one event (cpu-clock, or a uprobe)
whose samples carry the pid, the kernel callchain, the user registers and a
copy of the top of the user stack (PERF_SAMPLE_REGS_USER |
PERF_SAMPLE_STACK_USER), perf's tracking event (``dummy``, added with
``-a``: it never samples, it carries the FORK records), the PERF_RECORD_FORK
and PERF_RECORD_EXIT records and the PERF_RECORD_LOST ones.

``read(path, roots, each)`` hands each sample of the processes in roots and of
their descendants to ``each``, by the FORK and EXIT records in the file (a
system-wide capture, ``perf record -a``, holds every process's samples: backends
forked during the capture are found so, other clusters and the rest of the machine
are dropped before their stack copies are made into objects). The first pass reads
only record headers, forks, exits and losses; the second decodes the samples kept,
one at a time: memory does not grow with the file (a long capture's 16 KiB stack
copies were all held at once before: 96 MB of heap for a 227 MB file).

The layout is the kernel's (struct perf_event_attr, the PERF_RECORD_SAMPLE
body in sample_type bit order) and perf's file header
(tools/perf/Documentation/perf.data-file-format.txt).
perf's own `perf script` unwinds with libdw or libunwind, which stop at code
without CFI (PostgreSQL's JIT code); pgprobe unwinds the copied bytes itself
(pgprobe.unwind.dwarf), falling back to frame pointers there.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

MAGIC = b"PERFILE2"
RECORD_LOST = 2
RECORD_EXIT = 4
RECORD_FORK = 7
RECORD_SAMPLE = 9
RECORD_LOST_SAMPLES = 13
CONTEXT_MAX = 0xFFFFFFFFFFFFF000  # callchain entries above this mark a context (kernel/user)
CONTEXT_USER = 0xFFFFFFFFFFFFFE00

# sample_type bits, in the order their fields appear in a sample
_IDENTIFIER, _IP, _TID, _TIME, _ADDR, _READ, _CALLCHAIN, _ID, _CPU, _PERIOD = (
    1 << 16, 1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8,
)  # fmt: skip
_STREAM_ID, _RAW, _BRANCH_STACK, _REGS_USER, _STACK_USER = (
    1 << 9, 1 << 10, 1 << 11, 1 << 12, 1 << 13,
)  # fmt: skip
# x86-64 perf register numbers (arch/x86/include/uapi/asm/perf_regs.h) -> DWARF numbers
_PERF_TO_DWARF = {0: 0, 1: 3, 2: 2, 3: 1, 4: 4, 5: 5, 6: 6, 7: 7, 8: 16,
                  **{16 + i: 8 + i for i in range(8)}}  # fmt: skip


class PerfDataError(ValueError):
    """Not a perf.data file pgprobe can read."""


@dataclass(frozen=True, slots=True)
class Sample:
    pid: int
    kernel: tuple[int, ...]  # kernel callchain, innermost first (empty: user mode)
    regs: dict[int, int]  # user registers by DWARF number (16: the instruction pointer)
    stack: bytes  # the user stack from regs[7] (rsp) up, as copied
    user_mode: bool  # the sample interrupted user code
    time: int = 0  # the sample's timestamp (perf's clock: -k monotonic gives bpftrace's nsecs)


@dataclass
class PerfData:
    kept: int  # samples handed to each: the roots' and their descendants' (or every one)
    lost: int  # samples the kernel dropped (ring buffer full), of every process recorded
    stack_size: int  # bytes of user stack asked for per sample
    file_bytes: int
    samples_in_file: int = 0  # of every process, before keeping the roots' tree
    pids_kept: frozenset[int] = frozenset()  # the roots and the descendants found


PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_DUMMY = 9


def read(path: str, roots: Iterable[int] | None, each: Callable[[Sample], None]) -> PerfData:
    """Each sample in path to each (with roots, only those of roots and their descendants)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 104:
            raise PerfDataError(f"{path}: too short for a perf.data file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            view = memoryview(data).toreadonly()
            try:
                return _parse(view, size, None if roots is None else frozenset(roots), each)
            finally:
                view.release()


def _sample_type(data: memoryview, attrs_off: int, attrs_size: int, attr_size: int) -> int:
    """The sample_type of the sampling event; perf's dummy tracking event may sit beside it."""
    types: set[int] = set()
    sampling = 0
    for off in range(attrs_off, attrs_off + attrs_size, attr_size):
        etype, _, config = struct.unpack_from("<IIQ", data, off)
        (stype,) = struct.unpack_from("<Q", data, off + 24)
        types.add(stype)
        if not (etype == PERF_TYPE_SOFTWARE and config == PERF_COUNT_SW_DUMMY):
            sampling += 1
    if sampling != 1 or len(types) != 1:
        raise PerfDataError(f"expected one sampling event, found {sampling}")
    return types.pop()


def _parse(
    data: memoryview, size: int, roots: frozenset[int] | None, each: Callable[[Sample], None]
) -> PerfData:
    if bytes(data[:8]) != MAGIC:
        raise PerfDataError("not a perf.data file (bad magic)")
    _, attr_size, attrs_off, attrs_size, data_off, data_size = struct.unpack_from(
        "<QQQQQQ", data, 8
    )
    if not attr_size or not attrs_size:
        raise PerfDataError("no event in the file")
    sample_type = _sample_type(data, attrs_off, attrs_size, attr_size)
    # Every attr has the same sample_type and register mask (checked above for the type).
    (read_format,) = struct.unpack_from("<Q", data, attrs_off + 32)
    regs_mask, stack_size = struct.unpack_from("<QI", data, attrs_off + 80)
    if read_format and sample_type & _READ:
        raise PerfDataError("samples with PERF_SAMPLE_READ are not supported")
    reg_numbers = [n for n in range(64) if regs_mask >> n & 1]
    pid_at = 8 * sum(1 for bit in (_IDENTIFIER, _IP) if sample_type & bit)
    has_pid, has_time = bool(sample_type & _TID), bool(sample_type & _TIME)
    time_at = pid_at + 8 * has_pid
    events: list[tuple[int, int, int, int]] = []  # (time, FORK or EXIT, pid, parent)
    lost = in_file = 0
    pids: set[int] = set()
    start, end = data_off, min(data_off + data_size, size)
    unpack = struct.unpack_from
    # Pass 1: forks, exits and losses only (most samples of a system-wide capture are
    # dropped: which, the forks and exits say).
    for pos, rtype, _ in _records(data, start, end):
        if rtype == RECORD_SAMPLE:
            in_file += 1
            if roots is None and has_pid:
                pids.add(unpack("<I", data, pos + 8 + pid_at)[0])
        elif rtype in (RECORD_FORK, RECORD_EXIT):
            pid, ppid, tid, _, stamp = unpack("<IIIIQ", data, pos + 8)
            # a new process (not a thread: pid == ppid), or a process's end (its main
            # thread's: pid == tid); without sample times, forks only
            if rtype == RECORD_FORK and pid != ppid:
                events.append((stamp if has_time else 0, rtype, pid, ppid))
            elif rtype == RECORD_EXIT and pid == tid and has_time:
                events.append((stamp, rtype, pid, ppid))
        elif rtype in (RECORD_LOST, RECORD_LOST_SAMPLES):
            lost += unpack("<Q", data, pos + (16 if rtype == RECORD_LOST else 8))[0]
    lives = None if roots is None else _lives(roots, events)
    kept = 0
    # Pass 2: the samples kept, decoded and handed over one at a time.
    for pos, rtype, misc in _records(data, start, end):
        if rtype != RECORD_SAMPLE:
            continue
        if lives is not None:
            pid = unpack("<I", data, pos + 8 + pid_at)[0] if has_pid else 0
            stamp = unpack("<Q", data, pos + 8 + time_at)[0] if has_time else 0
            if not any(first <= stamp <= last for first, last in lives.get(pid, ())):
                continue
        each(_sample(data, pos + 8, sample_type, reg_numbers, misc))
        kept += 1
    kept_pids = frozenset(pids) if lives is None else frozenset(lives)
    return PerfData(kept, lost, stack_size, size, in_file, kept_pids)


def _records(data: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(offset, type, misc) of each record between pos and end."""
    unpack = struct.unpack_from
    while pos + 8 <= end:
        rtype, misc, rsize = unpack("<IHH", data, pos)
        if rsize < 8:
            raise PerfDataError(f"corrupt record at offset {pos}")
        yield pos, rtype, misc
        pos += rsize


def _lives(
    roots: frozenset[int], events: list[tuple[int, int, int, int]]
) -> dict[int, list[tuple[int, int]]]:
    """{pid: [(from, to)]}: when each pid was a root or a descendant of one.

    Roots count from the start; a process forked by a member, from its FORK; each,
    until its EXIT. So a pid the kernel reuses for an unrelated process during the
    capture (pid_max is 32,768 on many systems) does not bring that process in.
    """
    alive = dict.fromkeys(roots, -1)
    lives: dict[int, list[tuple[int, int]]] = {}
    for stamp, kind, pid, ppid in sorted(events):
        if kind == RECORD_FORK and ppid in alive and pid not in alive:
            alive[pid] = stamp
        elif kind == RECORD_EXIT and pid in alive:
            lives.setdefault(pid, []).append((alive.pop(pid), stamp))
    for pid, start in alive.items():
        lives.setdefault(pid, []).append((start, 1 << 64))
    return lives


def _sample(
    data: memoryview, pos: int, sample_type: int, reg_numbers: list[int], misc: int
) -> Sample:
    unpack = struct.unpack_from
    for bit in (_IDENTIFIER, _IP):
        if sample_type & bit:
            pos += 8
    pid = 0
    if sample_type & _TID:
        pid = unpack("<I", data, pos)[0]
        pos += 8
    stamp = 0
    if sample_type & _TIME:
        stamp = unpack("<Q", data, pos)[0]
        pos += 8
    for bit in (_ADDR, _ID, _STREAM_ID, _CPU, _PERIOD):
        if sample_type & bit:
            pos += 8
    kernel: list[int] = []
    if sample_type & _CALLCHAIN:
        (nr,) = unpack("<Q", data, pos)
        chain = unpack(f"<{nr}Q", data, pos + 8)
        pos += 8 + 8 * nr
        in_kernel = True
        for ip in chain:
            if ip >= CONTEXT_MAX:
                in_kernel = ip != CONTEXT_USER
                continue
            if in_kernel:
                kernel.append(ip)
    if sample_type & _RAW:
        (raw,) = unpack("<I", data, pos)
        pos += 4 + raw
    if sample_type & _BRANCH_STACK:
        raise PerfDataError("samples with branch stacks are not supported")
    regs: dict[int, int] = {}
    if sample_type & _REGS_USER:
        (abi,) = unpack("<Q", data, pos)
        pos += 8
        if abi:
            values = unpack(f"<{len(reg_numbers)}Q", data, pos)
            pos += 8 * len(reg_numbers)
            regs = {
                _PERF_TO_DWARF[n]: v for n, v in zip(reg_numbers, values, strict=True)
                if n in _PERF_TO_DWARF
            }  # fmt: skip
    stack = b""
    if sample_type & _STACK_USER:
        (size,) = unpack("<Q", data, pos)
        pos += 8
        if size:
            (dyn,) = unpack("<Q", data, pos + size)
            stack = bytes(data[pos : pos + min(dyn, size)])
    user_mode = misc & 7 == 2  # PERF_RECORD_MISC_USER
    return Sample(pid, tuple(kernel), regs, stack, user_mode, stamp)
