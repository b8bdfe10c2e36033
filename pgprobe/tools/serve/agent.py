"""The agent's loop: find the cluster, keep each probe script running, fold its windows.

One thread per source (probe.SOURCES) runs its script with INTERVAL_S = the
window and adds every snapshot to the shared ``Totals`` (records.py) under a
lock; the CPU source also keeps the last window's profile as pprof bytes. The
main thread supervises:

- the server goes away (its postmaster pid is gone): every capture is stopped,
  discovery is retried with a growing pause (1 s to 10 s), the captures start
  again against the new postmaster; ``server_restarts`` counts it;
- a tracer dies (its capture ends while nobody asked): its thread starts it again
  after a pause (2 s to 30 s), ``restarts`` counts it, the line says why; a tracer
  whose kernel maps hold too much that no window needs is started again at once
  (recycle.py: waits' running totals, the CPU tracer's stack map);
- SIGTERM/SIGINT: ``stop()``; captures get SIGINT and their last partial window
  is still added.

Nothing is written: the agent holds no connection while tracing (discovery
opens one and closes it) and never writes to the database or to files.
Every event worth knowing goes to stderr as one line (the journal under systemd).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field

from pgprobe import discover
from pgprobe.discover import Targets
from pgprobe.engines.base import Capture, RunInfo, Snapshot
from pgprobe.errors import PgprobeError
from pgprobe.literal import literal
from pgprobe.render import pprof
from pgprobe.symbolize import Symbolizer
from pgprobe.tools import common, pprof_export, profiling
from pgprobe.tools.profiling import statements as profiling_statements
from pgprobe.tools.serve import probe, records, recycle
from pgprobe.tools.serve.records import Totals
from pgprobe.tools.serve.timemodel import TimeModel

RETRY_SERVER_S = (1.0, 10.0)
RETRY_TRACER_S = (2.0, 30.0)
# The symbolizer caches names per address and maps per pid; it starts afresh this often.
SYMBOLIZER_WINDOWS = 360
CHILD_SCAN_S = 5.0
SAID_MAX = 1000  # distinct messages remembered (said once each)
LOST = re.compile(r"Lost (\d+) events")
# bpftrace's lines for a stack the kernel refused (profiling's samples_without_stack)
STACK_ID = re.compile(r"failed to look up stack id|bpf helper get_stackid failed")


def say(message: str) -> None:
    # Messages quote tracer lines and names from the server: shown as text.
    print(literal(f"pgprobe serve: {message}"), file=sys.stderr, flush=True)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SlowChildWatcher(profiling.ChildWatcher):
    """flame's watcher of new backends, scanning /proc at most every CHILD_SCAN_S.

    flame scans every half second for a capture of seconds (about 2 % of one CPU on
    a loaded 2-CPU machine: 24 ms per scan of 200 processes); an agent that runs for
    good must cost far less. Backends that live longer than a window are named
    anyway (the symbolizer reads a live pid's maps when it first meets it), and the
    postmaster's maps name what a short-lived backend shares with it.
    """

    def scan(self) -> None:
        super().scan()
        self.next_scan = max(self.next_scan, time.monotonic() + CHILD_SCAN_S)


@dataclass
class CpuNamer:
    """Names one window's CPU stacks, as flame does, and forgets the processes gone."""

    targets: Targets
    hz: int
    windows: int = 0
    gone: set[int] = field(default_factory=set)  # exited by the last window's end
    symbolizer: Symbolizer = field(init=False)
    watcher: SlowChildWatcher = field(init=False)

    def __post_init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self.symbolizer = Symbolizer(kallsyms=False)
        self.symbolizer.set_fallback(self.targets.cluster.postmaster_pid)
        self.watcher = SlowChildWatcher(self.symbolizer, self.targets)
        self.watcher.scan()

    def name(self, snapshot: Snapshot, info: RunInfo) -> profiling.Profile:
        profile = profiling.name_stacks(
            self.targets, info, snapshot, self.symbolizer, self.hz, kernel=False,
            backends=self.watcher.backends,
        )  # fmt: skip
        profiling_statements.add_parts(profile)  # --statements: pprof's query_id label
        # Forgotten one window late: a process's last samples can fall in the window after
        # the one during which it exited (taken after that window's maps were printed).
        for pid in self.gone:
            self.symbolizer.forget(pid)
            self.watcher.seen.discard(pid)
            self.watcher.backends.pop(pid, None)
        self.gone = {p for p in self.watcher.seen if not alive(p)}
        self.windows += 1
        if self.windows % SYMBOLIZER_WINDOWS == 0:
            self.renew()
        return profile


class Agent:
    def __init__(self, ns: argparse.Namespace) -> None:
        self.ns = ns
        self.window: int = ns.window
        self.totals = Totals(cpu_hz=ns.hz, statements_shown=getattr(ns, "statements", 0))
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        # The last window's CPU profile, its length and end; rendered as pprof when asked
        # (pprof_bytes): a scraper may never ask, and rendering costs more than naming.
        self.cpu_window: tuple[profiling.Profile, float, float] | None = None
        self._pprof: tuple[bytes, float] = (b"", 0.0)
        self.server_up = False
        self._captures: dict[str, Capture] = {}
        self._said: set[str] = set()
        # LWLock's metrics come from the time model unless --lwlock-source usdt (probe.py)
        self.lwlock_usdt = getattr(ns, "lwlock_source", "sched") == "usdt"

    def states(self, name: str) -> list[records.SourceState]:
        """The source's state, and LWLock's too when this source (the time model) feeds it."""
        fed = [probe.LWLOCK] if name == probe.WAITS and not self.lwlock_usdt else []
        return [self.totals.source(n) for n in (name, *fed)]

    def say_once(self, message: str) -> None:
        if len(self._said) > SAID_MAX:
            self._said.clear()
        if message not in self._said:
            self._said.add(message)
            say(message)

    def pprof_bytes(self) -> tuple[bytes, float]:
        """The last window's CPU profile as a gzipped profile.proto, and that window's end."""
        with self.lock:
            window, cached = self.cpu_window, self._pprof
        if window is None or cached[1] == window[2]:
            return cached
        profile, seconds, end = window
        rendered = (pprof.render(pprof_export.cpu_profile(profile, seconds)), end)
        with self.lock:
            self._pprof = rendered
        return rendered

    def stop(self) -> None:
        self.stopping.set()
        for capture in list(self._captures.values()):
            capture.request_stop()

    # -- the supervisor (main thread)

    def run(self) -> None:
        postmaster = 0
        pause = RETRY_SERVER_S[0]
        while not self.stopping.is_set():
            try:
                targets = discover.discover(common.conn_options(self.ns), discover.Filters())
            except PgprobeError as exc:
                self.server_up = False
                self.say_once(f"cannot reach the server ({exc.message}); retrying")
                self.stopping.wait(pause)
                pause = min(pause * 2, RETRY_SERVER_S[1])
                continue
            pause = RETRY_SERVER_S[0]
            self._said.clear()
            if postmaster and targets.cluster.postmaster_pid != postmaster:
                with self.lock:
                    self.totals.server_restarts += 1
            postmaster = targets.cluster.postmaster_pid
            self.server_up = True
            say(f"tracing the cluster of postmaster {postmaster} ({targets.cluster.version})")
            self.trace(targets)
            self.server_up = False

    def trace(self, targets: Targets) -> None:
        """Run every available source until the server goes away or the agent stops."""
        sources, missing = probe.available(targets, self.lwlock_usdt)
        if probe.WAITS in missing and not self.lwlock_usdt:
            missing[probe.LWLOCK] = f"{missing[probe.WAITS]} (the LWLock metrics come from it)"
        with self.lock:
            for name, why in missing.items():
                self.totals.source(name).unavailable = why
        for name, why in missing.items():
            say(f"no {name} metrics from this server: {why}")
        if self.totals.statements_shown and probe.WAITS not in missing:
            why = probe.statements_unavailable(self.ns, targets)
            if why:
                say(f"no per-statement metrics (--statements) from this server: {why}")
        generation = threading.Event()
        threads = [
            threading.Thread(target=self.keep_running, args=(s, targets, generation), daemon=True)
            for s in sources
        ]
        for t in threads:
            t.start()
        postmaster = targets.cluster.postmaster_pid
        while not self.stopping.wait(1.0):
            if not alive(postmaster):
                say(f"the server went away (postmaster {postmaster}); waiting for it")
                break
        generation.set()
        for capture in list(self._captures.values()):
            capture.request_stop()
        for t in threads:
            t.join(timeout=30)

    # -- one source (its own thread)

    def keep_running(
        self, source: probe.Source, targets: Targets, generation: threading.Event
    ) -> None:
        pause = RETRY_TRACER_S[0]
        started = 0
        while not generation.is_set():
            if started:
                with self.lock:
                    for state in self.states(source.name):
                        state.restarts += 1
            started += 1
            try:
                warnings = self.run_once(source, targets, generation)
                why = "; ".join(warnings) or "its tracer ended"
            except PgprobeError as exc:
                why = exc.message
            except Exception as exc:  # a bug: said, and the source is started again
                why = f"internal error: {type(exc).__name__}: {exc}"
            with self.lock:
                for state in self.states(source.name):
                    state.up = False
            self._captures.pop(source.name, None)
            if generation.is_set():
                return
            if why.startswith("recycled"):  # asked for: no pause, the gap is the start-up
                say(f"{source.what} {why}; starting it again now (until its probes are "
                    "attached, nothing is counted)")  # fmt: skip
                continue
            say(f"{source.what} stopped ({why}); starting again in {pause:.0f} s")
            if generation.wait(pause):
                return
            pause = min(pause * 2, RETRY_TRACER_S[1])

    def run_once(
        self, source: probe.Source, targets: Targets, generation: threading.Event
    ) -> list[str]:
        """One run of the source's script, until it ends; what it warned of."""
        capture = source.start(self.ns, targets, self.window)
        namer = CpuNamer(targets, self.ns.hz) if source.name == probe.CPU else None
        model = (
            TimeModel(
                targets,
                lwlock_sleeps=not self.lwlock_usdt,
                statements=bool(getattr(self.ns, "statements", 0)),
            )  # fmt: skip
            if source.name == probe.WAITS
            else None
        )
        state, *fed = self.states(source.name)

        def tick(info: RunInfo, remaining: float | None) -> None:
            state.up = info.probes_attached > 0
            for other in fed:
                other.up = state.up
            if namer is not None:
                namer.watcher.tick()

        capture.on_tick = tick
        if source.name == probe.SLRU:
            with self.lock:  # every SLRU's series exists from the start, at 0 until a read
                for slru in probe.slru_names(targets):
                    self.totals.slru_reads[slru] += 0
                    self.totals.slru_read_ns[slru] += 0
        self._captures[source.name] = capture
        if generation.is_set():
            return []
        seen_lost = seen_failed = 0
        recycled: list[str] = []
        stacks = recycle.StackMapWatch() if namer is not None else None
        last = time.monotonic()
        for event in capture.events():
            if not isinstance(event, Snapshot):
                continue
            lost = 0
            now = time.monotonic()
            info = capture.info
            profile = namer.name(event, info) if namer is not None else None
            waits = model.rows(event) if model is not None else []
            if model is not None:  # what waits.bt knows it missed (pgprobe waits warns of it)
                lost = model.lost_events
            if info.failed_map_updates > seen_failed:
                full = "a BPF map is full (BPFTRACE_MAP_KEYS_MAX), updates refused"
                self.say_once(f"{source.what}: {full}: pgprobe_capture_failed_map_updates_total")
            lost += self.drain_messages(source, capture)
            with self.lock:
                state.up = not event.final
                state.windows += 1
                state.lost_events += lost
                state.last_window_end = time.time()
                state.last_window_s = now - last
                state.observed_s += model.observed_s if model is not None else now - last
                state.lost_events += info.lost_events - seen_lost
                failed = info.failed_map_updates - seen_failed
                state.failed_map_updates += failed
                seen_lost, seen_failed = info.lost_events, info.failed_map_updates
                self.fold(source.name, event, profile, targets)
                records.add_time_model(self.totals, waits)
                if model is not None and model.statements:
                    records.add_statements(self.totals, model.statement_rows,
                                           targets.cluster.major)  # fmt: skip
                if model is not None and model.lwlock_sleeps:
                    records.add_lwlock_records(self.totals, model.lwlock_records)
                for other in fed:  # the LWLock source, fed by this one's windows
                    other.up, other.windows = state.up, state.windows
                    other.last_window_end, other.last_window_s = (
                        state.last_window_end,
                        state.last_window_s,
                    )
                    other.observed_s = state.observed_s
                if profile is not None:
                    self.cpu_window = (profile, now - last, state.last_window_end)
            last = now
            full = recycle.waits_full(event) if model is not None else ""
            if profile is not None and stacks is not None:
                full = stacks.full(profile)
            if full and not recycled:
                recycled.append(f"recycled: {full}")
                capture.request_stop()
        with self.lock:  # what the tracer said at its exit (bpftrace: "Lost N events")
            state.lost_events += capture.info.lost_events - seen_lost
        return recycled + list(dict.fromkeys(capture.info.warnings))

    def drain_messages(self, source: probe.Source, capture: Capture) -> int:
        """Say the tracer's new messages once each and forget them; return the events lost.

        A capture that runs for weeks must not keep every line its tracer printed:
        the runner's list of stderr lines (bpftrace's "Lost N events" among them)
        and the warnings are emptied at every window.
        """
        lines: list[str] = getattr(getattr(capture, "process", None), "stderr", [])
        lost = 0
        while lines:
            line = lines.pop(0)  # the runner's reader thread appends meanwhile
            found = LOST.search(line)
            if found:
                lost += int(found.group(1))
            elif STACK_ID.search(line):
                pass  # counted instead: pgprobe_cpu_samples_without_stack_total
            else:
                self.say_once(f"{source.what}: {line}")
        while capture.info.warnings:
            warning = capture.info.warnings.pop(0)
            if not STACK_ID.search(warning):
                self.say_once(f"{source.what}: {warning}")
        return lost

    def fold(
        self, name: str, snapshot: Snapshot, profile: profiling.Profile | None, targets: Targets
    ) -> None:
        """Add one window to the totals (the lock is held)."""
        if name == probe.LWLOCK:
            records.add_lwlock(self.totals, snapshot)
        elif name == probe.SLRU:
            records.add_slru(self.totals, snapshot, targets.cluster.own_pid or 0)
        elif name == probe.CPU and profile is not None:
            self.totals.cpu_samples_without_stack += profile.samples_without_stack
            for s in profile.stacks:
                kind = profile.describe(s.pid).backend_type or "unknown"
                if s.pid == targets.cluster.postmaster_pid:
                    kind = "postmaster"
                self.totals.cpu_samples[kind] += s.count
