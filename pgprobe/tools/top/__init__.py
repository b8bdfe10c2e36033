"""`pgprobe top`: the exact time model, live, in a terminal.

One capture of the compiled time model (bpf/waits.bpf.c, with its query and lock
dimensions) runs all along; each refresh reads its maps and shows the window since the
last one: DB time as average active sessions by class (on CPU, waiting for a CPU, IO,
Lock, LWLock, Client inside transactions, other) against the CPUs, with a history, and
four views a key apart (statements, backends, wait events, locks with who blocked whom).
Without a terminal, or with --once / --batch N: text, or one JSON document a line (rows
with a `view` key; the blocking trees in meta.blocking).
Reference: docs/top.md.
"""

from pgprobe.tools.top.command import add_parser, run

__all__ = ["add_parser", "run"]
