"""The DTrace engine: run d/<tool>.d, parse its printa text into the bpftrace engine's records.

Platforms: illumos, Solaris, FreeBSD, macOS (the original DTrace), and Linux
(Oracle's DTrace for Linux 2.0, installed by scripts/setup-dtrace). The
package is split by concern:

- platform.py: finding dtrace, telling the two families apart, privileges;
- capture.py: running a script (TracerProcess), stopping it, losses;
- perpid.py: DTrace for Linux's per-pid USDT probe descriptions;
- output.py: the d/ scripts' output layout -> Snapshots and Lines;
- stacks.py: which lines are stack frames; hand-captured ustack() output;
- stderr.py: what dtrace says on stderr: losses, warnings, failures.
"""

from __future__ import annotations

from pgprobe.engines.dtrace import perpid
from pgprobe.engines.dtrace.capture import STOP_KILL_S, DtraceCapture
from pgprobe.engines.dtrace.output import DtraceOutput, quantize_buckets
from pgprobe.engines.dtrace.platform import (
    DTRACE_PATHS,
    SETUP_LAUNCHER,
    Dtrace,
    dtrace_version,
    find_dtrace,
    preflight,
    require_privileges,
)
from pgprobe.engines.dtrace.stacks import is_frame, parse_ustack_aggregation
from pgprobe.engines.dtrace.stderr import (
    MACOS_SIP_HINT,
    NO_PROVIDER_HINT,
    StderrReport,
    classify_stderr,
    explain_failure,
)

__all__ = [
    "DTRACE_PATHS",
    "MACOS_SIP_HINT",
    "NO_PROVIDER_HINT",
    "SETUP_LAUNCHER",
    "STOP_KILL_S",
    "Dtrace",
    "DtraceCapture",
    "DtraceOutput",
    "StderrReport",
    "classify_stderr",
    "dtrace_version",
    "explain_failure",
    "find_dtrace",
    "is_frame",
    "parse_ustack_aggregation",
    "perpid",
    "preflight",
    "quantize_buckets",
    "require_privileges",
]
