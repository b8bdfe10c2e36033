"""The one exception a user ever sees: a message of one line and an exit code."""

from __future__ import annotations

# Exit codes, so scripts can tell a usage slip from an environment problem.
EXIT_USAGE = 2  # bad options or values (argparse uses 2 as well)
EXIT_ENV = 3  # this machine cannot trace: not root, no bpftrace, no probes
EXIT_TARGET = 4  # the PIDs or the server are not what the user said
EXIT_CONNECT = 5  # cannot reach or log into PostgreSQL
EXIT_TRACER = 6  # the tracer failed while running
EXIT_OUTPUT = 7  # a result could not be written: a full disk, a read-only or missing directory
EXIT_INTERRUPTED = 130  # Ctrl-C before anything was collected (128 + SIGINT, as shells say)


class PgprobeError(Exception):
    """A failure the user can act on; printed as `pgprobe: <message>`."""

    def __init__(self, message: str, exit_code: int = EXIT_ENV) -> None:
        super().__init__(message)
        self.message = " ".join(message.split())  # always one line
        self.exit_code = exit_code
