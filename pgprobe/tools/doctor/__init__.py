"""`pgprobe doctor`: will tracing work on this box? One line per check, with the fix.

Exit 0 when every pgprobe tool can run; otherwise non-zero, naming the tools affected
(and those that run in part). JSON rows: check, status (ok, warn, fail, info), detail,
fix, affects; meta: ready, blocked_tools, partial_tools.

records.py (Check, what each tool needs, the verdict), the checks by area in
machine.py (privileges, tracer, kernel features tried for real) and server.py
(connection, binary, version, wait event address), view.py, command.py.
"""

from pgprobe.tools.doctor.command import NAME, add_parser, diagnose, run
from pgprobe.tools.doctor.records import Check, verdict
from pgprobe.tools.doctor.server import frame_pointer_share

__all__ = ["NAME", "Check", "add_parser", "diagnose", "frame_pointer_share", "run", "verdict"]
