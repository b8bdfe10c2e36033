"""The `pgprobe` command: parse options, run one tool, turn failures into one line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from pgprobe import __version__, outfile, timings
from pgprobe.errors import EXIT_OUTPUT, EXIT_USAGE, PgprobeError
from pgprobe.literal import literal


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other pgprobe error.

    -h is the host, as in psql, so help is --help only ("resolve" lets -h go).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("conflict_handler", "resolve")
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


# Command name -> its module, which has add_parser(subparsers) and run(namespace). Imported
# only when needed: `pgprobe flame` imports flame's module alone (serve's prometheus_client,
# doctor's and triage's imports cost ~0.1 s of CPU, a tenth of a one-second capture).
COMMANDS = {
    "lwlocks": "pgprobe.tools.lwlocks",
    "clog-reads": "pgprobe.tools.clog_reads",
    "waits": "pgprobe.tools.waits",
    "backends": "pgprobe.tools.backends",
    "doctor": "pgprobe.tools.doctor",
    "flame": "pgprobe.tools.flame",
    "hot": "pgprobe.tools.hot",
    "triage": "pgprobe.tools.triage",
    "serve": "pgprobe.tools.serve",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or (only=NAME) that command's alone, importing just its module."""
    parser = _Parser(
        prog="pgprobe",
        description="See inside running PostgreSQL backends with bpftrace (Linux) or DTrace.",
    )
    parser.add_argument("--version", action="version", version=f"pgprobe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    # The command is the first word (pgprobe itself takes only --help and --version).
    only = args[0] if args and args[0] in COMMANDS else None
    ns = build_parser(only).parse_args(args)
    timings.mark("imports")
    run: Callable[[argparse.Namespace], int] = ns.run
    try:
        code = run(ns)
        sys.stdout.flush()  # a full disk under stdout fails here, said below, not at exit
        return code
    except PgprobeError as exc:
        # A message can quote a process's title or a name from the server: shown as text.
        print(literal(f"pgprobe: {exc.message}"), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        # Ctrl-C after the capture (while unwinding, symbolizing or writing): say it, since
        # whatever was written so far is cut short.
        print("pgprobe: interrupted: the output is incomplete", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `pgprobe ... | head`: the reader left; not an error worth a message.
        outfile.silence_stdout()
        return 0
    except Exception as exc:  # a bug: still one line, the traceback on request
        full = outfile.stdout_failed(exc)  # not a bug: `pgprobe ... > /dev/full`
        if full:
            print(f"pgprobe: {full}", file=sys.stderr)
            return EXIT_OUTPUT
        if os.environ.get("PGPROBE_DEBUG"):
            traceback.print_exc()
        print(
            literal(f"pgprobe: internal error: {type(exc).__name__}: {exc} ")
            + "(set PGPROBE_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return 1
    finally:
        outfile.settle_stdout()  # never "Exception ignored ... OSError" at the exit
        timings.mark("done")
