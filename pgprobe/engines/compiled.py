"""A capture run in pgprobe's own process from a compiled BPF object (pgprobe.engines.libbpf).

The same Capture as a tracer's (engines.base): snapshots at each interval and at the end,
Ctrl-C / SIGTERM / request_stop() / the duration end it, RunInfo says how it went. There is
no tracer process to start, signal or wait for: the object is loaded and attached here
(the verifier runs in bpf(2)), and a snapshot is pgprobe reading the maps, so a window
ends the moment it is read (no answer probe, no END). Closing the object detaches every
program; if pgprobe dies, the kernel detaches them with its file descriptors.

With a duty cycle (pgprobe serve's time model) the programs run for only that fraction of
each interval, at a random moment in it (a fixed phase could keep meeting, or keep missing,
a periodic job): attached, read, detached, every interval. The object is loaded once (the
verifier's ~80 ms of CPU would cost more than the programs save); on_attach runs before
each attach and must make the maps a fresh capture's, so each snapshot is the on-part's own;
after_attach right after it (entries the programs would not make: seen from the attach on,
none of its events is missed meanwhile).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from pgprobe import engines, scripts, timings
from pgprobe.engines import libbpf
from pgprobe.engines.base import Capture, Event, RunInfo, Snapshot, TickCallback
from pgprobe.engines.runner import TICK_S, StopSignals
from pgprobe.errors import EXIT_TRACER, PgprobeError
from pgprobe.scripts import script_path

# What a tool makes of the object's maps: one snapshot (and what RunInfo should say of them).
Reader = Callable[[libbpf.BpfObject, RunInfo], Snapshot]


def object_path(name: str) -> Path | None:
    """An object (e.g. "waits.bpf.o"): the installed wheel's (pgprobe/bpf/build/), or the
    checkout's (bpf/build/, scripts/build-bpf); None when it is not built."""
    try:
        return script_path("bpf", f"build/{name}")
    except PgprobeError:
        return None


def not_built(name: str) -> str:
    """Why there is no object, in one line: where it would come from here."""
    if scripts.installed():
        return (f"bpf/build/{name} is not built (the installed wheel lacks it: built with "
                "PGPROBE_WHEEL_BPF=0, without clang)")  # fmt: skip
    return f"bpf/build/{name} is not built (scripts/build-bpf builds it with clang)"


def how_to_build() -> str:
    """What makes the objects here: doctor's fix."""
    if scripts.installed():
        return (
            "install a wheel built where clang and libbpf-dev are (not with "
            "PGPROBE_WHEEL_BPF=0), or run pgprobe from a checkout after scripts/build-bpf"
        )
    return "sudo scripts/build-bpf (needs clang and libbpf-dev)"


def why_not(ns: argparse.Namespace, name: str) -> str | None:
    """Why object `name` is not used for this capture (None: it is); "" = not said (DTrace,
    or --engine bpftrace asked for the script)."""
    engine = getattr(ns, "engine", "auto")
    if engine == "bpftrace" or engines.choose(engine) != "bpftrace":
        return ""
    if object_path(name) is None:
        return not_built(name)
    return libbpf.unavailable()


def tracer_needed(ns: argparse.Namespace, names: tuple[str, ...]) -> bool:
    """Whether bpftrace (or DTrace) must run for a capture whose parts are these objects."""
    return any(why_not(ns, name) is not None for name in names)


def object_or_script(
    ns: argparse.Namespace,
    name: str,
    from_object: Callable[[], Capture],
    from_script: Callable[[], Capture],
    instead: str,
    not_here: str | None = None,
) -> Capture:
    """Object `name`'s capture where it is built and this kernel loads it, else the script's,
    with why not in one line ("<why>: <instead>"); nothing said where the script was asked
    for (--engine bpftrace, DTrace). not_here: why this capture needs the script (said the
    same way; "": said by no one, a form only the script has)."""
    why = why_not(ns, name)
    if why is None:
        why = not_here
    if why is None:
        try:
            return from_object()
        except libbpf.LibbpfError as e:
            why = f"bpf/build/{name} did not load here ({e})"
    running = from_script()
    if why:
        running.info.warnings.append(f"{why}: {instead}")
    return running


