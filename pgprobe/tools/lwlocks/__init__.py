"""`pgprobe lwlocks`: LWLock wait time per tranche and mode.

By default (--source sched, PostgreSQL 14+) from `pgprobe waits`' capture (the compiled
bpf/waits.bpf.c, else bpf/waits.bt): its LWLock-class sleeps, each with the runqueue time
after it and the mode read at its switch-out (the script: the sleeps alone, mode
unknown). With --source usdt (bpf/lwlock_wait.bt) the kernel times every wait and keeps,
per (pid, tranche, mode), the count, the total, the max and a log2 histogram. The rows
are sorted by total wait time, with percentiles estimated from the histogram. JSON rows:
tranche, mode, waits, total_us, avg_us, p50_us, p95_us, p99_us, max_us, share_pct (the
scheduler's: runq_us; and pid, backend_type, application_name with --by pid).

From the scheduler, waits are the sleeps that ended in the window (the queueing before
a sleep and a wait that never sleeps are not seen) and the total is their time within
it: with --interval, a sleep across a window's edges can give a row time and no sleep,
whose avg_us is null. The title and meta.source say which source was measured.

probe.py (script, maps, parameters, the source, `start`), records.py (records, rows),
view.py (the table), command.py (the CLI). Triage and serve use `check_server`,
`wanted_source`, `start`, `records`, `sleep_records`, `sched_meta` and `rows` from here.
"""

from pgprobe.tools.lwlocks.command import NAME, add_parser, emit, run
from pgprobe.tools.lwlocks.probe import (
    MAPS,
    MIN_MAJOR,
    PROBES,
    SCHED,
    SCRIPT,
    USDT,
    check_server,
    pick_source,
    script_args,
    start,
    start_sleeps,
    wanted_source,
)
from pgprobe.tools.lwlocks.records import (
    WaitRecord,
    WaitRow,
    records,
    rows,
    sched_meta,
    sleep_records,
    sleeps_warning,
    unmatched_warning,
)

__all__ = [
    "MAPS",
    "MIN_MAJOR",
    "NAME",
    "PROBES",
    "SCHED",
    "SCRIPT",
    "USDT",
    "WaitRecord",
    "WaitRow",
    "add_parser",
    "check_server",
    "emit",
    "pick_source",
    "records",
    "rows",
    "sched_meta",
    "script_args",
    "sleep_records",
    "sleeps_warning",
    "start",
    "start_sleeps",
    "run",
    "unmatched_warning",
    "wanted_source",
]
