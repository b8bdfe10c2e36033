"""Samples from a perf.data file written by ``perf record --call-graph dwarf``.

Reads only what pgprobe asks perf for: one event (cpu-clock) whose samples
carry the pid, the kernel callchain, the user registers and a copy of the
top of the user stack (PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER), and
the PERF_RECORD_LOST records. The layout is the kernel's (struct
perf_event_attr, the PERF_RECORD_SAMPLE body in sample_type bit order) and
perf's file header (tools/perf/Documentation/perf.data-file-format.txt).
perf's own `perf script` unwinds with libdw or libunwind, which stop at code
without CFI (PostgreSQL's JIT code); pgprobe unwinds the copied bytes itself
(pgprobe.unwind.dwarf), falling back to frame pointers there.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

MAGIC = b"PERFILE2"
RECORD_LOST = 2
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


@dataclass
class PerfData:
    samples: list[Sample]
    lost: int  # samples the kernel dropped (ring buffer full)
    stack_size: int  # bytes of user stack asked for per sample
    file_bytes: int


def read(path: str) -> PerfData:
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 104:
            raise PerfDataError(f"{path}: too short for a perf.data file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _parse(memoryview(data).toreadonly(), size)


def _parse(data: memoryview, size: int) -> PerfData:
    if bytes(data[:8]) != MAGIC:
        raise PerfDataError("not a perf.data file (bad magic)")
    _, attr_size, attrs_off, attrs_size, data_off, data_size = struct.unpack_from(
        "<QQQQQQ", data, 8
    )
    if attrs_size // attr_size != 1:
        raise PerfDataError(f"expected one event, found {attrs_size // attr_size}")
    sample_type, read_format = struct.unpack_from("<QQ", data, attrs_off + 24)
    regs_mask, stack_size = struct.unpack_from("<QI", data, attrs_off + 80)
    if read_format and sample_type & _READ:
        raise PerfDataError("samples with PERF_SAMPLE_READ are not supported")
    reg_numbers = [n for n in range(64) if regs_mask >> n & 1]
    samples: list[Sample] = []
    lost = 0
    pos, end = data_off, min(data_off + data_size, size)
    unpack = struct.unpack_from
    while pos + 8 <= end:
        rtype, misc, rsize = unpack("<IHH", data, pos)
        if rsize < 8:
            raise PerfDataError(f"corrupt record at offset {pos}")
        if rtype == RECORD_SAMPLE:
            sample = _sample(data, pos + 8, sample_type, reg_numbers, misc)
            if sample is not None:
                samples.append(sample)
        elif rtype in (RECORD_LOST, RECORD_LOST_SAMPLES):
            lost += unpack("<Q", data, pos + (16 if rtype == RECORD_LOST else 8))[0]
        pos += rsize
    return PerfData(samples, lost, stack_size, size)


def _sample(
    data: memoryview, pos: int, sample_type: int, reg_numbers: list[int], misc: int
) -> Sample | None:
    unpack = struct.unpack_from
    for bit in (_IDENTIFIER, _IP):
        if sample_type & bit:
            pos += 8
    pid = 0
    if sample_type & _TID:
        pid = unpack("<I", data, pos)[0]
        pos += 8
    for bit in (_TIME, _ADDR, _ID, _STREAM_ID, _CPU, _PERIOD):
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
    return Sample(pid, tuple(kernel), regs, stack, user_mode)
