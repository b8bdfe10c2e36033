"""`pgprobe waits`: the exact time model of PostgreSQL processes (bpf/waits.bt)."""

from pgprobe.tools.waits.command import NAME, add_parser, run

__all__ = ["NAME", "add_parser", "run"]
