"""`pgprobe waits`: the exact time model of PostgreSQL processes (bpf/waits.bt).

The command's names are imported on first use (PEP 562): lwlocks, serve and triage import
this package's probe and records modules, and should not pay for the command's imports
(pprof export, protobuf, the profiling tools: ~0.1 s of CPU at every start of lwlocks).
"""

from __future__ import annotations

from typing import Any

__all__ = ["NAME", "add_parser", "run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pgprobe.tools.waits import command

        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
