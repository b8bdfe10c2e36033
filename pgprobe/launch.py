"""pgprobe's entry point: raise pgprobe's own priority before its imports, run the CLI.

Why: on a saturated server a one-shot command spent most of its time to answer waiting
for a CPU, not using one: with 1,000 idle + 32 active backends on 2 CPUs, its imports
took 1.1-1.9 s of wall for about 0.2 s of CPU and discovery 1.0-1.6 s
(docs/benchmarks.md). The tracer already runs raised (engines/runner.py); this raises
pgprobe, and its session's autogroup, for the command's few seconds (pgprobe.priority),
and puts the autogroup back at exit, on SIGTERM and on SIGHUP. `serve`, a long-running
agent, and `top`, a live view, keep the priority they were started with.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

from pgprobe import priority

LONG_RUNNING = frozenset({"serve", "top"})


def wants_priority(argv: list[str]) -> bool:
    """A one-shot command: raised. serve, and no command at all (help): not."""
    command = next((a for a in argv if not a.startswith("-")), None)
    return command is not None and command not in LONG_RUNNING


def _restore_on(signals: tuple[signal.Signals, ...], restore: Callable[[], None]) -> None:
    """On these signals, where they would end pgprobe, put the priority back first and
    end by the same signal (the exit status callers see is unchanged). A capture's own
    handler (engines/runner.py) replaces this one while it runs and restores it after."""

    def handle(signum: int, frame: FrameType | None) -> None:
        restore()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in signals:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, handle)


def raise_guarded(signals: tuple[signal.Signals, ...], wanted: bool) -> Callable[[], None]:
    """Raise (where wanted) and install the handler with these signals blocked: one that
    arrives in between is held until the handler can put the raise back, instead of
    ending pgprobe with its session still raised (seen once in CI)."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        restore = priority.raise_own() if wanted else (lambda: None)
        _restore_on(signals, restore)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return restore


def main() -> int:
    restore = raise_guarded((signal.SIGTERM, signal.SIGHUP), wants_priority(sys.argv[1:]))
    try:
        from pgprobe.cli import main as cli_main  # after the raise: the imports are the cost

        return cli_main()
    finally:
        restore()
