"""`pgprobe locks`: who waited on which heavyweight lock, in which mode, for how long.

The compiled time model (bpf/waits.bpf.c) with its lock dimension: each sleep in a Lock:*
wait event charged to the lock the backend was queued on and the mode it wanted, read from
its PGPROC at the switch-out (tools/waits/lockdim.py): exact seconds per lock and waiter,
adding up to the time model's Lock rows. JSON rows: lock, locktype, the pg_locks columns
of the lock (database, relation, page, tuple, transactionid, ...), mode, total_us, waits,
sleeps, max_us, waiters (pid, total_us). Reference: docs/locks.md.
"""

from pgprobe.tools.locks.command import add_parser, run

__all__ = ["add_parser", "run"]
