"""Running a CPU-sampling capture: maps snapshots, new backends, bpftrace or perf."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pgprobe import proc, timings
from pgprobe.discover import Backend, Targets
from pgprobe.engines import compiled as engine
from pgprobe.engines.base import (
    Capture,
    Event,
    RunInfo,
    Snapshot,
    TickCallback,
)
from pgprobe.errors import EXIT_TRACER, EXIT_USAGE, PgprobeError
from pgprobe.symbolize import Symbolizer
from pgprobe.tools import bystatement, common
from pgprobe.tools.profiling import compiled, statements
from pgprobe.tools.profiling.naming import name_stacks
from pgprobe.tools.profiling.options import (
    MAPS,
    MAX_MAP_KEYS,
    MIN_MAP_KEYS,
    SCAN_INTERVAL_S,
    SCRIPT,
)
from pgprobe.tools.profiling.result import Profile
from pgprobe.unwind import choose
from pgprobe.unwind.capture import PerfCapture
from pgprobe.waitevents.statement import StatementAddress

# -- capture ---------------------------------------------------------------------------------


def check_server(targets: Targets) -> None:
    """profile:hz needs no probe in the server: nothing to check beyond discovery."""


def map_keys(duration: float, hz: int, cpus: int | None = None) -> int:
    """BPFTRACE_MAP_KEYS_MAX for a capture: one key per possible sample, with headroom."""
    wanted = int(duration * hz * (cpus or os.cpu_count() or 1) * 1.25) + 1024
    return max(MIN_MAP_KEYS, min(MAX_MAP_KEYS, wanted))


def script_args(
    targets: Targets, hz: int, kernel: bool, where: StatementAddress | None = None
) -> list[int | Path]:
    """$1 HZ, $2 postmaster, $3 only this pid (0: all), $4 kernel stacks, $5 interval (0),
    $6-$8 where the statement is read (bpftrace only: d/profile.d takes five, and DTrace
    refuses a parameter a script does not use)."""
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    read = where.script_args() if where is not None else []
    return [hz, targets.cluster.postmaster_pid, single, int(kernel), 0, *read]


class ChildWatcher:
    """Snapshots the maps of the postmaster's children as they appear (whole cluster).

    The first scan, at start, only lists the children (perf needs their pids); their maps
    are read at the capture's first tick, while the tracer compiles and attaches (1,000
    backends: 0.15 s of CPU that the tracer's start overlaps). Then, called from the
    capture's tick, it scans /proc at most every SCAN_INTERVAL_S,
    or less often when a scan is slow (many processes), so that it costs
    about 2 % of one CPU at worst. Also notes what /proc says of each new
    child (its backend type from the process title) for backends gone by the end.
    """

    def __init__(self, symbolizer: Symbolizer, targets: Targets) -> None:
        self.symbolizer = symbolizer
        self.targets = targets
        self.seen: set[int] = set()
        self.pending: list[int] = []  # seen, maps not read yet
        self.backends: dict[int, Backend] = {}
        self.interval = SCAN_INTERVAL_S
        self.next_scan = 0.0

    def scan(self) -> None:
        """Find new children and snapshot their maps (and any still pending)."""
        started = time.monotonic()
        self.find()
        for pid in self.pending:
            self.symbolizer.snapshot(pid)
        self.pending.clear()
        took = time.monotonic() - started
        self.interval = max(SCAN_INTERVAL_S, 50 * took)
        self.next_scan = time.monotonic() + self.interval

    def find(self) -> None:
        """List the children: new ones are seen, described, and pending a snapshot."""
        postmaster = self.targets.cluster.postmaster_pid
        for pid in proc.children(postmaster):
            if pid not in self.seen:
                self.seen.add(pid)
                self.pending.append(pid)
            known = self.backends.get(pid)
            # A fresh child carries the postmaster's title until it sets its own.
            if known is None or known.backend_type in ("", "postmaster"):
                self.backends[pid] = self.targets.describe(pid)

    def tick(self) -> None:
        if self.pending or time.monotonic() >= self.next_scan:
            self.scan()


class _Ticking:
    """A Capture that also calls `hook` at every tick of the wrapped capture."""

    def __init__(self, inner: Capture, hook: Callable[[], None]) -> None:
        self.inner = inner
        self.info = inner.info
        self.on_tick: TickCallback | None = None
        self.hook = hook

    def events(self) -> Iterator[Event]:
        def tick(info: RunInfo, remaining: float | None) -> None:
            self.hook()
            if self.on_tick is not None:
                self.on_tick(info, remaining)

        self.inner.on_tick = tick
        yield from self.inner.events()

    def request_stop(self) -> None:
        self.inner.request_stop()


@dataclass
class ProfileRun:
    """A CPU-sampling capture under way, and how to name its stacks once it ends."""

    targets: Targets
    capture: Capture
    symbolizer: Symbolizer
    watcher: ChildWatcher | None
    hz: int
    kernel: bool
    unwind: str = "fp"
    unwind_reason: str = ""
    where: StatementAddress | None = None  # --by query: where profile.bt reads statements

    def finish(self, snapshot: Snapshot, info: RunInfo, names_at_end: bool = False) -> Profile:
        # Said once, as samples_without_stack (see the module doc), instead of per sample.
        info.warnings[:] = [
            w
            for w in info.warnings
            if w != "bpf helper get_stackid failed" and "failed to look up stack id" not in w
        ]
        _merge_repeated_warnings(info)
        common.refresh_if_needed(self.targets, names_at_end)
        inner = self.capture.inner if isinstance(self.capture, _Ticking) else self.capture
        perf = inner if isinstance(inner, PerfCapture) else None
        profile = name_stacks(
            self.targets,
            info,
            snapshot,
            self.symbolizer,
            hz=self.hz,
            kernel=self.kernel,
            backends=self.watcher.backends if self.watcher else {},
            stops=perf.stops if perf is not None else None,
        )
        profile.unwind, profile.unwind_reason = self.unwind, self.unwind_reason
        if perf is not None:
            profile.bytes_per_sample = perf.cost.bytes_per_sample
            profile.unwind_cpu_s = perf.cost.post_cpu_s
            profile.perf_stop_s = perf.cost.perf_stop_s
            profile.perf_cpu_s = perf.cost.perf_cpu_s
            profile.perf_data_bytes = perf.cost.file_bytes
            profile.perf_samples_recorded = perf.cost.samples_in_file
        return profile


def start(ns: argparse.Namespace, targets: Targets) -> ProfileRun:
    """Snapshot the maps of the targets and set up profile.bt for them (not started yet)."""
    symbolizer = Symbolizer(kallsyms=ns.kernel)
    symbolizer.set_fallback(targets.cluster.postmaster_pid)
    watcher = ChildWatcher(symbolizer, targets) if targets.whole_cluster else None
    if watcher is None:
        for pid in targets.pids:
            symbolizer.snapshot(pid)
    else:  # the maps are read at the first tick, once the tracer is starting
        watcher.seen.update(targets.pids)
        watcher.pending.extend(targets.pids)
        watcher.find()
    timings.mark("maps-snapshots")
    where = statements.where(ns, targets)
    mode, why = choose_unwind(ns, targets)
    if where is not None:
        mode, why = statements.unwind(mode, why)
    running: Capture
    perf = choose.perf_binary()
    if mode == "dwarf":
        if perf is None:
            raise PgprobeError(
                "--unwind dwarf needs perf: install it (Debian/Ubuntu: linux-perf or "
                "linux-tools-$(uname -r); RHEL: perf)",
                EXIT_TRACER,
            )
        pids = [targets.cluster.postmaster_pid, *sorted(watcher.seen)] if watcher else targets.pids
        running = PerfCapture(perf, sorted(set(pids)), ns.hz, ns.duration, ns.kernel, symbolizer)
    else:
        env = {
            "BPFTRACE_NO_USER_SYMBOLS": "1",
            "BPFTRACE_MAP_KEYS_MAX": str(map_keys(ns.duration, ns.hz)),
        }
        running = sampler(ns, script_args(targets, ns.hz, ns.kernel, where), env)
    if watcher is not None:
        running = _Ticking(running, watcher.tick)
    return ProfileRun(targets, running, symbolizer, watcher, ns.hz, ns.kernel, mode, why, where)


def sampler(
    ns: argparse.Namespace, args: list[int | Path], env: dict[str, str], window: int = 0
) -> Capture:
    """bpf/profile.bpf.c compiled when it is built and loads here (no bpftrace to start, no
    128 MiB stack map), else bpf/profile.bt, or d/profile.d; why not the object, said.
    window: a snapshot every that many seconds, each of its window alone (serve)."""
    return engine.object_or_script(
        ns, compiled.OBJECT,
        lambda: compiled.capture(args, ns.duration, window or None),
        lambda: common.capture(ns, SCRIPT, args, MAPS, env=env),
        "ran bpf/profile.bt",
    )  # fmt: skip


def choose_unwind(ns: argparse.Namespace, targets: Targets) -> tuple[str, str]:
    """fp or dwarf for this capture (DTrace walks stacks itself: always fp)."""
    wanted = getattr(ns, "unwind", "fp")
    if getattr(ns, "engine", "auto") == "dtrace":
        if wanted == "dwarf":
            raise PgprobeError(
                "--unwind dwarf needs perf (Linux): not with --engine dtrace", EXIT_USAGE
            )
        return "fp", "DTrace walks the stacks itself"
    return choose.choose(wanted, targets.cluster.binary, targets.cluster.postmaster_pid)


def collect(ns: argparse.Namespace, names_at_end: bool = False) -> Profile:
    """Discover, capture, name: the whole pipeline for the options of flame and hot.

    names_at_end: re-read pg_stat_activity after the capture, to name the
    backends that came during it (for --per-backend).
    """
    run = start(ns, common.prepare(ns, check_server, compiled.OBJECT))
    texts = bystatement.texts_for(run.targets, ns) if run.where is not None else None
    final: tuple[Snapshot, RunInfo] | None = None
    try:
        if texts is not None:
            texts.start()
        for snapshot, info in common.snapshots(run.capture, ns, "CPU samples"):
            final = (snapshot, info)
    finally:
        if texts is not None:
            texts.stop()
    if final is None:
        raise common.nothing_kept(run.capture.info)
    profile = run.finish(*final, names_at_end=names_at_end)
    if texts is not None:
        statements.apply(profile, ns, texts)
    timings.mark("symbolized")
    return profile


def _merge_repeated_warnings(info: RunInfo) -> None:
    """'bpf helper X failed' once per sample would flood stderr: once, with a count."""
    counts: dict[str, int] = {}
    for w in info.warnings:
        counts[w] = counts.get(w, 0) + 1
    info.warnings[:] = [f"{w} ({n} times)" if n > 1 else w for w, n in counts.items()]


def print_warnings(profile: Profile) -> None:
    """Every loss and the missing-symbols fix, on stderr (stdout stays clean)."""
    common.print_losses(profile.info)
    if "lack" in profile.unwind_reason:  # auto's choice, when frame pointers are missing
        common.warn(profile.unwind_reason, "stacks")
    for line in profile.warnings():
        common.warn(line)
