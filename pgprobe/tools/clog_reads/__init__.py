"""`pgprobe clog-reads`: SLRU page reads per backend and SLRU, beside pg_stat_slru.

The rsnoop of pg_xact and the other SLRUs. An SLRU buffer miss in PostgreSQL
(SimpleLruReadPage) is counted by pgstat_count_slru_page_read(slru_index), then
read from the segment file (open, one BLCKSZ pread, close). Two sources:

- uprobe (default, bpf/clog_reads_uprobe.bt): a uprobe on that function; reads
  per (pid, SLRU), the index named by the server's own pg_stat_slru order. Free
  without misses, a trap (~16 us) per read. --stacks: frame pointers in the
  kernel, or a perf uprobe with DWARF unwinding (stacks.DwarfStacks).
- syscalls (bpf/clog_reads.bt, d/clog_reads.d): syscall tracepoints; per (pid,
  file) reads, bytes, latency total / max / log2 histogram; --trace.

This package turns those into:

- a table per backend and SLRU (pid, backend type, application, reads; with
  syscalls bytes, avg / p99 / max latency, the segment files), and totals per SLRU;
- beside the totals, the ``pg_stat_slru`` deltas over the same window
  (blks_hit, blks_read, hit ratio), read through pgprobe's read-only session
  (see SlruStats for what that cross-check can and cannot promise);
- ``--stacks``: the user stacks of the reads, named in Python with the
  profiling tools' path (pgprobe.symbolize.Symbolizer + folded_names), with
  counts: the code paths that miss (SimpleLruReadPage <- TransactionIdGetStatus <- ...);
- ``--trace`` (syscalls): one line per read as it completes (time, pid, file,
  offset, bytes, latency), then the summary;
- with the uprobe, one line on stderr with its fire count and estimated CPU
  when that is over 1 % of a CPU;
- ``--by query`` / ``--query-id`` (statements.py): the scripts also read each
  reading backend's statement (state and query id, pgprobe.tools.bystatement)
  and the table is per statement and SLRU, or one statement's reads per backend.

JSON (``--json``): rows per (pid, SLRU) (uprobe: ``pid``, ``backend_type``,
``application_name``, ``slru``, ``reads``) or per (pid, file) (syscalls: also
``file``, ``bytes``, ``total_us``, ``avg_us``, ``p50_us``, ``p99_us``,
``max_us``); ``meta.source``; ``meta.slru_stats`` holds the pg_stat_slru deltas
per SLRU (null when unavailable, with ``meta.slru_stats_unavailable`` saying
why), ``meta.open_errors`` the failed opens of SLRU files (syscalls),
``meta.uprobe_fires`` and ``meta.uprobe_cpu_s_estimate`` (uprobe),
``meta.stacks`` the stacks with --stacks. With ``--trace --json`` every read is
first printed as a JSON line of its own (``"event": "read"``), the document
comes last. With ``--by query``: rows per statement and SLRU (``kind``,
``query_id``, ``query``, ``slru``, ``reads``, ``pids``).
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
    SOURCES,
    STAT_NAMES,
    UPROBE_SCRIPT,
    UprobeCapture,
    check_server,
    choose_source,
    index_mask,
    script_args,
    selected_slrus,
    slru_mask,
    slru_value,
    start,
    start_uprobe,
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
    "SOURCES", "STAT_COLUMNS", "STAT_NAMES", "UPROBE_SCRIPT", "UprobeCapture", "choose_source",
    "index_mask", "start_uprobe", "OpenError", "ReadRecord", "ReadRow", "SlruStats", "StackRow",
    "TraceRead", "add_parser", "agreement_note", "check_server", "files_cell", "group_rows",
    "open_errors", "parse_trace_line", "records", "run", "script_args", "selected_slrus",
    "slru_mask", "slru_of", "slru_value", "start", "totals_cells",
]  # fmt: skip