class CompiledCapture:
    """One run of a compiled object; iterate `events()` for snapshots."""

    def __init__(
        self,
        path: Path,
        rodata: dict[str, int],
        read: Reader,
        duration: float | None,
        interval: float | None = None,
        on_attach: Callable[[libbpf.BpfObject], None] | None = None,
        duty: float = 1.0,
        after_attach: Callable[[libbpf.BpfObject], None] | None = None,
        off: frozenset[str] = frozenset(),
        uprobes: dict[str, tuple[str, str]] | None = None,
        sampled: dict[str, int] | None = None,
        every_tick: Callable[[libbpf.BpfObject], None] | None = None,
        usdt: dict[str, tuple[str, str, str]] | None = None,
    ) -> None:
        self.path = path
        self.rodata = rodata
        self.read = read
        self.duration = duration
        self.interval = interval or None
        self.on_attach = on_attach  # runs after load, before attach (e.g. the window start)
        self.after_attach = after_attach  # runs right after each attach
        # The fraction of each interval the programs run (1: all the time); needs an interval.
        self.duty = duty if self.interval else 1.0
        self.on_tick: TickCallback | None = None
        self.every_tick = every_tick  # the object's own work at each tick (a ring buffer read)
        self.info = RunInfo(engine="libbpf", engine_version=libbpf.version())
        self._stop = False
        # Loaded (verified) here, attached by events(): a kernel that refuses the object
        # raises LibbpfError now, and the tool can run its bpftrace script instead.
        self._started = time.monotonic()
        timings.mark("libbpf-spawned")  # loading starts (the marks the bench reads in pairs)
        # off: programs not asked for; uprobes, usdt: where the uprobe and USDT programs
        # attach; sampled: the perf_event programs' Hz
        self._obj = libbpf.BpfObject(self.path, self.rodata, off, uprobes, sampled, usdt)

    def request_stop(self) -> None:
        self._stop = True

    def events(self) -> Iterator[Event]:
        started, obj = self._started, self._obj
        if self.duty < 1.0:
            yield from self._duty_cycle()
            return
        with obj, StopSignals() as signals:
            self._attach(obj)
            attached = time.monotonic()
            self.info.probes_attached = len(obj.program_fds())
            self.info.attach_seconds = attached - started
            timings.mark("libbpf-attached")
            next_print = attached + self.interval if self.interval else None
            while True:
                now = time.monotonic()
                self.info.duration_seconds = now - attached
                remaining = None
                if self.duration is not None:
                    remaining = max(0.0, self.duration - (now - attached))
                stopping = signals.requested or self._stop
                if stopping or remaining == 0.0:
                    self.info.interrupted = stopping
                    break
                if next_print is not None and now >= next_print:
                    # On schedule; a reader that fell behind (the consumer's work between two
                    # windows, e.g. naming a first window's stacks) gets no windows back to
                    # back: each lasts half an interval at least (a tracer prints on time).
                    next_print = max(next_print + self.interval, now + self.interval / 2)  # type: ignore[operator]
                    yield self._snapshot(obj, final=False)
                if self.every_tick is not None:
                    self.every_tick(obj)
                if self.on_tick is not None:
                    self.on_tick(self.info, remaining)
                waits = [TICK_S]
                if remaining is not None:
                    waits.append(remaining)
                if next_print is not None:
                    waits.append(next_print - now)
                time.sleep(max(0.001, min(waits)))
            # The window ends at this read; the programs stop counting when it closes.
            self.info.stopped_counting = True
            self.info.duration_seconds = time.monotonic() - attached
            if self.on_tick is not None:  # the moment a SQL window compared with it closes
                self.on_tick(self.info, 0.0)
            self.info.missed_runs = libbpf.recursion_misses(obj.program_fds())
            final = self._snapshot(obj, final=True)
            timings.mark("libbpf-read")
            obj.close_in_background()  # uprobes: their removal is not waited for
        yield final

    def _attach(self, obj: libbpf.BpfObject) -> None:
        if self.on_attach is not None:
            self.on_attach(obj)
        try:
            obj.attach()
        except libbpf.LibbpfError as e:
            raise PgprobeError(str(e), EXIT_TRACER) from None
        if self.after_attach is not None:
            self.after_attach(obj)

    def _duty_cycle(self) -> Iterator[Event]:
        """Every interval: attached for duty x interval at a random offset, then one snapshot
        of that part alone (final when a stop came while attached), then detached."""
        obj, interval = self._obj, float(self.interval or 0)
        on = self.duty * interval
        with obj, StopSignals() as signals:
            period = time.monotonic()
            self.info.probes_attached = len(obj.program_fds())  # up: loaded, attached in turn
            while True:
                begin = period + random.uniform(0.0, interval - on)
                if self._pause_until(begin, signals):
                    break
                self._attach(obj)
                attached = time.monotonic()
                if not self.info.attach_seconds:  # the first part's, as a capture's
                    self.info.attach_seconds = attached - self._started
                    timings.mark("libbpf-attached")
                stopped = self._pause_until(attached + on, signals)
                self.info.duration_seconds = time.monotonic() - attached
                self.info.missed_runs = libbpf.recursion_misses(obj.program_fds())
                snapshot = self._snapshot(obj, final=stopped)
                obj.detach()
                yield snapshot
                if stopped:
                    break
                period += interval
                if period + interval < time.monotonic():  # the reader fell behind: no catching up
                    period = time.monotonic()
            self.info.interrupted = True
            self.info.stopped_counting = True

    def _pause_until(self, when: float, signals: StopSignals) -> bool:
        """Sleep until `when`, ticking; True when asked to stop meanwhile."""
        while True:
            now = time.monotonic()
            if signals.requested or self._stop:
                return True
            if now >= when:
                return False
            if self.on_tick is not None:
                self.on_tick(self.info, None)
            time.sleep(min(TICK_S, when - now))

    def _snapshot(self, obj: libbpf.BpfObject, final: bool) -> Snapshot:
        snapshot = self.read(obj, self.info)
        snapshot.final = final
        return snapshot
