"""`pgprobe queries`: which statement the time belongs to, exactly.

The compiled time model (bpf/waits.bpf.c) with its query dimension: every part of every
backend's time (on CPU, runqueue, each wait event) charged to the statement it ran, read
from the backend's own status entry at each switch-out into a sleep (its query id, the id
pg_stat_statements shows). JSON rows: kind, query_id, db_time_us, share_pct, aas, cpu_us,
runq_preempted_us, runq_woken_us, waits (wait_event_type, wait_event, total_us,
runq_woken_us), calls, total_exec_ms, total_plan_ms, ms_per_call, pids, query.
Reference: docs/queries.md.
"""

from pgprobe.tools.queries.command import add_parser, run

__all__ = ["add_parser", "run"]
