"""dtrace's stderr: losses, warnings, and the one line that explains a failure.

Losses go where the bpftrace engine puts its own: "dtrace: N drops on CPU M"
(principal buffer: lost events), "N aggregation drops on CPU M" (failed map
updates), "N dynamic variable drops" (thread-local state lost: events not
timed, lost events); "error on enabled probe ID ..." (an action faulted) is a
warning with a count. Failures before BEGIN are explained in one line
(privileges, a server built without --enable-dtrace, macOS System Integrity
Protection, FreeBSD without the dtrace modules).
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from pgprobe.errors import EXIT_ENV, EXIT_TRACER, PgprobeError

_DROPS = re.compile(r"dtrace: (\d+) (aggregation |dynamic variable |speculative )?drops?\b")
_PROBE_ERROR = re.compile(r"dtrace: error on enabled probe ID")
_MATCHED = re.compile(r"matched (\d+) probes?")
_SIP = "system integrity protection is on"

MACOS_SIP_HINT = (
    "macOS System Integrity Protection restricts DTrace: in Recovery, run "
    "`csrutil enable --without dtrace` (or disable SIP), then retry"
)
NO_PROVIDER_HINT = (
    "no postgresql provider: the PostgreSQL server was built without --enable-dtrace "
    "(FreeBSD's packages are: rebuild databases/postgresqlNN-server with the DTRACE "
    "option), or none of its processes was running"
)


@dataclass
class StderrReport:
    """What dtrace said on stderr, sorted into losses, warnings and problems."""

    lost_events: int = 0
    failed_map_updates: int = 0
    probe_errors: int = 0
    first_probe_error: str = ""
    sip: bool = False
    matched: int = 0
    problems: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        out = []
        if self.probe_errors:
            out.append(
                f"{self.probe_errors} errors in probe actions (events not counted), "
                f"first: {self.first_probe_error}"
            )
        if self.sip:
            out.append("macOS System Integrity Protection is on: some probes may be missing")
        return out + self.problems


def classify_stderr(lines: Iterable[str]) -> StderrReport:
    report = StderrReport()
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if m := _DROPS.search(line):
            kind = m.group(2) or ""
            if kind == "aggregation ":
                report.failed_map_updates += int(m.group(1))
            else:
                report.lost_events += int(m.group(1))
        elif _PROBE_ERROR.search(line):
            report.probe_errors += 1
            report.first_probe_error = report.first_probe_error or line.removeprefix("dtrace: ")
        elif _SIP in line:
            report.sip = True
        elif (m := _MATCHED.search(line)) and "script" in line:
            report.matched += int(m.group(1))
        else:
            report.problems.append(line)
    return report


def explain_failure(report: StderrReport) -> PgprobeError:
    """One line for a dtrace that failed before its probes were enabled."""
    text = (report.problems or ["dtrace exited without a word"])[0].removeprefix("dtrace: ")
    lowered = text.lower()
    sip = f"; {MACOS_SIP_HINT}" if report.sip else ""
    if "additional privileges" in lowered or "permission denied" in lowered:
        return PgprobeError(
            f"DTrace refused: {text}: run as root (illumos/Solaris: or with the "
            f"dtrace_proc and dtrace_user privileges){sip}",
            EXIT_ENV,
        )
    if "does not match any probes" in lowered and "postgresql" in lowered:
        return PgprobeError(f"DTrace: {text}: {NO_PROVIDER_HINT}{sip}", EXIT_ENV)
    if "device not available" in lowered or "failed to initialize dtrace" in lowered:
        hint = (
            ": load the DTrace modules with `kldload dtraceall`"
            if platform.system() == "FreeBSD" or "device" in lowered
            else ""
        )
        return PgprobeError(f"DTrace could not start: {text}{hint}{sip}", EXIT_ENV)
    return PgprobeError(f"dtrace failed: {text}{sip}", EXIT_TRACER)
