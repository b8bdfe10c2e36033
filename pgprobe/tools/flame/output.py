"""Where flame's output goes: checked before a long capture, written at the end."""

from __future__ import annotations

import argparse
import sys

from pgprobe import outfile
from pgprobe.errors import EXIT_USAGE, PgprobeError


def check_output(ns: argparse.Namespace, fmt: str) -> None:
    """Fail before a long capture, not after it."""
    if ns.output and ns.output != "-":
        outfile.check(ns.output, "-o")
    elif fmt in ("svg", "speedscope", "pprof") and not ns.json and sys.stdout.isatty():
        raise PgprobeError(
            f"not writing {fmt} to a terminal: redirect it (pgprobe flame > cpu.svg) "
            "or use -o FILE",
            EXIT_USAGE,
        )


def write(ns: argparse.Namespace, text: str) -> None:
    """-o FILE (written whole: pgprobe.outfile), or stdout. --by pid names each
    backend's application: such a file is private (0600)."""
    outfile.write(ns.output, text, private=getattr(ns, "by", None) == "pid")
