"""Where flame's output goes: checked before a long capture, written at the end."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pgprobe.errors import EXIT_USAGE, PgprobeError


def check_output(ns: argparse.Namespace, fmt: str) -> None:
    """Fail before a long capture, not after it."""
    if ns.output:
        parent = Path(ns.output).resolve().parent
        if Path(ns.output).is_dir():
            raise PgprobeError(f"-o {ns.output}: is a directory", EXIT_USAGE)
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise PgprobeError(f"-o {ns.output}: cannot write in {parent}", EXIT_USAGE)
    elif fmt in ("svg", "speedscope", "pprof") and not ns.json and sys.stdout.isatty():
        raise PgprobeError(
            f"not writing {fmt} to a terminal: redirect it (pgprobe flame > cpu.svg) "
            "or use -o FILE",
            EXIT_USAGE,
        )


def write(ns: argparse.Namespace, text: str) -> None:
    if not ns.output:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(ns.output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PgprobeError(f"cannot write {ns.output}: {exc.strerror or exc}", EXIT_USAGE) from None
