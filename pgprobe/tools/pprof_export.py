"""Tool results as pprof profiles (pgprobe.render.pprof), and writing them.

- ``cpu_profile(profile)``: the CPU samples of ``flame``/``hot``/``serve``
  (pgprobe.tools.profiling.Profile). Two values per stack: ``samples/count``
  and ``cpu/nanoseconds`` (samples x 1e9 / Hz, the sampling period), the
  period ``cpu/nanoseconds`` at 1e9 / Hz, ``cpu`` shown by default.
- ``reads_profile(rows, ...)``: the SLRU read stacks of ``clog-reads
  --stacks``, one value ``reads/count``.
- ``folded_profile(stacks)``: a folded file (``flame --from``), one value
  ``samples/count``; frames carry no module.

Another stack output (``waits --stacks``: off-CPU time) builds its own
``pprof.Sample``s with the sample type that says what it counts
(``pprof.ValueType("off_cpu", "nanoseconds")``) and labels such as
``wait_event``, and writes them with ``write()``: the renderer is generic.

Frames are functions in modules, as ``pgprobe hot`` counts them (kernel
frames without FlameGraph's ``_[k]``, in ``[kernel.kallsyms]``; an empty stack
is one ``[unknown]`` frame), so that ``go tool pprof -top`` shows the flat and
cumulative figures of ``pgprobe hot``'s self and total columns. Labels
(strings, left out when empty): ``pid``, ``backend_type``, ``application_name``, and with
``--by query`` or ``--query-id`` ``query_id`` (a statement's, as pg_stat_statements shows it).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from pgprobe import outfile
from pgprobe.discover import Backend, Targets
from pgprobe.errors import EXIT_USAGE, PgprobeError
from pgprobe.render import pprof
from pgprobe.tools import profiling
from pgprobe.tools.queries.records import STATEMENT

SAMPLES = pprof.ValueType("samples", "count")
CPU_NS = pprof.ValueType("cpu", "nanoseconds")
READS = pprof.ValueType("reads", "count")
SUFFIX = outfile.PPROF_SUFFIX  # `-o cpu.pb.gz` means --format pprof
wants_pprof = outfile.wants_pprof


def labels(
    pid: int, backend: Backend | None, postmaster_pid: int = 0
) -> dict[str, pprof.LabelValue]:
    kind = backend.backend_type if backend else ""
    if pid == postmaster_pid:
        kind = "postmaster"
    return {
        "pid": str(pid),  # a string: Pyroscope and Parca keep string labels only
        "backend_type": kind,
        "application_name": backend.application_name if backend else "",
    }


def cpu_profile(profile: profiling.Profile, duration_s: float | None = None) -> pprof.Profile:
    """CPU samples and nanoseconds per (pid, stack), at the capture's Hz.

    duration_s: the span the stacks cover (serve: one window), if not the whole capture.
    """
    period_ns = round(1e9 / profile.hz)
    postmaster = profile.targets.cluster.postmaster_pid
    # Stacks of distinct addresses in the same functions are one sample here.
    counts: Counter[tuple[int, str, tuple[pprof.Frame, ...]]] = Counter()
    for s in profile.stacks:
        frames = s.frames or (profiling.UNKNOWN_FRAME,)
        named = tuple(pprof.Frame(profiling.plain_name(f), f.module) for f in frames)
        counts[s.pid, _query_label(profile, s), named] += s.count
    samples = [
        pprof.Sample(frames, (n, n * period_ns),
                     {**labels(pid, profile.describe(pid), postmaster), "query_id": query})
        for (pid, query, frames), n in counts.items()
    ]  # fmt: skip
    duration = profile.info.duration_seconds if duration_s is None else duration_s
    duration_ns = int(duration * 1e9)
    facts = profile.facts()
    if duration_s is not None:
        facts["duration"] = f"{duration_s:.1f} s"
    return pprof.build(
        samples,
        (SAMPLES, CPU_NS),
        default_type=CPU_NS.type,
        period_type=CPU_NS,
        period=period_ns,
        time_nanos=time.time_ns() - duration_ns,
        duration_nanos=duration_ns,
        comments=[f"pgprobe: {k}: {v}" for k, v in facts.items()],
        main_module=profile.server_module,
    )


def _query_label(profile: profiling.Profile, stack: profiling.StackCount) -> str:
    """The statement's id as a label (--by query), "" (left out) for any other part."""
    part = profile.parts.get(stack.query) if stack.query is not None else None
    if part is None or part.kind != STATEMENT or part.query_id is None:
        return ""
    return str(part.query_id)


def frame_of(name: str, main: str) -> pprof.Frame:
    """A folded frame name (pgprobe.symbolize.folded_names) back to function and module.

    ``libc.so.6`read`` is read() in libc.so.6; ``postgres+0x2f70b0`` an unnamed
    function of postgres; ``[unknown]`` has no module; any other name is the
    server's (``main``).
    """
    module, tick, function = name.partition("`")
    if tick:
        return pprof.Frame(function, module)
    if "+0x" in name:
        return pprof.Frame(name, name.split("+0x", 1)[0])
    if name.startswith("["):
        return pprof.Frame(name, name)
    return pprof.Frame(name, main)


class ReadStack(Protocol):
    """A code path that read SLRU pages (clog_reads.records.StackRow)."""

    frames: tuple[str, ...]  # folded names, innermost first
    by_pid: dict[int, int]  # reads per pid


def reads_profile(
    rows: Iterable[ReadStack],
    targets: Targets,
    describe: Callable[[int], Backend | None],
    duration_s: float,
) -> pprof.Profile:
    """SLRU reads per (pid, stack) of clog-reads --stacks, one value: reads/count."""
    main = os.path.basename(targets.cluster.binary)
    postmaster = targets.cluster.postmaster_pid
    samples = []
    for row in rows:
        frames = tuple(frame_of(n, main) for n in row.frames)
        for pid, reads in sorted(row.by_pid.items()):
            samples.append(pprof.Sample(frames, (reads,), labels(pid, describe(pid), postmaster)))
    duration_ns = int(duration_s * 1e9)
    return pprof.build(
        samples,
        (READS,),
        default_type=READS.type,
        time_nanos=time.time_ns() - duration_ns,
        duration_nanos=duration_ns,
        main_module=main,
    )


def folded_profile(stacks: Mapping[tuple[str, ...], int]) -> pprof.Profile:
    """A folded file's stacks ({(root, ..., leaf): count}), as samples without modules."""
    samples = [
        pprof.Sample(tuple(pprof.Frame(n) for n in reversed(stack)), (n,))
        for stack, n in stacks.items()
    ]
    return pprof.build(samples, (SAMPLES,), default_type=SAMPLES.type)


def write(path: str | None, profile: pprof.Profile) -> None:
    """Gzipped profile.proto to path ('-' or None: stdout, never a terminal), written
    whole (pgprobe.outfile); private (0600): its labels name each backend's application."""
    data = pprof.render(profile)
    if path in (None, "-") and sys.stdout.isatty():
        raise PgprobeError("not writing pprof to a terminal: use -o FILE.pb.gz", EXIT_USAGE)
    outfile.write(path, data, private=True)
