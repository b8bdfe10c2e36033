"""CPU profiles of PostgreSQL processes: what `pgprobe flame` and `pgprobe hot` share.

One pipeline, used by both commands:

1. Targets from discovery (``--pid`` and the filters, as every tool).
2. ``/proc/PID/maps`` snapshots of the postmaster (the fallback for pids that have
   none: backends are forked from it) and of every target, before the capture
   starts; in whole-cluster mode also of the postmaster's children that appear
   while the capture runs (a scan of /proc every half second or so, from the
   capture's tick), so that backends that come and go during the capture keep
   the libraries they loaded themselves.
3. ``bpf/profile.bt`` (``profile:hz``) through ``common.capture()`` with
   ``BPFTRACE_NO_USER_SYMBOLS=1``: counts per (pid, [kernel stack,] user stack)
   of raw addresses, and ``@samples``, every sample taken.
4. The addresses named by ``pgprobe.symbolize.Symbolizer``, into a ``Profile``:
   one ``StackCount`` (pid, frames innermost first, samples) per distinct stack.

``Profile.folded()`` gives FlameGraph folded stacks (offsets stripped: one
function is one frame; unresolved frames keep their ``module+0xSTART`` label,
one per function start), optionally rooted at a frame naming the backend
(``backend_frame``); ``Profile.meta()`` the capture facts for ``--json``;
``Profile.facts()`` the same facts for a flame graph's subtitle.

Losses: ``lost_samples`` is ``@samples`` minus the samples the stack map holds
(over every process the script sampled, before pgprobe keeps only the
targets); a sample whose key could not be stored is both counted in
``@samples`` and reported by bpftrace as a failed map update, so the larger of
the two is the loss, never their sum. A sample can also keep its count but
lose its stack: the kernel's stack map refuses a stack whose hash bucket holds
another one (``get_stackid`` -EEXIST; bpftrace's map has no room for
replacement), and a process that is exiting has no user stack left
(-EFAULT). Those samples show as ``[unknown]`` and are counted as
``samples_without_stack``. bpftrace -k reports every failing ``get_stackid``
(with ``--kernel``, one -EFAULT per sample taken in user mode, which has no
kernel stack: not a loss) and prints "failed to look up stack id" for the
refused ones; pgprobe replaces those messages by the one count that matters.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgprobe import proc
from pgprobe.discover import Backend, Targets
from pgprobe.engines.base import (
    AggValue,
    Capture,
    Event,
    Key,
    KeyValue,
    MapSpec,
    NamedStack,
    RunInfo,
    Snapshot,
    TickCallback,
)
from pgprobe.stacks import fold
from pgprobe.symbolize import KERNEL_SUFFIX, UNKNOWN, Frame, Symbolizer, folded_names
from pgprobe.tools import common

SCRIPT = "profile"  # bpf/profile.bt
DEFAULT_HZ = 99
MAX_HZ = 10_000
DEFAULT_DURATION_S = 10.0
MAPS = (
    MapSpec("stacks", ("int", "stack")),
    MapSpec("kstacks", ("int", "stack", "stack")),
    MapSpec("samples", ()),
)
# Distinct (pid, stack) keys the map may hold: at most one per sample, so
# duration x Hz x CPUs (with headroom) loses nothing; bounded because bpftrace
# preallocates the map.
MIN_MAP_KEYS = 16_384
MAX_MAP_KEYS = 1_048_576
# Above this share of unresolved frames in the server binary, say how to fix it.
UNRESOLVED_WARN_PCT = 5.0
# New children of the postmaster are looked for this often (at least).
SCAN_INTERVAL_S = 0.5


def hz_value(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of Hz: {text!r}") from None
    if not 1 <= value <= MAX_HZ:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_HZ} Hz: {text}")
    return value


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """Connection, targets, -d, --json, --engine, and -F / --kernel."""
    common.add_tracing_arguments(parser, default_duration=DEFAULT_DURATION_S)
    parser.add_argument(
        "-F",
        "--frequency",
        dest="hz",
        type=hz_value,
        default=DEFAULT_HZ,
        metavar="HZ",
        help=f"samples per second per CPU (default {DEFAULT_HZ}; 1-{MAX_HZ})",
    )
    parser.add_argument(
        "--kernel", action="store_true", help="kernel stacks too (frames named from kallsyms)"
    )


UNKNOWN_FRAME = Frame(UNKNOWN, UNKNOWN, False)  # the leaf of an empty stack


# -- the result ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StackCount:
    """One distinct stack of one process, and how many samples saw it."""

    pid: int
    frames: tuple[Frame, ...]  # innermost first: kernel frames, then user frames
    count: int


@dataclass
class Profile:
    """What a capture saw of the targets, named."""

    targets: Targets
    info: RunInfo
    snapshot: Snapshot
    hz: int
    kernel: bool
    stacks: list[StackCount]
    samples_taken: int  # @samples: every sample of every process the script watched
    samples_stored: int  # the sum of the stack maps' counts, same processes
    samples_without_stack: int  # of the targets: no user stack (refused, or exiting)
    resolved_frames: int
    unresolved_frames: int
    server_module: str  # "postgres"
    server_unresolved_pct: float
    server_symbols: str  # "symtab", "dynsym", "debug file ...", "none"
    backends: dict[int, Backend] = field(default_factory=dict)  # seen during the capture

    @property
    def samples(self) -> int:
        """Samples of the targets."""
        return sum(s.count for s in self.stacks)

    @property
    def lost_samples(self) -> int:
        return max(self.samples_taken - self.samples_stored, self.info.failed_map_updates, 0)

    @property
    def pids(self) -> list[int]:
        """The processes that were sampled at least once."""
        return sorted({s.pid for s in self.stacks})

    @property
    def unresolved_pct(self) -> float:
        total = self.resolved_frames + self.unresolved_frames
        return 100.0 * self.unresolved_frames / total if total else 0.0

    def describe(self, pid: int) -> Backend:
        """pg_stat_activity's row, else what /proc said while the capture ran."""
        found = self.targets.cluster.backend(pid)
        if found is not None:
            return found
        return self.backends.get(pid) or self.targets.describe(pid)

    def backend_frame(self, pid: int) -> str:
        """The root frame of one backend's stacks: 'pid 4242: client backend (pgbench)'."""
        b = self.describe(pid)
        kind = b.backend_type or "postgres"
        if pid == self.targets.cluster.postmaster_pid:
            kind = "postmaster"
        app = f" ({b.application_name})" if b.application_name else ""
        return f"pid {pid}: {kind}{app}"

    def frame_names(self, stack: StackCount) -> list[str]:
        """The folded names of a stack's frames, innermost first."""
        return folded_names(stack.frames, main=self.server_module)

    def folded(self, per_backend: bool = False) -> dict[str, int]:
        """FlameGraph folded stacks {"root;...;leaf": samples}."""
        out: dict[str, int] = {}
        for s in self.stacks:
            names = self.frame_names(s) or [UNKNOWN]  # no user stack (e.g. while exiting)
            if per_backend:
                names.append(self.backend_frame(s.pid))
            key = fold(names)
            out[key] = out.get(key, 0) + s.count
        return out

    def folded_by_pid(self) -> dict[int, dict[str, int]]:
        out: dict[int, dict[str, int]] = {}
        for s in self.stacks:
            per = out.setdefault(s.pid, {})
            key = fold(self.frame_names(s))
            per[key] = per.get(key, 0) + s.count
        return out

    def facts(self) -> dict[str, str]:
        """The capture facts, for a flame graph's subtitle."""
        pids = self.targets.pids
        if self.targets.whole_cluster:
            who = f"cluster of postmaster {self.targets.cluster.postmaster_pid}"
        elif len(pids) <= 6:
            who = ", ".join(str(p) for p in pids)
        else:
            who = f"{len(pids)} backends"
        facts = {
            "duration": f"{self.info.duration_seconds:.1f} s",
            "Hz": str(self.hz),
            "pids": who,
            "samples": f"{self.samples:,}",
            "lost": f"{self.lost_samples:,}",
            "unresolved frames": f"{self.unresolved_pct:.1f} %",
        }
        if self.info.interrupted:
            facts["duration"] += " (interrupted)"
        return facts

    def meta(self, **extra: Any) -> dict[str, Any]:
        data = common.meta(
            self.targets,
            self.info,
            self.snapshot,
            hz=self.hz,
            kernel_stacks=self.kernel,
            samples=self.samples,
            samples_taken=self.samples_taken,
            lost_samples=self.lost_samples,
            samples_without_stack=self.samples_without_stack,
            sampled_pids=self.pids,
            unresolved_frames_pct=round(self.unresolved_pct, 2),
            server_unresolved_frames_pct=round(self.server_unresolved_pct, 2),
            server_symbols=self.server_symbols,
        )
        data.update(extra)
        return data

    def warnings(self) -> list[str]:
        """Losses and missing symbols, one line each (without the 'pgprobe: ' prefix)."""
        out: list[str] = []
        if self.lost_samples:
            out.append(
                f"{self.lost_samples:,} of {self.samples_taken:,} samples lost "
                "(the stack map was full): shorten the capture or lower -F"
            )
        if self.samples_without_stack:
            out.append(
                f"{self.samples_without_stack:,} of {self.samples:,} samples have no user "
                "stack (shown as [unknown]): the kernel's stack map refused it (a hash "
                "collision) or the process was exiting"
            )
        if self.server_unresolved_pct >= UNRESOLVED_WARN_PCT:
            out.append(unresolved_warning(self))
        return out


