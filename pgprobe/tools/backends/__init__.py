"""`pgprobe backends`: the processes discovery finds, a quick look before tracing.

No probe and no records of its own: its data is discovery's (pgprobe.discover's
Targets, and Backend.as_row() for the JSON rows: pid, backend_type, datname, usename,
application_name, state, wait_event_type, wait_event, query). view.py, command.py.
"""

from pgprobe.tools.backends.command import NAME, add_parser, run

__all__ = ["NAME", "add_parser", "run"]
