"""`pgprobe clog-reads`: physical reads of SLRU pages per backend and file (bpf/clog_reads.bt).

The rsnoop of pg_xact and the other SLRUs. An SLRU buffer miss in PostgreSQL
(SimpleLruReadPage -> SlruPhysicalReadPage) opens the segment file, preads one
BLCKSZ page and closes it; the probe script follows those system calls (syscall
tracepoints only, no kprobes, no USDT) and keeps, per (pid, file): reads,
bytes, latency total / max / log2 histogram. This module turns those into:

- a table per backend and SLRU (pid, backend type, application, reads, bytes,
  avg / p99 / max latency, the segment files), and totals per SLRU;
- beside the totals, the ``pg_stat_slru`` deltas over the same window
  (blks_hit, blks_read, hit ratio), read through pgprobe's read-only session
  (see SlruStats for what that cross-check can and cannot promise);
- ``--stacks``: the user stacks of the reads, named in Python with the
  profiling tools' path (pgprobe.symbolize.Symbolizer + folded_names), with
  counts: the code paths that miss (TransactionIdGetStatus <- ... );
- ``--trace``: one line per read as it completes (time, pid, file, offset,
  bytes, latency), then the summary.

JSON (``--json``): rows per (pid, file) with ``pid``, ``backend_type``,
``application_name``, ``slru``, ``file``, ``reads``, ``bytes``, ``total_us``,
``avg_us``, ``p50_us``, ``p99_us``, ``max_us``; ``meta.slru_stats`` holds the
pg_stat_slru deltas per SLRU (null when unavailable, with
``meta.slru_stats_unavailable`` saying why), ``meta.open_errors`` the failed
opens of SLRU files, ``meta.stacks`` the stacks with --stacks. With
``--trace --json`` every read is first printed as a JSON line of its own
(``"event": "read"``), the document comes last.
"""

from pgprobe.pgstats import SLRU_COLUMNS as STAT_COLUMNS
from pgprobe.pgstats import SlruStats
from pgprobe.tools.clog_reads.command import NAME, add_parser, run
from pgprobe.tools.clog_reads.probe import (
    MAPS,
    MODE_AGGREGATE,
    MODE_STACKS,
    MODE_TRACE,
    SCRIPT,
    SLRU_BITS,
    STAT_NAMES,
    check_server,
    script_args,
    selected_slrus,
    slru_mask,
    slru_value,
    start,
)
from pgprobe.tools.clog_reads.records import (
    OpenError,
    ReadRecord,
    ReadRow,
    StackRow,
    TraceRead,
    group_rows,
    open_errors,
    parse_trace_line,
    records,
    slru_of,
)
from pgprobe.tools.clog_reads.view import agreement_note, files_cell, totals_cells

__all__ = [
    "MAPS", "MODE_AGGREGATE", "MODE_STACKS", "MODE_TRACE", "NAME", "SCRIPT", "SLRU_BITS",
    "STAT_COLUMNS", "STAT_NAMES", "OpenError", "ReadRecord", "ReadRow", "SlruStats", "StackRow",
    "TraceRead", "add_parser", "agreement_note", "check_server", "files_cell", "group_rows",
    "open_errors", "parse_trace_line", "records", "run", "script_args", "selected_slrus",
    "slru_mask", "slru_of", "slru_value", "start", "totals_cells",
]  # fmt: skip
