"""The stacks of clog-reads --stacks: named with the profiling symbolizer; DWARF-unwound by perf.

StackNamer names the raw user stacks of @read_stacks (frame pointers, from
bpftrace) or of DwarfStacks (perf's copies unwound with .eh_frame).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from pgprobe import outfile
from pgprobe.discover import Backend, Targets
from pgprobe.engines.base import NamedStack, Snapshot
from pgprobe.errors import EXIT_TRACER, EXIT_USAGE, PgprobeError
from pgprobe.symbolize import Frame, Symbolizer, folded_names
from pgprobe.tools import common, profiling
from pgprobe.tools.clog_reads.probe import UPROBE_FUNCTION
from pgprobe.tools.clog_reads.records import StackRow
from pgprobe.unwind import choose
from pgprobe.unwind.capture import ATTACH_TIMEOUT_S, PerfCapture
from pgprobe.unwind.fpcheck import lacks_frame_pointers
from pgprobe.unwind.uprobe import perf_uprobe

MAX_SECONDS = 86_400.0  # perf runs until finish() stops it
# perf's ring buffer per CPU: each read copies 16 KiB of stack, and reads come in
# bursts (72 in a few ms lost 41 with perf's default 512 KiB): room for ~1,000.
PERF_BUFFER = "16M"


@dataclass
class StackNamer:
    """Names the raw stacks of @read_stacks with the profiling tools' symbolizer."""

    targets: Targets
    symbolizer: Symbolizer
    watcher: profiling.ChildWatcher | None
    unnamed_reads: int = 0  # reads whose stack the kernel did not give (hash collision)

    @classmethod
    def start(cls, targets: Targets) -> StackNamer:
        symbolizer = Symbolizer(kallsyms=False)
        symbolizer.set_fallback(targets.cluster.postmaster_pid)
        for pid in targets.pids:
            symbolizer.snapshot(pid)
        watcher = profiling.ChildWatcher(symbolizer, targets) if targets.whole_cluster else None
        if watcher is not None:
            watcher.scan()
        return cls(targets, symbolizer, watcher)

    def tick(self) -> None:
        if self.watcher is not None:
            self.watcher.tick()

    def describe(self, pid: int) -> Backend | None:
        return self.watcher.backends.get(pid) if self.watcher is not None else None

    def rows(self, snapshot: Snapshot, keep: Any) -> list[StackRow]:
        module = os.path.basename(self.targets.cluster.binary)
        self.unnamed_reads = 0
        merged: dict[tuple[str, ...], StackRow] = {}
        for (pid, stack), value in snapshot.get("read_stacks").items():
            assert isinstance(pid, int) and isinstance(value, int)
            if not keep(pid):
                continue
            frames: list[Frame]
            if isinstance(stack, NamedStack):
                frames = stack.symbolized()
            else:
                assert isinstance(stack, tuple)
                frames = self.symbolizer.user_frames(pid, stack, value)
            if not frames:
                self.unnamed_reads += value
            names = tuple(folded_names(frames, main=module)) or ("[unknown]",)
            row = merged.setdefault(names, StackRow(names))
            row.reads += value
            row.pids.add(pid)
            row.by_pid[pid] = row.by_pid.get(pid, 0) + value
        return sorted(merged.values(), key=lambda r: (-r.reads, r.frames))


