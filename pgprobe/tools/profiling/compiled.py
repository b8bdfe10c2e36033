"""CPU samples from bpf/profile.bpf.c, compiled: its ring buffer counted into profile.bt's maps.

The object sends each sample of a target (its pid, statement and frames) through a ring
buffer; this module counts them into the maps profile.bt prints (@stacks, @kstacks,
@qstacks, @qkstacks, @samples), so naming.py reads either the same way. It is used when
scripts/build-bpf has built it (or the wheel carries it) and this kernel loads it;
otherwise pgprobe runs bpf/profile.bt and says why in one line. `--engine bpftrace` asks
for the script. Why: no bpftrace process (its start and LLVM compile, ~100 MiB), no stack
map (bpftrace's holds 128 MiB of kernel memory and refuses a stack whose bucket is taken).
"""

from __future__ import annotations

import struct
import time
from collections import Counter
from pathlib import Path

from pgprobe.engines import compiled as engine
from pgprobe.engines import libbpf
from pgprobe.engines.base import AggValue, Key, RunInfo, Snapshot
from pgprobe.engines.compiled import CompiledCapture

OBJECT = "profile.bpf.o"
PROGRAM = "on_sample"
SAMPLED, LOST = 0, 1  # the object's `scalars` slots
# struct sample's header: pid, state, query_id, ubytes, kbytes; then the frames
_HEADER = struct.Struct("<IIqII")
_FRAMES = 127
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# (pid, state, query id, kernel frames, user frames), innermost frame first
SampleKey = tuple[int, int, int, tuple[int, ...], tuple[int, ...]]


class Counts:
    """The samples read from the ring buffer so far, counted by key."""

    def __init__(self) -> None:
        self.by_key: Counter[SampleKey] = Counter()
        self.malformed = 0  # records shorter than they say (never seen): counted as lost

    def add(self, record: bytes) -> None:
        try:
            pid, state, query_id, ubytes, kbytes = _HEADER.unpack_from(record)
            at = _HEADER.size
            user = struct.unpack_from(f"<{min(ubytes // 8, _FRAMES)}Q", record, at)
            kernel: tuple[int, ...] = ()
            if kbytes:
                kernel = struct.unpack_from(f"<{min(kbytes // 8, _FRAMES)}Q", record,
                                            at + 8 * _FRAMES)  # fmt: skip
        except struct.error:  # raised in libbpf's callback, it would print a traceback
            self.malformed += 1
            return
        self.by_key[(pid, state, query_id, kernel, user)] += 1


def rodata(args: list[int | Path]) -> dict[str, int]:
    """The object's globals for profile.bt's parameters (sampling.script_args: $1 Hz,
    $2 postmaster, $3 only this pid, $4 kernel stacks, $5 interval, $6-$8 the statement)."""
    values = [int(str(a)) for a in args]
    entry, state_off, qid_off = (values[5:8] + [0, 0, 0])[:3]
    return {"postmaster": values[1], "only_pid": values[2], "kernel_stacks": values[3],
            "be_addr": entry, "state_off": state_off, "qid_off": qid_off}  # fmt: skip


def snapshot(counts: Counts, kernel: bool, by_query: bool, sampled: int) -> Snapshot:
    """profile.bt's maps from the counts: the one map its parameters fill, and @samples."""
    name = ("q" if by_query else "") + ("kstacks" if kernel else "stacks")
    stacks: dict[Key, AggValue] = {}
    for (pid, state, query_id, kstack, ustack), n in counts.by_key.items():
        key: Key = (pid, ustack)
        if kernel:
            key = (pid, kstack, ustack)
        if by_query:
            key = (key[0], state, query_id, *key[1:])
        stacks[key] = n
    return Snapshot(label=time.strftime("%H:%M:%S"), maps={name: stacks, "samples": {(): sampled}})


def capture(
    args: list[int | Path], duration: float | None, interval: float | None = None
) -> CompiledCapture:
    """profile.bt's capture from the object (not started: iterate its events()). With an
    interval, each snapshot holds that window's samples alone, as the script's windows."""
    path = engine.object_path(OBJECT)
    assert path is not None
    values = rodata(args)
    hz, kernel, by_query = int(str(args[0])), bool(values["kernel_stacks"]), bool(values["be_addr"])
    counts = Counts()
    reader: list[libbpf.RingBuffer] = []
    sampled_before = [0]  # @samples at the last window's read

    def drain(obj: libbpf.BpfObject) -> None:
        if not reader:
            reader.append(obj.ring_buffer("samples", counts.add))
        reader[0].consume()

    def read(obj: libbpf.BpfObject, info: RunInfo) -> Snapshot:
        drain(obj)
        scalars = {_U32.unpack(k)[0]: _U64.unpack(v)[0] for k, v in obj.items("scalars")}
        info.lost_events = scalars.get(LOST, 0) + counts.malformed
        if info.stopped_counting:  # the final read: the object closes next
            reader[0].close()
        sampled = scalars.get(SAMPLED, 0)
        window = snapshot(counts, kernel, by_query, sampled - sampled_before[0])
        if interval:  # the next window starts empty
            counts.by_key.clear()
            sampled_before[0] = sampled
        return window

    return CompiledCapture(path, values, read, duration, interval, sampled={PROGRAM: hz},
                           every_tick=drain)  # fmt: skip
