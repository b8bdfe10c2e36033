"""SLRU reads from bpf/clog_reads.bpf.c, compiled: its maps read into the uprobe script's.

The object counts what bpf/clog_reads_uprobe.bt counts (reads per pid and SLRU index, the
statement's reads, every fire) in maps pgprobe reads here into the script's snapshot
(@reads, @qreads, @fires), so UprobeCapture and records.py read either the same way. It is
used for the uprobe source without stacks when scripts/build-bpf has built it (or the
wheel carries it) and this kernel loads it; otherwise the script runs, and says why in one
line. `--engine bpftrace` asks for the script. Why: no bpftrace process (~100 MiB, its
start and compile), the uprobe attached in milliseconds.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

from pgprobe import proc
from pgprobe.engines import compiled as engine
from pgprobe.engines import libbpf
from pgprobe.engines.base import AggValue, Key, RunInfo, Snapshot
from pgprobe.engines.compiled import CompiledCapture

OBJECT = "clog_reads.bpf.o"
PROGRAM = "on_slru_read"
FIRES, REFUSED = 0, 1  # the object's `scalars` slots
_READ = struct.Struct("<II")  # pid, SLRU index
_QUERY = struct.Struct("<IIIIq")  # pid, SLRU index, st_state, padding, st_query_id
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def rodata(args: list[int | Path]) -> dict[str, int]:
    """The object's globals from the script's parameters (probe.uprobe_args, with_statement:
    $1 binary, $2 postmaster, $3 index mask, $4 single pid, $5 interval, $6 stopper,
    $7-$9 the statement)."""
    values = [int(str(a)) for a in args[1:]]
    entry, state_off, qid_off = (values[5:8] + [0, 0, 0])[:3]
    return {"postmaster": values[0], "index_mask": values[1], "only_pid": values[2],
            "be_addr": entry, "state_off": state_off, "qid_off": qid_off}  # fmt: skip


MapCounts = dict[str, dict[Key, int]]  # map name -> key -> count


def _windowed(now: MapCounts, last: MapCounts) -> dict[str, dict[Key, AggValue]]:
    """The counts since the last read (the script clears its maps at each window)."""
    out: dict[str, dict[Key, AggValue]] = {}
    for name, counts in now.items():
        before = last.get(name, {})
        out[name] = {k: n - before.get(k, 0) for k, n in counts.items() if n > before.get(k, 0)}
    return out


def _forget_gone(obj: libbpf.BpfObject, now: MapCounts) -> MapCounts:
    """The keys of processes that exited deleted once read (their counts are final: the
    maps hold the live processes' keys only, however many come and go in a long run);
    the counts left, as the next window's base."""
    gone = {int(str(key[0])) for key in now["reads"] if not proc.exists(int(str(key[0])))}
    for key in now["reads"]:
        if key[0] in gone:
            obj.delete("reads", _READ.pack(*(int(str(v)) for v in key)))
    for key in now["qreads"]:
        if key[0] in gone:
            pid, index, state, qid = (int(str(v)) for v in key)
            obj.delete("qreads", _QUERY.pack(pid, index, state, 0, qid))
    return {name: {k: n for k, n in counts.items() if name == "fires" or k[0] not in gone}
            for name, counts in now.items()}  # fmt: skip


def capture(
    args: list[int | Path], duration: float | None, interval: float | None, binary: str
) -> CompiledCapture:
    """The uprobe script's capture from the object (not started: iterate its events()).
    With an interval, each snapshot holds its window's reads alone, as the script's."""
    path = engine.object_path(OBJECT)
    assert path is not None
    last: MapCounts = {}  # with an interval: the counts at the last read

    def read(obj: libbpf.BpfObject, info: RunInfo) -> Snapshot:
        scalars = {_U32.unpack(k)[0]: _U64.unpack(v)[0] for k, v in obj.items("scalars")}
        reads: dict[Key, int] = {_READ.unpack(k): _U64.unpack(v)[0] for k, v in obj.items("reads")}
        qreads: dict[Key, int] = {}
        for k, v in obj.items("qreads"):
            pid, index, state, _pad, qid = _QUERY.unpack(k)
            qreads[(pid, index, state, qid)] = _U64.unpack(v)[0]
        info.failed_map_updates = scalars.get(REFUSED, 0)
        now: MapCounts = {"reads": reads, "qreads": qreads, "fires": {(): scalars.get(FIRES, 0)}}
        maps = _windowed(now, last)
        if interval:
            last.clear()
            last.update(_forget_gone(obj, now))
        maps["read_stacks"] = {}
        maps.setdefault("fires", {}).setdefault((), 0)
        return Snapshot(label=time.strftime("%H:%M:%S"), maps=maps)

    return CompiledCapture(path, rodata(args), read, duration, interval,
                           uprobes={PROGRAM: (binary, "pgstat_count_slru_page_read")})  # fmt: skip
