"""Sampling perf events, one per online CPU, for a compiled object's SEC("perf_event") program.

What bpftrace's profile:hz:N opens: a software cpu-clock event on each CPU, any process,
sampled N times a second (a frequency, not a period: the kernel adjusts the period). The
BPF program is attached to each (pgprobe.engines.libbpf), and decides which samples count.
Python has no perf_event_open(2): it is called through libc's syscall().
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241, "ppc64le": 319, "s390x": 331}
_PERF_TYPE_SOFTWARE, _PERF_COUNT_SW_CPU_CLOCK = 1, 0
_FREQ = 1 << 10  # perf_event_attr.freq: sample_freq is a frequency
_PERF_FLAG_FD_CLOEXEC = 8
ONLINE = Path("/sys/devices/system/cpu/online")


class _Attr(ctypes.Structure):
    """struct perf_event_attr up to config1 (PERF_ATTR_SIZE_VER0, 64 bytes: every kernel)."""

    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32),
                ("config", ctypes.c_uint64), ("sample_freq", ctypes.c_uint64),
                ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32),
                ("bp_type", ctypes.c_uint32), ("config1", ctypes.c_uint64)]  # fmt: skip


def online_cpus(text: str | None = None) -> list[int]:
    """The online CPUs ("0-3,5" in /sys/devices/system/cpu/online)."""
    if text is None:
        text = ONLINE.read_text()
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def open_cpu_clock(hz: int) -> list[int]:
    """A cpu-clock sampling event at hz on every online CPU, disabled until a program is
    attached (libbpf enables it); their fds. OSError (one line) when one cannot be opened:
    the ones opened are closed."""
    number = _NR_PERF_EVENT_OPEN.get(platform.machine())
    if number is None:
        raise OSError(f"perf_event_open's system call number on {platform.machine()} is unknown")
    libc = ctypes.CDLL(None, use_errno=True)
    attr = _Attr(type=_PERF_TYPE_SOFTWARE, size=ctypes.sizeof(_Attr),
                 config=_PERF_COUNT_SW_CPU_CLOCK, sample_freq=hz, flags=_FREQ | 1)  # fmt: skip
    fds: list[int] = []
    for cpu in online_cpus():
        fd = libc.syscall(number, ctypes.byref(attr), -1, cpu, -1, _PERF_FLAG_FD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            for opened in fds:
                os.close(opened)
            raise OSError(err, f"perf_event_open (cpu-clock, CPU {cpu}): {os.strerror(err)}")
        fds.append(fd)
    return fds
