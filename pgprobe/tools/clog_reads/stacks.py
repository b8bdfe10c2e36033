"""Names the raw user stacks of @read_stacks (clog-reads --stacks) with the profiling symbolizer."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from pgprobe.discover import Backend, Targets
from pgprobe.engines.base import NamedStack, Snapshot
from pgprobe.symbolize import Frame, Symbolizer, folded_names
from pgprobe.tools import profiling
from pgprobe.tools.clog_reads.records import StackRow


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
