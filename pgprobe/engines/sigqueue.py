"""Signals to a tracer through sigqueue (rt_sigqueueinfo), which its scripts' probes watch.

The scripts' answer and window-edge probes fire at the system call that sends pgprobe's
signal (bpf/*.bt: tracepoint:syscalls:sys_enter_rt_sigqueueinfo). They watched kill(2)
first, but PostgreSQL sets a latch with kill(pid, SIGURG): thousands of calls a second
under load, each running every such probe of every tracer (two or three per tracer, a
filter on a map each: ~2 ms/s of BPF under pgbench -c 8 for serve's two tracers, plus the
classic tracepoint's own path). Almost nothing on a database server calls
rt_sigqueueinfo, so the probes cost nothing while they wait. By hand: util-linux's
`kill -q 0 -s URG PID` sends the same way.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys

_SYS_RT_SIGQUEUEINFO = {"x86_64": 129, "aarch64": 138}
_SIGINFO_SIZE = 128
_SI_QUEUE = -1  # what sigqueue(3) sets: allowed towards another process (not SI_USER)
_RT_PID_OFFSET = 16  # siginfo_t's union on 64-bit: si_pid, then si_uid


def send(pid: int, sig: int) -> None:
    """Send sig to pid as sigqueue(3) does (sig 0: a check only, as kill's). Raises what
    os.kill raises (ProcessLookupError, PermissionError); os.kill itself where this
    machine's system call number is not known (the probes then miss it: the answer's
    timeout and the ordinary end follow)."""
    number = _SYS_RT_SIGQUEUEINFO.get(platform.machine())
    if number is None:
        os.kill(pid, sig)
        return
    info = bytearray(_SIGINFO_SIZE)
    info[0:4] = sig.to_bytes(4, sys.byteorder)
    info[8:12] = _SI_QUEUE.to_bytes(4, sys.byteorder, signed=True)
    rt = _RT_PID_OFFSET
    info[rt : rt + 4] = os.getpid().to_bytes(4, sys.byteorder)
    info[rt + 4 : rt + 8] = os.getuid().to_bytes(4, sys.byteorder)
    buf = (ctypes.c_char * _SIGINFO_SIZE).from_buffer(info)
    if _libc().syscall(number, ctypes.c_long(pid), ctypes.c_long(sig), buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))  # ESRCH: ProcessLookupError, as os.kill's


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
