"""The `pgprobe` command: parse options, run one tool, turn failures into one line."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from pgprobe import __version__, helptext, outfile, timings
from pgprobe.errors import EXIT_OUTPUT, EXIT_USAGE, PgprobeError
from pgprobe.literal import literal


class _Formatter(argparse.HelpFormatter):
    """Wraps a description, keeps the lines of a text that has them (the examples)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other pgprobe error, and names
    the help of the command it is about (`pgprobe waits: ... (see pgprobe waits --help)`).

    -h is the host, as in psql, so help is --help only ("resolve" lets -h go).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("conflict_handler", "resolve")
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse, but words left over are the command's error, not pgprobe's."""
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            command = self._command_parser(getattr(ns, "command", None)) or self
            bare = next((w for w in extra if re.fullmatch(r"[A-Za-z_][\w.-]*", w)), None)
            hint = f" (no command takes a bare word; a database is --dbname {bare})" if bare else ""
            command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
        return ns

    def _command_parser(self, name: str | None) -> argparse.ArgumentParser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                parser: argparse.ArgumentParser = action.choices[name]
                return parser
        return None


# Command name -> its module, which has add_parser(subparsers) and run(namespace). Imported
# only when needed: `pgprobe flame` imports flame's module alone (serve's prometheus_client,
# doctor's and triage's imports cost ~0.1 s of CPU, a tenth of a one-second capture).
COMMANDS = {
    "lwlocks": "pgprobe.tools.lwlocks",
    "clog-reads": "pgprobe.tools.clog_reads",
    "waits": "pgprobe.tools.waits",
    "queries": "pgprobe.tools.queries",
    "locks": "pgprobe.tools.locks",
    "top": "pgprobe.tools.top",
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
        epilog=helptext.TOP_EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"pgprobe {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(sub)
            sub.choices[name].epilog = helptext.EXAMPLES[name]
    return parser


def start_here() -> str:
    """`pgprobe` alone: the usage, the commands, and what to run first."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    width = max(len(name) for name in sub.choices)
    commands = "\n".join(f"  {a.dest.ljust(width)}  {a.help}" for a in sub._choices_actions)
    return (
        f"{parser.format_usage()}\ncommands:\n{commands}\n\n{helptext.START_HERE}\n\n"
        "Each command's --help ends with examples.\n"
    )


def psql_habits(args: list[str]) -> list[str]:
    """-? is psql's help: --help here. `pgprobe -h HOST ...`: -h belongs after the command
    (at the top, -h alone is the help, with a note)."""
    args = ["--help" if word == "-?" else word for word in args]
    if args and args[0] == "-h":
        if len(args) > 1:
            command = next((word for word in args if word in COMMANDS), "waits")
            print("pgprobe: -h is the server host, an option of the commands: put it after "
                  f"the command (pgprobe {command} -h {args[1]}) (see pgprobe --help)",
                  file=sys.stderr)  # fmt: skip
            raise SystemExit(EXIT_USAGE)
        print("pgprobe: note: in a command, -h is the server host (as in psql); help is --help",
              file=sys.stderr)  # fmt: skip
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = psql_habits(sys.argv[1:] if argv is None else list(argv))
    if not args:
        print(start_here(), end="", file=sys.stderr)
        return EXIT_USAGE
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
