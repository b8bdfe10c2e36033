"""Where the task_struct fields that bpf/waits.bt reads sit in the running kernel, from its BTF.

Why the scripts do not write `curtask->se.sum_exec_runtime`: bpftrace 0.17 then has libclang
parse the C definitions of task_struct and of everything it reaches, about 0.9 s of CPU at
every start of waits.bt (`bpftrace -d bpf/waits.bt ...`: 1.9 s, against 1.0 s with the
offsets). The scripts read `*(uint64 *)((uint64)curtask + OFFSET)` instead, with the offsets
computed here and passed like every value pgprobe computes: as integer positional parameters.

BTF (docs.kernel.org/bpf/btf.html): a header, type records numbered from 1 (12 bytes each plus
a tail that depends on the kind), then a string table. No maintained Python library reads it,
and libbpf through ctypes would tie pgprobe to that C library's ABI for a few member offsets.
Records are indexed lazily, up to the highest id a lookup needs (the scheduler's types come
early in vmlinux): ~0.02 s instead of ~0.15 s for the whole file.

    python3 -m pgprobe.kernelbtf     # the offsets, in the order waits.bt takes them ($7-$12)
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from pathlib import Path

from pgprobe.errors import EXIT_ENV, PgprobeError

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")

_MAGIC = 0xEB9F
_HEADER = struct.Struct("<HBBIIIII")  # magic, version, flags, hdr_len, type/str off+len
_RECORD = struct.Struct("<III")  # name_off, info (kind, vlen, kind_flag), size or type
_MEMBER = struct.Struct("<III")  # name_off, type, offset (bits; bitfield size above bit 24)
# Kinds (include/uapi/linux/btf.h) and the bytes after their 12-byte record.
_INT, _PTR, _ARRAY, _STRUCT, _UNION, _ENUM = 1, 2, 3, 4, 5, 6
_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG = 8, 9, 10, 11, 18
_TAIL = {_INT: 4, _ARRAY: 12, 14: 4, 17: 4}  # + VAR, DECL_TAG
_TAIL_PER_ITEM = {_STRUCT: 12, _UNION: 12, _ENUM: 8, 13: 8, 15: 12, 19: 12}
_QUALIFIERS = (_TYPEDEF, _VOLATILE, _CONST, _RESTRICT, _TYPE_TAG)
_POINTER_SIZE = 8


@dataclasses.dataclass(frozen=True)
class TaskOffsets:
    """Byte offsets in struct task_struct, in the order bpf/waits.bt takes them."""

    sum_exec_runtime: int  # se.sum_exec_runtime: CPU time of the task, ns (u64)
    prev_sum_exec_runtime: int  # se.prev_sum_exec_runtime: the same at its last switch-in
    flags: int  # flags (unsigned int; PF_EXITING = 0x4)
    real_parent: int  # real_parent (struct task_struct *)
    tgid: int  # tgid (pid_t)
    pcount: int  # sched_info.pcount: how many times it ran on a CPU (unsigned long)
    start_time: int  # start_time: its fork, on the monotonic clock (nsecs's), ns (u64)

    def as_args(self) -> list[int]:
        return [getattr(self, field.name) for field in dataclasses.fields(self)]


# field path -> the size its type must have (what the script reads there)
_FIELDS = {
    "sum_exec_runtime": ("se.sum_exec_runtime", 8),
    "prev_sum_exec_runtime": ("se.prev_sum_exec_runtime", 8),
    "flags": ("flags", 4),
    "real_parent": ("real_parent", _POINTER_SIZE),
    "tgid": ("tgid", 4),
    "pcount": ("sched_info.pcount", 8),
    "start_time": ("start_time", 8),
}


class _Btf:
    """Type records of one BTF blob, found by id (indexed on demand) or by struct name."""

    def __init__(self, data: bytes) -> None:
        magic, _version, _flags, hdr_len, type_off, type_len, str_off, _ = _HEADER.unpack_from(
            data, 0
        )
        if magic != _MAGIC:
            raise ValueError("not BTF (bad magic)")
        self.data = data
        self.next_pos = hdr_len + type_off
        self.types_end = self.next_pos + type_len
        self.strings = hdr_len + str_off
        self.positions = [0]  # positions[id]: where record `id` starts (0: void)

    def record(self, type_id: int) -> tuple[int, int, int, int, int]:
        """(kind, vlen, kind_flag, size_or_type, position) of a type id."""
        while len(self.positions) <= type_id and self._index_next() is not None:
            pass
        if type_id <= 0 or type_id >= len(self.positions):
            raise ValueError(f"type id {type_id} out of range")
        pos = self.positions[type_id]
        _name, info, size_or_type = _RECORD.unpack_from(self.data, pos)
        return (info >> 24) & 0x1F, info & 0xFFFF, info >> 31, size_or_type, pos

    def _index_next(self) -> int | None:
        """Index one more record; its id (None at the end of the types)."""
        pos = self.next_pos
        if pos >= self.types_end:
            return None
        _name, info, _ = _RECORD.unpack_from(self.data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        self.positions.append(pos)
        self.next_pos = pos + 12 + _TAIL.get(kind, 0) + _TAIL_PER_ITEM.get(kind, 0) * vlen
        return len(self.positions) - 1

    def struct_id(self, name: str) -> int:
        at = self.data.find(b"\0" + name.encode() + b"\0", self.strings)
        if at < 0:
            raise ValueError(f"no struct {name}")
        name_off = at + 1 - self.strings
        for type_id in range(1, len(self.positions)):
            if self._is_struct_named(type_id, name_off):
                return type_id
        while (type_id_or_none := self._index_next()) is not None:
            if self._is_struct_named(type_id_or_none, name_off):
                return type_id_or_none
        raise ValueError(f"no struct {name}")

    def _is_struct_named(self, type_id: int, name_off: int) -> bool:
        record_name, info, _ = _RECORD.unpack_from(self.data, self.positions[type_id])
        return bool(record_name == name_off and (info >> 24) & 0x1F == _STRUCT)

    def name(self, name_off: int) -> str:
        start = self.strings + name_off
        return self.data[start : self.data.index(b"\0", start)].decode()

    def resolve(self, type_id: int) -> tuple[int, int, int, int, int]:
        """The record behind typedefs and qualifiers."""
        rec = self.record(type_id)
        while rec[0] in _QUALIFIERS:
            rec = self.record(rec[3])
        return rec

    def size(self, type_id: int) -> int:
        kind, _vlen, _flag, size_or_type, _pos = self.resolve(type_id)
        return _POINTER_SIZE if kind == _PTR else size_or_type

    def member(self, type_id: int, name: str) -> tuple[int, int] | None:
        """(byte offset, member type id) of a member of a struct or union, looking into
        anonymous members (task_struct keeps most fields in an unnamed struct)."""
        kind, vlen, kind_flag, _size, pos = self.resolve(type_id)
        if kind not in (_STRUCT, _UNION):
            return None
        for i in range(vlen):
            name_off, member_type, offset = _MEMBER.unpack_from(self.data, pos + 12 + 12 * i)
            bits = offset & 0xFFFFFF if kind_flag else offset
            if name_off == 0:
                inner = self.member(member_type, name)
                if inner is not None:
                    return bits // 8 + inner[0], inner[1]
            elif self.name(name_off) == name:
                if bits % 8:
                    raise ValueError(f"{name} is a bitfield")
                return bits // 8, member_type
        return None

    def offset_of(self, struct_name: str, path: str) -> tuple[int, int]:
        """(byte offset, size) of a dotted member path in a struct."""
        type_id, offset = self.struct_id(struct_name), 0
        for part in path.split("."):
            found = self.member(type_id, part)
            if found is None:
                raise ValueError(f"no member {path} in struct {struct_name}")
            offset, type_id = offset + found[0], found[1]
        return offset, self.size(type_id)


@functools.cache
def task_offsets(path: Path = VMLINUX_BTF) -> TaskOffsets:
    """The offsets waits.bt needs, or a one-line PgprobeError (no BTF, or a field missing)."""
    try:
        btf = _Btf(path.read_bytes())
        found = {}
        for field, (member_path, size) in _FIELDS.items():
            offset, actual = btf.offset_of("task_struct", member_path)
            if actual != size:
                raise ValueError(f"task_struct.{member_path} is {actual} bytes, not {size}")
            found[field] = offset
    except OSError as exc:
        raise PgprobeError(
            f"cannot read the kernel's BTF ({path}: {exc.strerror}): waits needs a kernel "
            "built with CONFIG_DEBUG_INFO_BTF",
            EXIT_ENV,
        ) from exc
    except (ValueError, struct.error) as exc:
        raise PgprobeError(f"the kernel's BTF ({path}) is not usable: {exc}", EXIT_ENV) from exc
    return TaskOffsets(**found)


def member_offset(struct_name: str, path: str, btf: Path = VMLINUX_BTF) -> int:
    """The byte offset of a dotted member path in a kernel struct (for the bench's probes)."""
    return _Btf(btf.read_bytes()).offset_of(struct_name, path)[0]


if __name__ == "__main__":
    print(*task_offsets().as_args())
