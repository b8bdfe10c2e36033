"""Kernel BPF run-time statistics: how often each probe program ran and for how long.

While the bench holds the fd of bpf(BPF_ENABLE_STATS), the kernel counts run_cnt and
run_time_ns for every BPF program (the same as sysctl kernel.bpf_stats_enabled=1, but off
again by itself if the bench dies). Each program a tracer holds open is read from
/proc/PID/fdinfo (counts, program type) and named with BPF_OBJ_GET_INFO_BY_FD on a copy of
its fd (pidfd_getfd), so that a tool's cost can be split per probe: sched_switch apart
from sched_wakeup, an LWLock wait's start apart from its end.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import sys
from dataclasses import dataclass

from bench import common

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_SYS_PIDFD_OPEN = {"x86_64": 434, "aarch64": 434}
_SYS_PIDFD_GETFD = {"x86_64": 438, "aarch64": 438}
_BPF_OBJ_GET_INFO_BY_FD = 15
_BPF_ENABLE_STATS = 32
_BPF_STATS_RUN_TIME = 0
_PROG_INFO_SIZE = 256  # larger than struct bpf_prog_info's head; the kernel fills what it has
_PROG_INFO_NAME = slice(64, 80)  # char name[BPF_OBJ_NAME_LEN] in struct bpf_prog_info

# prog_type numbers (include/uapi/linux/bpf.h) -> what fires them
# 26: BTF-typed (tp_btf/fentry), what pgprobe loads from bpf/build/*.bpf.o
PROG_TYPES = {2: "kprobe/uprobe", 5: "tracepoint", 7: "perf_event", 17: "raw_tracepoint",
              26: "tracing"}  # fmt: skip


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


class BpfStats:
    """Kernel BPF run-time statistics (run_cnt, run_time_ns per program) while open.

    Costs two clock reads per program run (tens of ns) while on.
    """

    def __init__(self) -> None:
        self.fd = -1
        self.error = ""

    def __enter__(self) -> BpfStats:
        number = _SYS_BPF.get(platform.machine())
        if number is None:
            self.error = f"no bpf syscall number for {platform.machine()}"
            return self
        attr = ctypes.create_string_buffer(
            _BPF_STATS_RUN_TIME.to_bytes(4, sys.byteorder) + bytes(124)
        )
        fd = _libc().syscall(number, _BPF_ENABLE_STATS, attr, 128)
        if fd < 0:
            self.error = os.strerror(ctypes.get_errno())
        else:
            self.fd = fd
        return self

    @property
    def enabled(self) -> bool:
        return self.fd >= 0

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True)
class Program:
    """One BPF program's counters at one moment."""

    prog_id: int
    kind: str  # PROG_TYPES, or "type N"
    name: str  # the kernel's name for it (bpftrace: the probe, cut to 15 characters)
    runs: int
    ns: int


def _prog_name(pid: int, fd: int) -> str:
    """The program's name, from a copy of pid's fd; "" if it cannot be had."""
    machine = platform.machine()
    if machine not in _SYS_BPF:
        return ""
    libc = _libc()
    pidfd = libc.syscall(_SYS_PIDFD_OPEN[machine], pid, 0)
    if pidfd < 0:
        return ""
    try:
        mine = libc.syscall(_SYS_PIDFD_GETFD[machine], pidfd, fd, 0)
        if mine < 0:
            return ""
        try:
            info = ctypes.create_string_buffer(_PROG_INFO_SIZE)
            attr = ctypes.create_string_buffer(16)
            ctypes.memmove(attr, mine.to_bytes(4, sys.byteorder), 4)
            ctypes.memmove(ctypes.byref(attr, 4), _PROG_INFO_SIZE.to_bytes(4, sys.byteorder), 4)
            ctypes.memmove(
                ctypes.byref(attr, 8), ctypes.addressof(info).to_bytes(8, sys.byteorder), 8
            )
            if libc.syscall(_SYS_BPF[machine], _BPF_OBJ_GET_INFO_BY_FD, attr, 16) < 0:
                return ""
            return info.raw[_PROG_INFO_NAME].split(b"\0", 1)[0].decode(errors="replace")
        finally:
            os.close(mine)
    finally:
        os.close(pidfd)


def programs(pid: int, names: dict[int, str] | None = None) -> list[Program]:
    """The BPF programs pid holds open. `names` caches names by program id across calls."""
    out = []
    for fd, target in common.fd_targets(pid):
        if target != "anon_inode:bpf-prog":
            continue
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = f.read()
        except OSError:
            continue
        fields = dict(re.findall(r"^(\w+):\s+(\S+)", info, re.M))
        try:
            prog_id, kind = int(fields["prog_id"]), int(fields.get("prog_type", -1))
            runs, ns = int(fields.get("run_cnt", 0)), int(fields.get("run_time_ns", 0))
        except (KeyError, ValueError):
            continue
        if names is not None and prog_id in names:
            name = names[prog_id]
        else:
            name = _prog_name(pid, int(fd)) or f"prog {prog_id}"
            if names is not None:
                names[prog_id] = name
        out.append(Program(prog_id, PROG_TYPES.get(kind, f"type {kind}"), name, runs, ns))
    return out


def delta(before: list[Program], after: list[Program]) -> list[Program]:
    """Runs and run time between two readings, per program (programs loaded in between
    count from zero)."""
    base = {p.prog_id: p for p in before}
    out = []
    for p in after:
        b = base.get(p.prog_id)
        runs, ns = (p.runs - b.runs, p.ns - b.ns) if b else (p.runs, p.ns)
        out.append(Program(p.prog_id, p.kind, p.name, runs, ns))
    return out
