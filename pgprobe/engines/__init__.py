"""Engines run probe scripts: bpftrace on Linux, DTrace elsewhere."""

from __future__ import annotations

import platform

DTRACE_SYSTEMS = ("SunOS", "FreeBSD", "Darwin")  # illumos and Solaris say SunOS


def choose(requested: str) -> str:
    """The engine to use: as requested, or by operating system."""
    if requested != "auto":
        return requested
    return "dtrace" if platform.system() in DTRACE_SYSTEMS else "bpftrace"


def preflight(requested: str, tracer: bool = True) -> None:
    """Fail early, in one line, when the engine cannot run here (privileges, tracer).
    tracer False: a compiled object does the capture, bpftrace is not needed."""
    engine = choose(requested)
    if engine == "bpftrace":
        from pgprobe.engines import bpftrace

        bpftrace.require_root()
        if tracer:
            bpftrace.find_bpftrace()
    elif engine == "dtrace":
        from pgprobe.engines import dtrace

        dtrace.preflight()
