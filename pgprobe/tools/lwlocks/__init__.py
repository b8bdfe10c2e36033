"""`pgprobe lwlocks`: LWLock wait time per tranche and mode (bpf/lwlock_wait.bt).

The kernel times every wait and keeps, per (pid, tranche, mode), the count, the total,
the max and a log2 histogram; the rows are sorted by total wait time, with percentiles
estimated from the histogram. JSON rows: tranche, mode, waits, total_us, avg_us,
p50_us, p95_us, p99_us, max_us, share_pct (and pid, backend_type, application_name
with --by pid).

On a build without USDT probes (or with --source sched) it falls back to `pgprobe
waits`' capture (bpf/waits.bt, PostgreSQL 14+): the LWLock-class entries of its
per-(pid, wait_event_info) sleeps, in the same rows. Those are sleeps (switch-out to
wakeup), not waits: a wait also spins and queues before it sleeps and runs again after
its wakeup, so the sleep time is a bit lower; the mode is unknown. The title and
meta.source say which one was measured. There, waits are the sleeps that ended in the
window and the total is the sleep time within it: with --interval, a sleep across a
window's edges can give a row time and no sleep, whose avg_us is null.

probe.py (script, maps, parameters, the source, `start`), records.py (records, rows),
view.py (the table), command.py (the CLI). Triage and serve use `check_server`,
`start`, `records` and `rows` from here.
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
)
from pgprobe.tools.lwlocks.records import (
    WaitRecord,
    WaitRow,
    records,
    rows,
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
    "script_args",
    "sleep_records",
    "sleeps_warning",
    "start",
    "start_sleeps",
    "run",
    "unmatched_warning",
]
