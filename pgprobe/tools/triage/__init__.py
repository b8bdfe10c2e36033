"""`pgprobe triage`: everything pgprobe knows about N seconds, in one HTML report.

Over the same window: the time model of the client backends (`pgprobe waits`' probe: on
CPU, waiting for a CPU, each wait event, idle apart), CPU samples (flame graph, hot
functions), LWLock waits, SLRU reads, pg_stat_activity sampled every second (the time
model's cross-check), and the deltas of PostgreSQL's cumulative views. A part that cannot
run here (an old server, no USDT probes, no my_wait_event_info) is left out with the
reason, and the others go on. Findings (pgprobe.findings) come first in the report, then
the evidence, the time model first.

Modules: ``parts`` (what is asked of the probes: one capture per part, and how its final
snapshot becomes a document section), ``window`` (the parts and the SQL readings over one
window, the server going away), ``records`` (the time-model section, pure), ``view`` (the
terminal summary), ``command`` (options, the time-model part, findings, the report).
"""

from pgprobe.tools.triage.command import DEFAULT_DURATION_S, add_parser, run
from pgprobe.tools.triage.window import NAME

__all__ = ["DEFAULT_DURATION_S", "NAME", "add_parser", "run"]
