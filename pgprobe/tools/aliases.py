"""Old spellings that keep working, out of the help (issue 32: one spelling per idea).

An alias fills its new option's dest, and nothing when not given, so the old and the new
spelling parse to the same namespace: `flame --per-backend` is `--by pid`, `--hz` is
`-F/--frequency`, `clog-reads --folded FILE` is `--format folded -o FILE`.
"""

from __future__ import annotations

import argparse
from typing import Any


class OneValue(argparse.Action):
    """Store the value (or const, with nargs=0); a different value for the same dest given
    before is a usage error: an old spelling and the new one may both be given, and must
    then agree (`--folded --format svg` is refused, not decided by their order)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        value = self.const if self.nargs == 0 else values
        previous = getattr(namespace, self.dest, None)
        if previous not in (None, self.default, value):
            raise argparse.ArgumentError(
                self, f"{value} contradicts {previous}, chosen before{_spellings(parser, self)}"
            )
        setattr(namespace, self.dest, value)


class OutputAs(OneValue):
    """An old `--FORMAT FILE` spelling (clog-reads' --folded FILE): -o FILE --format FORMAT."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        chosen = getattr(namespace, "format", None)
        if chosen not in (None, self.const):
            raise argparse.ArgumentError(self, f"contradicts --format {chosen}")
        super().__call__(parser, namespace, values, option_string)
        namespace.format = self.const


def _spellings(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """' (--folded is --format folded)': the shorthands of the same dest, said."""
    same = [a for a in parser._actions if a.dest == action.dest and a.option_strings]
    full = next((a.option_strings[-1] for a in same if a.nargs != 0), None)
    said = [f"{a.option_strings[-1]} is {full} {a.const}" for a in same if a.nargs == 0]
    return f" ({'; '.join(said)})" if full and said else ""


def add_alias(parser: Any, *names: str, dest: str, **kwargs: Any) -> None:
    """An old spelling that keeps working, out of the help: it fills the new option's dest
    (and nothing when not given), so both spellings parse to the same namespace."""
    parser.add_argument(*names, dest=dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                        **kwargs)  # fmt: skip
