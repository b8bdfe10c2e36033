"""`pgprobe top`: the time model live, full screen (thin CLI glue: the data is source.py's,
the screen view.py's, the keys state.py's and keys.py's)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections import deque
from typing import Any

from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.tools import common
from pgprobe.tools.top import cpu, jsonline, records, view
from pgprobe.tools.top.cpu import CpuSampler
from pgprobe.tools.top.keys import KeyReader
from pgprobe.tools.top.source import Source, check
from pgprobe.tools.top.state import INTERVALS, State
from pgprobe.tools.waits import compiled, probe

NAME = "top"
DEFAULT_INTERVAL = 2
GC_FIRST = 20_000  # net allocations between two collections of the youngest generation
BATCH_ROWS = 20  # rows of each view in the text of a refresh (the JSON has them all)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="the time model live: DB time by class, statements, backends, waits, locks",
        description="A full-screen view refreshed every few seconds from one running capture "
        "of the compiled time model: the DB time of each refresh exactly (not sampled), as "
        "average active sessions by class against the CPUs, by statement, backend, wait "
        "event and lock. Without a terminal, or with --once or --batch: text or JSON lines.",
    )
    common.add_connection_arguments(parser)
    common.add_target_arguments(parser)
    parser.add_argument("-d", "--duration", type=common.duration_value, metavar="SECONDS",
                        help="stop after this long (default: until q or Ctrl-C)")  # fmt: skip
    parser.add_argument("--interval", type=common.bounded(int, 1, 3600, unit="seconds"),
                        default=DEFAULT_INTERVAL, metavar="N",
                        help=f"refresh every N seconds (default {DEFAULT_INTERVAL}; + and - "
                        "change it on the screen)")  # fmt: skip
    parser.add_argument("--view", choices=records.VIEWS, default="statements",
                        help="the view shown first (the text output shows them all)")  # fmt: skip
    parser.add_argument("--once", action="store_true", help="one refresh, as text, then exit")
    parser.add_argument("--batch", type=common.positive_int, metavar="N",
                        help="N refreshes as text (or --json lines), then exit")  # fmt: skip
    parser.add_argument("--json", action="store_true",
                        help="one JSON document per refresh, one a line")  # fmt: skip
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    if ns.once and ns.batch:
        raise PgprobeError("--once is --batch 1: give one of them", EXIT_USAGE)
    if ns.duration is not None and ns.interval > ns.duration:
        raise PgprobeError(f"--interval {ns.interval} is longer than the duration "
                           f"({ns.duration:g} s)", EXIT_USAGE)  # fmt: skip
    check(ns)
    targets = common.prepare(ns, probe.check_server, compiled.OBJECT)
    source = Source(targets, ns.interval, ns.duration)
    # A refresh's objects die young, by their counts: Python's first collection every 700
    # net allocations ran ~30 times a refresh with 1,000 backends, a fifth of top's CPU
    # (docs/benchmarks.md); every 20,000 it runs a few times a minute, over a few MB at most.
    gc.set_threshold(GC_FIRST, *gc.get_threshold()[1:])
    screen = not (ns.once or ns.batch or ns.json) and sys.stdout.isatty() and sys.stdin.isatty()
    try:
        return live(ns, source) if screen else batch(ns, source)
    finally:
        source.close()


def batch(ns: argparse.Namespace, source: Source) -> int:
    """Text (or a JSON line) per refresh: --once, --batch N, or until the end."""
    cluster, wanted = source.targets.cluster, 1 if ns.once else ns.batch
    frames, done = source.frames(), 0
    lines = jsonline.Writer()
    for frame in frames:
        if ns.json:
            assert source.info is not None and source.capture is not None
            meta = common.meta(source.targets, source.info, source.snapshot, interval=ns.interval,
                               window_unix_s=[round(frame.end_unix_s - frame.window_s, 6),
                                              round(frame.end_unix_s, 6)],
                               **records.meta(frame), notes=source.dims.notes)  # fmt: skip
            print(lines.line(NAME, meta, frame), flush=True)
            for line in frame.lost:
                common.warn(line)
        else:
            view.plain(frame, cluster.version, cluster.postmaster_pid, records.VIEWS, BATCH_ROWS)
        done += 1
        if wanted is not None and done >= wanted:
            break
    frames.close()  # detaches the probes
    for note in source.dims.notes:
        common.warn(note, "note")
    if not done:
        raise common.nothing_kept(source.info) if source.info else PgprobeError("no refresh")
    return 0


def live(ns: argparse.Namespace, source: Source) -> int:
    """The full screen until q, Ctrl-C, the duration's end or the server's."""
    from rich.console import Console
    from rich.live import Live

    cluster = source.targets.cluster
    # the terminal's size at each draw: COLUMNS and LINES, set by a shell once, would fix it
    console = Console(
        _environ={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    )
    state = State(interval=ns.interval, view=ns.view)
    history: deque[tuple[float, str]] = deque(maxlen=400)
    sampler = CpuSampler(source.targets)
    screen = view.Screen(None, state, history, cluster.version, cluster.postmaster_pid,
                         cpu=sampler)  # fmt: skip
    sampling = 0.0  # a CPU sample under way: when its countdown was last drawn (0: none)
    last = None
    try:
        with KeyReader(sys.stdin.fileno()) as keys, Live(screen, console=console, screen=True,
                                                         auto_refresh=False) as shown:  # fmt: skip
            size = console.size

            def tick(*_: Any) -> None:
                nonlocal size, sampling
                typed = keys.read()
                for key in typed:
                    state.key(key)
                if state.quit:
                    source.stop()
                if state.interval != source.interval:
                    source.set_interval(state.interval)
                    screen.status = f"(every {state.interval} s from the next refresh)"
                if state.cpu_asked:
                    state.cpu_asked = False
                    screen.status = sample_cpu(screen)
                counting = sampling and (not sampler.running or time.monotonic() - sampling >= 1)
                if typed or console.size != size or counting:
                    sampling = time.monotonic() if sampler.running else 0.0  # its result: once more
                    size = console.size
                    shown.refresh()
                elif sampler.running and not sampling:
                    sampling = time.monotonic()

            source.on_tick = tick
            for frame in source.frames():
                last = frame
                history.append((frame.aas(), max(records.CLASSES, key=frame.aas)))
                if not state.paused:
                    screen.frame, screen.status = frame, ""
                shown.refresh()
                if state.quit:
                    break
    finally:
        sampler.close()  # a CPU sample under way: its tracer ended too
    if last is not None:
        for line in last.lost:
            common.warn(line)
    if source.gone:
        common.warn(source.gone)
    return 0


def sample_cpu(screen: view.Screen) -> str:
    """c on a details page: its row's CPU functions sampled (a note when it cannot be)."""
    rows = screen.state.rows(screen.frame) if screen.frame is not None else []
    if not rows or screen.cpu is None:
        return ""
    asked = cpu.asked_for(rows[min(screen.state.selected, len(rows) - 1)])
    if isinstance(asked, str):
        return asked
    if screen.cpu.running:
        return "(a CPU sample is under way: one at a time)"
    screen.cpu.ask(asked)
    return ""


assert DEFAULT_INTERVAL in INTERVALS