class DwarfStacks:
    """Whole stacks of every read on builds without frame pointers (--unwind dwarf).

    A perf uprobe on the same function (pgprobe.unwind.uprobe.perf_uprobe) with
    16 KiB of stack copied per hit, unwound with .eh_frame afterwards
    (PerfCapture), in a thread beside the bpftrace capture that counts: the
    counts keep bpftrace's window (exact against pg_stat_slru), the stacks come
    from perf, started before that window opens and stopped after it closes.
    Both uprobes share one trap per read; the copy adds its own cost.
    """

    def __init__(
        self, perf: str, binary: str, pids: list[int], symbolizer: Symbolizer, indexes: list[int]
    ) -> None:
        """indexes: the SLRU indexes to keep (perf record --filter on the argument)."""
        self.perf, self.binary, self.pids, self.symbolizer = perf, binary, pids, symbolizer
        self.indexes = indexes
        self.capture: PerfCapture | None = None
        self.snapshot: Snapshot | None = None
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="clog-reads-perf", daemon=True)

    def _run(self) -> None:
        try:
            fetch = "slru_index=%di:s32"  # x86-64: the first argument is in rdi
            with perf_uprobe(self.perf, self.binary, UPROBE_FUNCTION, fetch) as event:
                wanted = " || ".join(f"slru_index == {int(i)}" for i in self.indexes)
                self.capture = PerfCapture(
                    self.perf, self.pids, 1, MAX_SECONDS, False, self.symbolizer,
                    event=["-e", event, "--filter", wanted or "slru_index >= 0", "-c", "1",
                           "-m", PERF_BUFFER],
                )  # fmt: skip
                for e in self.capture.events():
                    if isinstance(e, Snapshot):
                        self.snapshot = e
        except PgprobeError as exc:
            self.error = exc.message
        except Exception as exc:  # noqa: BLE001 - said in one line; the counts go on
            self.error = f"{type(exc).__name__}: {exc}"

    def start(self, timeout: float = ATTACH_TIMEOUT_S) -> None:
        """Start perf and wait until it records (or failed: then self.error says why)."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.thread.is_alive():
            if self.capture is not None and self.capture.info.probes_attached:
                return
            time.sleep(0.05)

    def finish(self) -> Snapshot | None:
        """Stop perf, unwind: a snapshot with "read_stacks" {(pid, addresses): reads}."""
        if self.capture is not None:
            self.capture.request_stop()
        self.thread.join()
        if self.snapshot is None:
            self.error = self.error or "perf recorded nothing"
            return None
        return Snapshot(final=True, maps={"read_stacks": self.snapshot.get("stacks")})

    @property
    def lost(self) -> int:
        """Reads perf saw but could not keep (its buffer was full)."""
        if self.snapshot is None:
            return 0
        total = self.snapshot.get("samples").get((), 0)
        stored = sum(v for v in self.snapshot.get("stacks").values() if isinstance(v, int))
        return max(0, int(total) - stored) if isinstance(total, int) else 0

    @property
    def stops(self) -> dict[tuple[int, tuple[int, ...]], str]:
        return self.capture.stops if self.capture is not None else {}

    @property
    def warnings(self) -> list[str]:
        """perf's: its cap reached (pgprobe.unwind.capture.data_cap), its own warnings."""
        return self.capture.info.warnings if self.capture is not None else []


def unwind_mode(ns: argparse.Namespace, targets: Targets) -> str:
    """fp or dwarf for --stacks with the uprobe.

    auto looks at the server binary only, not at its libraries as flame does: the
    stack of a read is PostgreSQL's own, from the probed function to main (libc
    only below main). So Debian's 15, with frame pointers, walks them in the kernel
    (cheapest), and a build without them is unwound with DWARF.
    """
    if ns.unwind != "auto":
        return str(profiling.choose_unwind(ns, targets)[0])
    if not lacks_frame_pointers(targets.cluster.binary):
        return "fp"
    if choose.perf_binary() is None:
        common.warn(f"{os.path.basename(targets.cluster.binary)} has no frame pointers and "
                    "perf is not installed (Debian: linux-perf): read stacks stop after a "
                    "frame or two")  # fmt: skip
        return "fp"
    return "dwarf"


def start_dwarf(targets: Targets, namer: StackNamer, indexes: list[int]) -> DwarfStacks:
    perf = choose.perf_binary()
    if perf is None:
        raise PgprobeError("--unwind dwarf needs perf (Debian: linux-perf)", EXIT_USAGE)
    pids = (
        [targets.cluster.postmaster_pid, *targets.pids] if targets.whole_cluster else targets.pids
    )
    dwarf = DwarfStacks(perf, targets.cluster.binary, sorted(set(pids)), namer.symbolizer, indexes)
    dwarf.start()
    if dwarf.error:
        raise PgprobeError(f"--unwind dwarf: {dwarf.error}", EXIT_TRACER)
    return dwarf


def stacks_file(ns: argparse.Namespace) -> None:
    """--format/-o: where the read stacks go (-o implies --stacks), checked before the
    capture; ns.format is then the file's format, or None when there is no file."""
    if ns.format and not ns.output:
        raise PgprobeError(f"--format {ns.format} needs -o FILE (stdout holds the table)",
                           EXIT_USAGE)  # fmt: skip
    if not ns.output:
        return
    if ns.output == "-":
        raise PgprobeError("-o -: stdout holds the table: give -o FILE", EXIT_USAGE)
    ns.stacks = True
    ns.format = ns.format or ("pprof" if outfile.wants_pprof(ns.output) else "folded")
    outfile.check(ns.output, "-o")