def unresolved_warning(profile: Profile) -> str:
    """One line: how many server frames have no name, and the package that fixes it."""
    binary = profile.targets.cluster.binary
    line = (
        f"{profile.server_unresolved_pct:.0f} % of the frames in {profile.server_module} "
        f"are unresolved (shown as {profile.server_module}+0x...)"
    )
    if profile.server_symbols not in ("dynsym", "none"):
        return line
    package = owning_package(binary)
    fix = (
        f"install {package}-dbgsym (Debian: from the debian-debug archive, "
        "see https://wiki.debian.org/HowToGetABacktrace)"
        if package
        else "install the server's debug-symbol package (postgresql-NN-dbgsym on "
        "Debian/Ubuntu, postgresqlNN-server-debuginfo on RHEL)"
    )
    return f"{line}: {binary} is stripped and has no debug file; {fix}"


def owning_package(path: str) -> str | None:
    """The dpkg package that installed path, e.g. 'postgresql-15' (None: not dpkg's)."""
    try:
        done = subprocess.run(
            ["dpkg", "-S", os.path.realpath(path)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or ":" not in done.stdout:
        return None
    package = done.stdout.splitlines()[0].split(":", 1)[0].split(",")[0].strip()
    return package or None


# -- capture ---------------------------------------------------------------------------------


def check_server(targets: Targets) -> None:
    """profile:hz needs no probe in the server: nothing to check beyond discovery."""


def map_keys(duration: float, hz: int, cpus: int | None = None) -> int:
    """BPFTRACE_MAP_KEYS_MAX for a capture: one key per possible sample, with headroom."""
    wanted = int(duration * hz * (cpus or os.cpu_count() or 1) * 1.25) + 1024
    return max(MIN_MAP_KEYS, min(MAX_MAP_KEYS, wanted))


def script_args(targets: Targets, hz: int, kernel: bool) -> list[int | Path]:
    """$1 HZ, $2 postmaster, $3 only this pid (0: all), $4 kernel stacks, $5 interval (0)."""
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    return [hz, targets.cluster.postmaster_pid, single, int(kernel), 0]


class ChildWatcher:
    """Snapshots the maps of the postmaster's children as they appear (whole cluster).

    Called from the capture's tick; scans /proc at most every SCAN_INTERVAL_S,
    or less often when a scan is slow (many processes), so that it costs
    about 2 % of one CPU at worst. Also notes what /proc says of each new
    child (its backend type from the process title) for backends gone by the end.
    """

    def __init__(self, symbolizer: Symbolizer, targets: Targets) -> None:
        self.symbolizer = symbolizer
        self.targets = targets
        self.seen: set[int] = set()
        self.backends: dict[int, Backend] = {}
        self.interval = SCAN_INTERVAL_S
        self.next_scan = 0.0

    def scan(self) -> None:
        started = time.monotonic()
        postmaster = self.targets.cluster.postmaster_pid
        for pid in _children(postmaster):
            if pid not in self.seen:
                self.seen.add(pid)
                self.symbolizer.snapshot(pid)
            known = self.backends.get(pid)
            # A fresh child carries the postmaster's title until it sets its own.
            if known is None or known.backend_type in ("", "postmaster"):
                self.backends[pid] = self.targets.describe(pid)
        took = time.monotonic() - started
        self.interval = max(SCAN_INTERVAL_S, 50 * took)
        self.next_scan = time.monotonic() + self.interval

    def tick(self) -> None:
        if time.monotonic() >= self.next_scan:
            self.scan()


def _children(ppid: int) -> list[int]:
    """Children of ppid from /proc/N/stat only (cheaper than proc.children)."""
    out = []
    for entry in os.scandir(proc.PROC):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split(None, 2)
        if len(fields) > 1 and fields[1] == str(ppid):
            out.append(int(entry.name))
    return out


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

    def finish(self, snapshot: Snapshot, info: RunInfo, names_at_end: bool = False) -> Profile:
        # Said once, as samples_without_stack (see the module doc), instead of per sample.
        info.warnings[:] = [
            w
            for w in info.warnings
            if w != "bpf helper get_stackid failed" and "failed to look up stack id" not in w
        ]
        _merge_repeated_warnings(info)
        common.refresh_if_needed(self.targets, names_at_end)
        return name_stacks(
            self.targets,
            info,
            snapshot,
            self.symbolizer,
            hz=self.hz,
            kernel=self.kernel,
            backends=self.watcher.backends if self.watcher else {},
        )


def start(ns: argparse.Namespace, targets: Targets) -> ProfileRun:
    """Snapshot the maps of the targets and set up profile.bt for them (not started yet)."""
    symbolizer = Symbolizer(kallsyms=ns.kernel)
    symbolizer.set_fallback(targets.cluster.postmaster_pid)
    for pid in targets.pids:
        symbolizer.snapshot(pid)
    watcher = ChildWatcher(symbolizer, targets) if targets.whole_cluster else None
    if watcher is not None:
        watcher.seen.update(targets.pids)  # snapshotted just above
        watcher.scan()
    env = {
        "BPFTRACE_NO_USER_SYMBOLS": "1",
        "BPFTRACE_MAP_KEYS_MAX": str(map_keys(ns.duration, ns.hz)),
    }
    running: Capture = common.capture(
        ns, SCRIPT, script_args(targets, ns.hz, ns.kernel), MAPS, env=env
    )
    if watcher is not None:
        running = _Ticking(running, watcher.tick)
    return ProfileRun(targets, running, symbolizer, watcher, ns.hz, ns.kernel)


def collect(ns: argparse.Namespace, names_at_end: bool = False) -> Profile:
    """Discover, capture, name: the whole pipeline for the options of flame and hot.

    names_at_end: re-read pg_stat_activity after the capture, to name the
    backends that came during it (for --per-backend).
    """
    run = start(ns, common.prepare(ns, check_server))
    final: tuple[Snapshot, RunInfo] | None = None
    for snapshot, info in common.snapshots(run.capture, ns, "CPU samples"):
        final = (snapshot, info)
    if final is None:
        raise common.nothing_kept(run.capture.info)
    return run.finish(*final, names_at_end=names_at_end)


def _merge_repeated_warnings(info: RunInfo) -> None:
    """'bpf helper X failed' once per sample would flood stderr: once, with a count."""
    counts: dict[str, int] = {}
    for w in info.warnings:
        counts[w] = counts.get(w, 0) + 1
    info.warnings[:] = [f"{w} ({n} times)" if n > 1 else w for w, n in counts.items()]


def name_stacks(
    targets: Targets,
    info: RunInfo,
    snapshot: Snapshot,
    symbolizer: Symbolizer,
    hz: int,
    kernel: bool,
    backends: dict[int, Backend] | None = None,
) -> Profile:
    """Name the stack maps of a capture's snapshot into a Profile of the targets.

    Raw addresses (bpftrace) are named by the symbolizer; stacks the tracer
    named itself (DTrace: NamedStack) are taken as they are.
    """
    wanted = None if targets.whole_cluster else set(targets.pids)
    own = targets.cluster.own_pid
    module = os.path.basename(targets.cluster.binary)
    stored = stackless = 0
    frames_named = {True: 0, False: 0}
    server_named = {True: 0, False: 0}
    out: list[StackCount] = []
    raw: list[tuple[Key, AggValue]] = [
        ((k[0], (), k[1]), v) for k, v in snapshot.get("stacks").items()
    ]
    raw += snapshot.get("kstacks").items()
    for (pid, kstack, ustack), value in raw:
        assert isinstance(pid, int) and isinstance(value, int)
        stored += value
        if pid == own or (wanted is not None and pid not in wanted):
            continue
        user = _frames(symbolizer, pid, ustack, value, kernel=False)
        if not user:
            stackless += value
        frames = _frames(symbolizer, pid, kstack, value, kernel=True) + user
        for f in frames:
            frames_named[f.resolved] += value
            if f.module == module:
                server_named[f.resolved] += value
        out.append(StackCount(pid, tuple(frames), value))
    taken = snapshot.get("samples").get((), 0)
    assert isinstance(taken, int)
    server = symbolizer.stats.modules.get(module)
    server_frames = server_named[True] + server_named[False]
    return Profile(
        targets=targets,
        info=info,
        snapshot=snapshot,
        hz=hz,
        kernel=kernel,
        stacks=out,
        samples_taken=taken,
        samples_stored=stored,
        samples_without_stack=stackless,
        resolved_frames=frames_named[True],
        unresolved_frames=frames_named[False],
        server_module=module,
        server_unresolved_pct=100.0 * server_named[False] / server_frames if server_frames else 0.0,
        server_symbols=server.symbols if server else "",
        backends=dict(backends or {}),
    )


def _frames(
    symbolizer: Symbolizer, pid: int, stack: KeyValue, weight: int, kernel: bool
) -> list[Frame]:
    """One stack field as Frames, innermost first."""
    if isinstance(stack, NamedStack):
        return stack.symbolized(kernel=kernel)
    assert isinstance(stack, tuple)
    if not stack:
        return []
    if kernel:
        return symbolizer.kernel_frames(stack, weight)
    return symbolizer.user_frames(pid, stack, weight)


def print_warnings(profile: Profile) -> None:
    """Every loss and the missing-symbols fix, on stderr (stdout stays clean)."""
    common.print_losses(profile.info)
    for line in profile.warnings():
        print(f"pgprobe: warning: {line}", file=sys.stderr)


def plain_name(frame: Frame) -> str:
    """A frame's function name for a table: kernel frames without FlameGraph's _[k]."""
    return frame.name.removesuffix(KERNEL_SUFFIX)
