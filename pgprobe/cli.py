"""The `pgprobe` command: parse options, run one tool, turn failures into one line."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from pgprobe import __version__
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.tools import (
    backends,
    clog_reads,
    doctor,
    flame,
    hot,
    lwlocks,
    serve,
    triage,
    waits,
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other pgprobe error.

    -h is the host, as in psql, so help is --help only ("resolve" lets -h go).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("conflict_handler", "resolve")
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


# One module per command; each has add_parser(subparsers) and run(namespace).
COMMANDS = [lwlocks, clog_reads, waits, backends, doctor, flame, hot, triage, serve]


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pgprobe",
        description="See inside running PostgreSQL backends with bpftrace (Linux) or DTrace.",
    )
    parser.add_argument("--version", action="version", version=f"pgprobe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = ns.run
    try:
        return run(ns)
    except PgprobeError as exc:
        print(f"pgprobe: {exc.message}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `pgprobe ... | head`: the reader left; not an error worth a message.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug: still one line, the traceback on request
        if os.environ.get("PGPROBE_DEBUG"):
            traceback.print_exc()
        print(
            f"pgprobe: internal error: {type(exc).__name__}: {exc} "
            "(set PGPROBE_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1
