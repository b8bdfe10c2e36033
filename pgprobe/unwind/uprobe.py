"""Whole user stacks where a function is entered, on any build: a perf uprobe + DWARF.

For ``--stacks`` of event tools (``clog-reads --stacks`` wants the callers of
``SimpleLruReadPage``): bpftrace's ``ustack`` walks frame pointers, so on a
build without them it gives one or two frames. ``function_stacks`` adds a
uprobe with ``perf probe -x BINARY -a GROUP:NAME=FUNCTION`` (a per-pgprobe
group, removed at the end whatever happens), records every hit of it in the
target pids with the stack copied (``perf record -e GROUP:NAME -c 1
--call-graph dwarf``) and unwinds the copies like the CPU samples
(pgprobe.unwind.capture.PerfCapture): the returned Snapshot's ``stacks``
map is {(pid, user addresses innermost first): hits}, the shape of
bpftrace's ``@read_stacks[pid, ustack]``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator, Sequence

from pgprobe.engines.base import Snapshot
from pgprobe.errors import EXIT_TRACER, EXIT_USAGE, PgprobeError
from pgprobe.symbolize import Symbolizer
from pgprobe.unwind.capture import PerfCapture

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# One fetched argument of perf probe: name=%register:type ("slru_index=%di:s32").
_FETCH = re.compile(r"^[a-z_]+=%[a-z0-9]+:[su](8|16|32|64)$")


@contextlib.contextmanager
def perf_uprobe(perf: str, binary: str, function: str, fetch: str = "") -> Iterator[str]:
    """A uprobe event on function in binary for the duration of the block: its name.

    fetch: an argument the event records, for perf record's --filter (clog-reads
    keeps the SLRUs asked for: "slru_index=%di:s32").
    """
    if not _IDENT.match(function):
        raise PgprobeError(f"not a function name: {function!r}", EXIT_USAGE)
    if fetch and not _FETCH.match(fetch):
        raise PgprobeError(f"not a perf probe argument: {fetch!r}", EXIT_USAGE)
    group = f"pgprobe_{os.getpid()}"
    event = f"{group}:{function[:60]}"
    spec = f"{event}={function}" + (f" {fetch}" if fetch else "")
    done = subprocess.run(
        [perf, "probe", "-q", "-x", binary, "-a", spec],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["no detail"])[-1]
        raise PgprobeError(f"perf probe on {function} in {binary} failed: {detail}", EXIT_TRACER)
    try:
        yield event
    finally:
        subprocess.run([perf, "probe", "-q", "-d", f"{group}:*"], capture_output=True, timeout=60)


def function_stacks(
    perf: str,
    binary: str,
    function: str,
    pids: Sequence[int],
    duration: float,
    symbolizer: Symbolizer,
) -> tuple[Snapshot, dict[tuple[int, tuple[int, ...]], str]]:
    """(snapshot with "stacks" and "samples", why each cut stack stopped) of every hit."""
    with perf_uprobe(perf, binary, function) as event:
        capture = PerfCapture(
            perf, pids, 1, duration, False, symbolizer, event=["-e", event, "-c", "1"]
        )
        snapshots = [e for e in capture.events() if isinstance(e, Snapshot)]
    return snapshots[-1], capture.stops
