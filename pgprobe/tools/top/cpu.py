"""Enter's CPU functions: a low-rate CPU sample of one row's processes, asked with `c` on
the details page of a statement or a backend, taken beside the running time model.

It is `pgprobe hot --pid PID... -F 49 -d 5` (a statement's: with `--query-id`) run in a
thread: profile.bt with frame-pointer stacks, named by the symbolizer, ranked by self
samples (a function's own CPU: the innermost frame, right without frame pointers too).
Nothing is sampled until asked, and one sample at a time: its cost is the sampler's
(docs/overhead.md), for those seconds only."""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pgprobe.discover import Targets
from pgprobe.engines.base import Capture, Snapshot
from pgprobe.errors import PgprobeError
from pgprobe.tools.queries.records import STATEMENT, StatementTime
from pgprobe.tools.top.records import BackendRow

if TYPE_CHECKING:  # the sampler's modules load when first asked (0.5 s of top's start)
    from pgprobe.tools.hot.records import HotRow

HZ = 49  # samples per second per CPU: low, beside a live server in trouble
SECONDS = 5.0
TOP = 10  # functions shown


@dataclass(frozen=True)
class Asked:
    """What to sample: processes, and the statement whose samples are kept (or None)."""

    label: str  # "pid 4242", "statement 123": said on the page
    pids: tuple[int, ...]
    query_id: int | None = None


@dataclass
class Result:
    """A sample under way (rows None) or done: its functions, or why it has none."""

    asked: Asked
    started: float = field(default_factory=time.monotonic)
    rows: list[HotRow] | None = None
    samples: int = 0
    error: str = ""
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The details page's lines for it."""
        head = f"CPU functions of {self.asked.label} ({HZ} Hz for {SECONDS:g} s, by self samples)"
        if self.error:
            return [head, f"  {self.error}"]
        if self.rows is None:
            took = time.monotonic() - self.started  # bpftrace's start, then the sample
            return [head, f"  sampling... ({took:.0f} s since asked)"]
        out = [f"{head}: {self.samples:,} samples"]
        out += [f"  {r.pct(r.self_samples):5.1f} %  {r.function or '?'}  ({r.module})"
                for r in self.rows if r.self_samples]  # fmt: skip
        if not self.samples:
            out.append("  no sample: not on a CPU in those seconds")
        return out + [f"  {w}" for w in self.warnings]


def asked_for(row: object) -> Asked | str:
    """What `c` samples for a row, or why it cannot (one line)."""
    if isinstance(row, BackendRow):
        return Asked(f"pid {row.pid}", (row.pid,))
    if not isinstance(row, StatementTime):
        return "CPU functions: on a statement or a backend (views 1 and 2)"
    if row.query_id is None or row.text_keyed or row.kind != STATEMENT:
        return "CPU functions need a statement with a query id"
    return Asked(f"statement {row.query_id}", tuple(sorted(row.pids)), row.query_id)


def page_lines(sampler: CpuSampler | None, row: object) -> list[str]:
    """The details page's lines for a row's CPU functions: the hint of `c`, the sample under
    way or its result; none where `c` does not apply."""
    asked = asked_for(row)
    if sampler is None or isinstance(asked, str):
        return []
    sampled = sampler.shown_for(asked)
    if sampled is None:
        return ["", f"c: the CPU functions of {asked.label} ({SECONDS:g} s sample)"]
    return ["", *sampled.lines()]


class CpuSampler:
    """One CPU sample at a time, in a thread; the last one's result kept for the page."""

    def __init__(self, targets: Targets) -> None:
        self.targets = targets
        self.result: Result | None = None
        self._thread: threading.Thread | None = None
        self._capture: Capture | None = None

    def ask(self, asked: Asked) -> None:
        """Start a sample of `asked` (unless one is under way)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self.result = Result(asked)
        self._thread = threading.Thread(target=self._run, args=(self.result,), daemon=True,
                                        name="top-cpu")  # fmt: skip
        self._thread.start()

    def shown_for(self, asked: Asked | str) -> Result | None:
        """The result to show on the page of a row: that row's (a statement's backends
        may change from one refresh to the next: the label says which row)."""
        result = self.result
        if result is None or isinstance(asked, str) or result.asked.label != asked.label:
            return None
        return result

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self) -> None:
        """A sample under way stopped, its tracer ended (top quits: none left attached)."""
        capture, thread = self._capture, self._thread
        if capture is not None:
            capture.request_stop()
        if thread is not None:
            thread.join(timeout=30)

    def _run(self, result: Result) -> None:
        from pgprobe.tools import bystatement, profiling
        from pgprobe.tools.hot.records import hot_rows

        asked = result.asked
        ns = argparse.Namespace(hz=HZ, kernel=False, duration=SECONDS, unwind="fp",
                                engine="bpftrace", query_id=asked.query_id, by=None)  # fmt: skip
        targets = Targets(self.targets.cluster, list(asked.pids), whole_cluster=False)
        try:
            run = profiling.start(ns, targets)
            self._capture = run.capture
            final = None
            for event in run.capture.events():
                if isinstance(event, Snapshot) and event.final:
                    final = (event, run.capture.info)
            if final is None:
                result.error = run.capture.info.ended_early or "the sampler printed nothing"
                return
            profile = run.finish(*final)
        except PgprobeError as exc:
            result.error = exc.message
            return
        stacks = profile.stacks
        if asked.query_id is not None:  # the statement's samples (its backends' others not)
            major = self.targets.cluster.major
            parts = {s.query: bystatement.part(major, *s.query) for s in stacks if s.query}
            stacks = [s for s in stacks if s.query and parts[s.query].kind == STATEMENT
                      and parts[s.query].query_id == asked.query_id]  # fmt: skip
        rows = hot_rows(stacks, by_module=False)
        result.samples = sum(s.count for s in stacks)
        result.warnings = [*run.capture.info.warnings, *profile.warnings()]
        result.rows = rows[:TOP]
