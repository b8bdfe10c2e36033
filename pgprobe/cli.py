"""The `pgprobe` command: parse options, run one tool, turn failures into one line."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from pgprobe import __version__
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.tools import backends, common, lwlocks


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other pgprobe error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pgprobe",
        description="See inside running PostgreSQL backends with eBPF (bpftrace).",
    )
    parser.add_argument("--version", action="version", version=f"pgprobe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    lw = sub.add_parser(
        "lwlocks",
        help="LWLock waits per tranche and mode",
        description="Time every LWLock wait of the targets and show a table per tranche "
        "and mode, sorted by total wait time.",
        conflict_handler="resolve",
    )
    _add_common(lw, default_duration=10)
    lwlocks.add_arguments(lw)
    lw.set_defaults(run=lwlocks.run)

    bk = sub.add_parser(
        "backends",
        help="the processes pgprobe would trace",
        description="List the cluster's backends as discovery finds them (no tracing).",
        conflict_handler="resolve",
    )
    common.add_connection_arguments(bk)
    common.add_target_arguments(bk)
    backends.add_arguments(bk)
    bk.set_defaults(run=backends.run)
    return parser


def _add_common(parser: argparse.ArgumentParser, default_duration: float) -> None:
    common.add_connection_arguments(parser)
    common.add_target_arguments(parser)
    common.add_capture_arguments(parser, default_duration)


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
