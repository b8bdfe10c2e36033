"""Engines run probe scripts: bpftrace on Linux, DTrace elsewhere."""

from __future__ import annotations

import platform

DTRACE_SYSTEMS = ("SunOS", "FreeBSD", "Darwin")  # illumos and Solaris say SunOS


def choose(requested: str) -> str:
    """The engine to use: as requested, or by operating system."""
    if requested != "auto":
        return requested
    return "dtrace" if platform.system() in DTRACE_SYSTEMS else "bpftrace"


def preflight(requested: str) -> None:
    """Fail early, in one line, when the engine cannot run here (privileges, tracer)."""
    engine = choose(requested)
    if engine == "bpftrace":
        from pgprobe.engines import bpftrace

        bpftrace.require_root()
        bpftrace.find_bpftrace()
    elif engine == "dtrace":
        from pgprobe.engines import dtrace

        dtrace.preflight()
