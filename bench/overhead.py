"""Overhead on the traced server: pgbench throughput with and without a tool attached.

Long because the interleaved windows, the traced runs and their summaries share one
timeline of state; next split: windows, tracer, summaries (issue 16).

Method
------
One pgbench runs for the whole of a workload, with ``-P 1 --progress-timestamp``:
every second it prints the throughput of the second that just ended, stamped with
the wall clock. Measurement windows are whole runs of those one-second intervals,
so a window's TPS is exact for the window and no pgbench start, connection or
warm-up falls into it.

The windows alternate: untraced (A), traced (T), A, T, ... A. Each traced window
is compared with the mean of the untraced windows just before and just after it
(ratio = T / mean(A_before, A_after)): a pair, in which a slow drift of the
machine (other load, table bloat, checkpoints) cancels to first order. Ratios
come from such pairs only, never from absolute times. The tools take turns
(lwlocks, flame 49 Hz, flame 99 Hz, ...; the order rotates each cycle), so that
a burst of noise hits one pair of one tool, not all pairs of one tool.

A traced window starts only once the tool's probes are attached: the tool is
started, its tracer process (bpftrace, or perf) is watched for, the bench waits
the attach time seen so far (x 2, at least 0.3 s, 1 s at first), then for the
next one-second boundary of pgbench's report. The window ends with a report
boundary too, after which the tool gets SIGINT (as Ctrl-C) and the time until
it has exited, its output written, is the finish time. The tool's own
timestamps (``meta.attach_s``: bpftrace's start to "probes attached") then
confirm it was attached for the whole window; an interval that started before
the attach would be dropped (and said).

Measured per traced window: TPS ratio; start-to-attach (pgprobe's start to
probes attached = tracer spawn seen + ``attach_s``); finish; pgprobe's peak RSS
(its own, from getrusage in bench.runtool) and bpftrace's; the tool's own event
count (LWLock waits x 2 probes, CPU samples, SLRU reads) per second; the BPF
programs' run count and run time in the window (kernel BPF statistics, on for
the whole run); the CPU time of pgprobe + bpftrace during the window.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import bpfstats, common, plan, stats
from bench.configs import Config, Workload
from bench.runtool import ENV as RUSAGE_ENV
from pgprobe.sandbox import PgCluster

# -- pgbench and its one-second reports ------------------------------------------------------

_PROGRESS = re.compile(r"^progress: (\d+\.\d+) s, (\d+(?:\.\d+)?) tps")


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    tps: float


class Pgbench:
    """pgbench for the whole of a workload, its per-second reports collected in a thread."""

    def __init__(self, cluster: PgCluster, workload: Workload, seconds: int) -> None:
        self.process = cluster.pgbench(
            *workload.args, "-T", str(seconds), "-P", "1", "--progress-timestamp"
        )
        self.postmaster_pid = cluster.postmaster_pid
        self.intervals: list[Interval] = []
        self.other_lines: list[str] = []
        self._last_end: float | None = None
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            m = _PROGRESS.match(line)
            with self._cond:
                if m is None:
                    self.other_lines.append(line.rstrip())
                else:
                    end, tps = float(m.group(1)), float(m.group(2))
                    if self._last_end is not None:
                        self.intervals.append(Interval(self._last_end, end, tps))
                    self._last_end = end
                self._cond.notify_all()

    def wait_started(self, timeout: float = 30) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.intervals) >= 2, timeout):
                raise RuntimeError("pgbench reports no progress: " + self.output_tail())

    def output_tail(self) -> str:
        return "\n".join(self.other_lines[-10:])

    def next_boundary(self, after: float) -> float:
        """The first report time after `after` (pgbench reports every second on a schedule)."""
        with self._cond:
            last = self.intervals[-1].end
        return last + max(1, math.ceil(after - last))

    def wait_report(self, after: float, timeout: float = 10) -> None:
        """Until pgbench has reported an interval that ends after `after`."""
        with self._cond:
            ok = self._cond.wait_for(
                lambda: bool(self.intervals) and self.intervals[-1].end > after, timeout
            )
        if not ok and self.process.poll() is not None:
            raise RuntimeError("pgbench stopped: " + self.output_tail())

    def window(self, first_end: float, last_end: float, not_before: float = 0.0) -> Window:
        """The reported intervals whose ends lie near first_end .. last_end (a second apart)."""
        with self._cond:
            got = [
                i
                for i in self.intervals
                if first_end - 0.5 < i.end <= last_end + 0.5 and i.start >= not_before
            ]
        seconds = sum(i.end - i.start for i in got)
        tps = sum(i.tps * (i.end - i.start) for i in got) / seconds if seconds else 0.0
        return Window(got[0].start if got else first_end, last_end, tps, seconds, len(got))

    def workload_cpu_s(self) -> float:
        """CPU seconds so far of the cluster (postmaster, backends, reaped backends) and
        pgbench."""
        return common.tree_cpu_s([self.postmaster_pid]) + (
            common.proc_cpu_s(self.process.pid) or 0.0
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=5)


@dataclass
class Window:
    begin: float
    end: float
    tps: float
    seconds: float
    intervals: int
    busy_cpus: float = 0.0  # CPUs busy machine-wide during the window (of common.NCPU)
    switches_per_s: float = 0.0  # context switches of the machine (sched_switch fires)
    # CPU seconds of the cluster's processes and pgbench in the window (plus, traced, the
    # tool's: pgprobe and bpftrace; BPF programs and uprobe traps run in the backends)
    cpu_s: float = 0.0

    @property
    def cpu_us_per_tx(self) -> float | None:
        tx = self.tps * self.seconds
        return self.cpu_s / tx * 1e6 if tx and self.cpu_s else None


def untraced_window(bench: Pgbench, seconds: int) -> Window:
    b = bench.next_boundary(time.time() + 0.05)
    common.sleep_until(b)
    busy0, total0 = common.machine_cpu_s()
    switches0 = common.context_switches()
    work0 = bench.workload_cpu_s()
    common.sleep_until(b + seconds)
    bench.wait_report(b + seconds - 0.5)
    busy1, total1 = common.machine_cpu_s()
    switches = common.switches_per_s(switches0, common.context_switches())
    w = bench.window(b + 1, b + seconds)
    w.cpu_s = bench.workload_cpu_s() - work0
    w.busy_cpus = (busy1 - busy0) / (total1 - total0) * common.NCPU if total1 > total0 else 0
    w.switches_per_s = switches
    return w


# -- one traced window -----------------------------------------------------------------------


@dataclass
class ToolRun:
    config: str
    ok: bool = True
    error: str = ""
    window: Window | None = None
    start_to_attach_s: float | None = None
    spawn_s: float | None = None  # pgprobe's start to bpftrace's (Python, discovery, checks)
    attach_s: float | None = None  # the tracer's own: bpftrace start to probes attached
    finish_s: float | None = None
    rss_mib: float | None = None  # pgprobe's own peak (perf's for the anchor)
    tracer_rss_mib: float | None = None  # bpftrace's peak
    events_per_s: float | None = None  # what the tool counted
    fires_per_s: float | None = None  # BPF program runs in the window
    bpf_ns_per_fire: float | None = None
    tool_cpu_pct: float | None = None  # pgprobe + bpftrace CPU in the window, % of one CPU
    cpu_total_s: float | None = None  # pgprobe + bpftrace CPU over their whole life
    lost: int = 0
    dropped_intervals: int = 0
    warnings: list[str] = field(default_factory=list)
    # per BPF program in the window: name, kind, fires/s, ns per fire
    programs: list[dict[str, Any]] = field(default_factory=list)
    # the tool's own cost figures from its JSON meta (dwarf: bytes_per_sample, perf_stop_s,
    # unwind_cpu_s; samples, truncated samples)
    meta: dict[str, Any] = field(default_factory=dict)


def _tracer_children(pid: int) -> list[int]:
    """The capture's tracer processes among pid's children: bpftrace (not `bpftrace
    --version`; triage runs several side by side) and `perf record` (--unwind dwarf); and
    pid itself once it holds BPF links (a compiled object, bpf/build/*.bpf.o, runs in it)."""
    found = [pid] if "anon_inode:bpf_link" in (t for _, t in common.fd_targets(pid)) else []
    for child in common.children(pid):
        argv = common.cmdline(child)
        name = os.path.basename(argv[0]) if argv else ""
        bpftrace = name == "bpftrace" and "--version" not in argv
        if bpftrace or (name == "perf" and "record" in argv):
            found.append(child)
    return found


def _tool_cpu(pids: list[int]) -> float:
    return sum(common.proc_cpu_s(p) or 0.0 for p in pids)


def _bpf(pids: list[int], names: dict[int, str]) -> list[bpfstats.Program]:
    return [p for pid in pids for p in bpfstats.programs(pid, names)]


def _attach_times(doc: Any) -> list[float]:
    """Every meta.attach_s in a tool's JSON document (triage nests one per capture)."""
    if isinstance(doc, dict):
        found = [float(v) for k, v in doc.items() if k == "attach_s" and v is not None]
        return found + [a for v in doc.values() for a in _attach_times(v)]
    if isinstance(doc, list):
        return [a for v in doc for a in _attach_times(v)]
    return []


def _events(config: Config, doc: dict[str, Any]) -> float | None:
    """Events per second the tool itself counted, from its JSON document."""
    meta, rows = doc.get("meta", {}), doc.get("rows", [])
    duration = float(meta.get("duration_s") or 0)
    if not duration:
        return None
    if config.tool == "lwlocks":  # a wait fires lwlock__wait__start and lwlock__wait__done
        return 2 * sum(int(r.get("waits", 0)) for r in rows) / duration
    if config.tool == "flame":
        return float(meta.get("samples_taken", meta.get("samples", 0))) / duration
    if rows and "reads" in rows[0]:
        return sum(int(r.get("reads", 0)) for r in rows) / duration
    return None


FALLBACK_ATTACH_WAIT_S = 8.0
EARLY_SIGINT = "interrupted before the probes were attached"  # pgprobe's words, exit 130
ATTACH_SETTLE_S = 1.0
FINISH_LIMIT_S = 60.0  # then a second Ctrl-C (bench: finish budgets are 1.5-3 s)
# pgprobe prints phase marks on stderr with this set (pgprobe/timings.py): "<tracer>-spawned"
# and "<tracer>-attached" are the exact moments; without them the perf-event heuristic.
TIMINGS_ENV = "PGPROBE_TIMINGS"
TIMING_PREFIX = "pgprobe: timing "


def _timing_marks(err_path: Path) -> tuple[int, int] | None:
    """(tracers spawned, tracers attached) from pgprobe's timing marks so far; None while
    the tool prints none (a pgprobe without timings, or not started yet)."""
    try:
        text = err_path.read_text(errors="replace")
    except OSError:
        return None
    phases = [line[len(TIMING_PREFIX) :].split()[0] for line in text.splitlines()
              if line.startswith(TIMING_PREFIX) and len(line) > len(TIMING_PREFIX)]  # fmt: skip
    if not phases:
        return None
    spawned = sum(1 for p in phases if p.endswith("-spawned"))
    attached = sum(1 for p in phases if p.endswith("-attached"))
    return spawned, attached


@dataclass
class _AttachWatch:
    """When a tracer's probes are attached, from its open perf events.

    bpftrace 0.17 attaches each probe (tracepoint, uprobe, USDT, profile timer, its own
    BEGIN/END) with perf_event_open, after loading the programs and opening one output
    buffer per CPU: once it holds more perf events than CPUs + programs, and the count has
    stayed the same for ATTACH_SETTLE_S, every probe is in. perf record opens its events
    (per CPU and target) before it starts writing: steady and at least one per CPU.
    The tool's own attach time (meta.attach_s) confirms it afterwards.
    """

    count: int = -1
    since: float = 0.0
    ready: bool = False

    def look(self, pid: int, now: float) -> None:
        fds = [target for _, target in common.fd_targets(pid)]
        perf = fds.count("anon_inode:[perf_event]")
        progs = fds.count("anon_inode:bpf-prog")
        if perf != self.count:
            self.count, self.since = perf, now
        enough = perf >= common.NCPU + progs if progs else perf >= common.NCPU
        if common.comm(pid) == "bpftrace" and not progs:
            enough = False
        self.ready = enough

    def settled(self, now: float) -> bool:
        return self.ready and now - self.since >= ATTACH_SETTLE_S


@dataclass
class _Times:
    """Wall-clock moments of one traced window (time.time())."""

    start: float  # the tool's process started
    spawn: float = 0.0  # its (first) tracer process seen (bpftrace), or perf's events open
    spawn_last: float = 0.0  # the last of its tracer processes seen
    attached: float = 0.0  # the bench judged the probes attached (its watch ended)
    first_end: float = 0.0  # the first and last report boundaries of the window
    last_end: float = 0.0
    sigint: float = 0.0
    busy: tuple[float, float] = (0.0, 0.0)  # CPUs busy machine-wide: seconds busy, total
    tool_cpu_s: float = 0.0
    work_cpu_s: float = 0.0  # the cluster's and pgbench's CPU in the window
    bpf: list[bpfstats.Program] = field(default_factory=list)  # runs and ns in the window
    switches_per_s: float = 0.0  # context switches of the machine in the window


class Tracer:
    """Runs traced windows of one configuration and remembers its attach times."""

    def __init__(self, config: Config, cluster: PgCluster, workdir: Path) -> None:
        self.config = config
        self.cluster = cluster
        self.workdir = workdir
        self.attach_seen: list[float] = []
        self.failures = 0  # counted runs that failed; after 2 the configuration is skipped
        self.prog_names: dict[int, str] = {}  # BPF program names by id, read once
        # Ctrl-C came before the probes were attached: the heuristic opened the window too
        # early; the next windows wait at least this long after the tracer appears
        self.min_attach_s = 0.0
        self.early_retries = 0

    def attach_wait(self) -> float:
        """How long to wait after the tracer appears: 1.5 x the longest attach seen + 0.3 s."""
        if not self.attach_seen:
            return 1.0
        return min(12.0, max(0.3, 1.5 * max(self.attach_seen) + 0.3))

    def argv(self, duration: int, perf_data: Path) -> list[str]:
        if self.config.kind == "perf":
            pm = self.cluster.postmaster_pid
            pids = [pm, *common.children(pm)]
            return ["perf", "record", "-F", "99", "-g", "-p", ",".join(map(str, pids)),
                    "-o", str(perf_data)]  # fmt: skip
        if self.config.kind == "bpftrace":
            postmaster = str(self.cluster.postmaster_pid)
            args = [postmaster if a == "POSTMASTER" else a for a in self.config.args]
            return [sys.executable, "-m", "bench.bare", *args]
        extra = ["-o", str(self.workdir / "triage.html")] if self.config.tool == "triage" else []
        return [sys.executable, "-m", "bench.runtool", self.config.tool, *self.cluster.conn_args,
                *self.config.args, *extra, "-d", str(duration), "--json"]  # fmt: skip

    def run(self, bench: Pgbench, seconds: int) -> ToolRun:
        result = ToolRun(self.config.key)
        rusage = self.workdir / "rusage.json"
        perf_data = self.workdir / "perf.data"
        out_path, err_path = self.workdir / "tool.out", self.workdir / "tool.err"
        for stale in (rusage, perf_data):
            stale.unlink(missing_ok=True)
        wait = self.attach_wait()
        # Long enough for the window and the waits before it; the window ends with SIGINT.
        argv = self.argv(int(seconds + max(wait, FALLBACK_ATTACH_WAIT_S) + 20), perf_data)
        with open(out_path, "w") as out, open(err_path, "w") as err:
            times = _Times(start=time.time())
            child = subprocess.Popen(
                argv,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                cwd=common.RUN_DIR,
                env={**os.environ, RUSAGE_ENV: str(rusage), TIMINGS_ENV: "1"},
                start_new_session=True,  # a session of its own, as from a DBA's shell
            )
        try:
            self._window(child, argv, times, wait, bench, seconds, result, err_path)
        finally:
            if child.returncode is None and child.poll() is None:
                child.kill()
                child.wait()
        if result.ok:
            if self.config.kind == "perf":
                self._perf_results(result, times, err_path, bench)
            elif self.config.kind == "bpftrace":
                self._bare_results(result, times, bench)
            else:
                self._pgprobe_results(result, times, out_path, err_path, rusage, bench)
        if not result.ok:
            result.error += " " + err_path.read_text(errors="replace").strip()[-400:]
            early = EARLY_SIGINT in result.error and times.sigint and times.spawn
            if early and self.early_retries < 3:
                # the bench's mistake, not the tool's: wait longer next time
                self.early_retries += 1
                self.min_attach_s = max(self.min_attach_s, 2 * (times.sigint - times.spawn))
            else:
                self.failures += 1
        perf_data.unlink(missing_ok=True)
        return result

    def _attach(
        self,
        child: subprocess.Popen[bytes],
        argv: list[str],
        t: _Times,
        wait: float,
        err_path: Path,
    ) -> list[int]:
        """Wait for the tracers to start and their probes to be attached.

        pgprobe: its tracer children (bpftrace, several for triage; perf record for
        --unwind dwarf) until each has its perf events open and steady (_AttachWatch) and
        the longest attach time seen for this tool has passed; at most `wait` (the first
        time FALLBACK_ATTACH_WAIT_S) after the last tracer appeared. The perf
        anchor: until it has opened one sampling and one tracking event per CPU for each
        target.
        """
        perf_targets = len(argv[argv.index("-p") + 1].split(",")) if "-p" in argv else 0
        seen: dict[int, float] = {}
        watch: dict[int, _AttachWatch] = {}
        learned = max(max(self.attach_seen, default=0.0), self.min_attach_s)
        deadline = t.start + 60
        while time.time() < deadline and child.poll() is None:
            now = time.time()
            if self.config.kind == "perf":
                if not seen and common.perf_event_fds(child.pid) >= perf_targets * common.NCPU:
                    seen[child.pid] = now
            else:
                for pid in _tracer_children(child.pid):
                    seen.setdefault(pid, now)
                    watch.setdefault(pid, _AttachWatch()).look(pid, now)
            marks = _timing_marks(err_path)
            if marks is not None and self.config.kind != "perf":
                spawned, attached = marks
                if seen and spawned and attached >= spawned:
                    break  # pgprobe says every tracer it started has its probes attached
            elif seen:
                since = now - max(seen.values())
                # every tracer's perf events open and steady, and at least as long as this
                # tool's attach took before (bpftrace loads and attaches probe by probe)
                if all(w.settled(now) for w in watch.values()) and since >= learned:
                    break
                limit = wait if self.attach_seen else FALLBACK_ATTACH_WAIT_S
                if since >= max(limit, self.min_attach_s):
                    break
            time.sleep(0.01)
        if seen:
            t.spawn, t.spawn_last = min(seen.values()), max(seen.values())
        return sorted(seen)

    def _window(
        self,
        child: subprocess.Popen[bytes],
        argv: list[str],
        t: _Times,
        wait: float,
        bench: Pgbench,
        seconds: int,
        result: ToolRun,
        err_path: Path,
    ) -> None:
        tracers = self._attach(child, argv, t, wait, err_path)
        t.attached = time.time()
        if not tracers or child.poll() is not None:
            result.ok = False
            result.error = f"no tracer after {time.time() - t.start:.1f} s (exit {child.poll()})"
            return
        pids = sorted({child.pid, *tracers})
        start_of_window = bench.next_boundary(time.time() + 0.05)
        t.first_end = start_of_window + 1
        t.last_end = start_of_window + seconds
        common.sleep_until(start_of_window)
        names = self.prog_names
        cpu0, bpf0, busy0 = _tool_cpu(pids), _bpf(tracers, names), common.machine_cpu_s()
        switches0 = common.context_switches()
        work0 = bench.workload_cpu_s()
        common.sleep_until(t.last_end)
        bench.wait_report(t.last_end - 0.5)
        cpu1, bpf1, busy1 = _tool_cpu(pids), _bpf(tracers, names), common.machine_cpu_s()
        t.switches_per_s = common.switches_per_s(switches0, common.context_switches())
        t.work_cpu_s = bench.workload_cpu_s() - work0
        if child.poll() is not None:
            result.ok = False
            result.error = f"the tool ended before the window did (exit {child.returncode})"
            return
        t.tool_cpu_s = cpu1 - cpu0
        t.bpf = bpfstats.delta(bpf0, bpf1)
        t.busy = (busy1[0] - busy0[0], busy1[1] - busy0[1])
        # Ctrl-C, and the time until the output is written and the process gone.
        t.sigint = time.time()
        child.send_signal(signal.SIGINT)
        # A tracer that has not ended a minute after Ctrl-C gets a second one (bpftrace
        # then quits at once): once, the floor row's bpftrace sat 11 minutes past the first,
        # and with it the whole time box. Its pair is dropped, said as an error.
        stuck = threading.Timer(FINISH_LIMIT_S, _interrupt, args=(tracers,))
        stuck.start()
        done = common.wait_measured(child, t.sigint)
        stuck.cancel()
        if done.wall_s > FINISH_LIMIT_S:
            _wait_gone(tracers)
            result.ok = False
            result.error = f"still running {FINISH_LIMIT_S:.0f} s after Ctrl-C: interrupted again"
            return
        # pgprobe does not await a bpftrace that has answered: it detaches its probes
        # after pgprobe exits (a uprobe in 80-150 ms). The next untraced window starts
        # once it is gone.
        _wait_gone(tracers)
        result.finish_s = done.wall_s
        result.cpu_total_s = done.cpu_s
        if self.config.kind == "perf":
            result.rss_mib = done.maxrss_kib / common.KIB_PER_MIB
        # perf record re-raises the SIGINT once its file is written
        if done.returncode not in (0, -signal.SIGINT):
            result.ok = False
            result.error = f"exit {done.returncode}"

    def _fill_window(self, result: ToolRun, t: _Times, bench: Pgbench, attached: float) -> None:
        window = bench.window(t.first_end, t.last_end, not_before=attached)
        result.dropped_intervals = (round(t.last_end - t.first_end) + 1) - window.intervals
        window.busy_cpus = t.busy[0] / t.busy[1] * common.NCPU if t.busy[1] else 0.0
        window.switches_per_s = t.switches_per_s
        window.cpu_s = t.work_cpu_s + t.tool_cpu_s
        result.window = window
        span = t.last_end - (t.first_end - 1)
        result.tool_cpu_pct = 100 * t.tool_cpu_s / span
        runs, ns = sum(p.runs for p in t.bpf), sum(p.ns for p in t.bpf)
        if runs > 0:
            result.fires_per_s = runs / span
            result.bpf_ns_per_fire = ns / runs
        result.programs = [
            {"name": p.name, "kind": p.kind, "fires_per_s": round(p.runs / span, 1),
             "bpf_ns_per_fire": round(p.ns / p.runs, 1) if p.runs else None}
            for p in t.bpf
        ]  # fmt: skip
        if window.intervals == 0:
            result.ok = False
            result.error = "no whole second of the window had the probes attached"

    def _perf_results(self, result: ToolRun, t: _Times, err_path: Path, bench: Pgbench) -> None:
        result.start_to_attach_s = t.spawn - t.start
        self.attach_seen.append(0.0)
        self._fill_window(result, t, bench, attached=t.spawn)
        m = re.search(r"\((\d+) samples\)", err_path.read_text(errors="replace"))
        if m and t.sigint > t.spawn:
            # perf samples from its events' opening to SIGINT, about the window and the
            # waits around it
            result.events_per_s = int(m.group(1)) / (t.sigint - t.spawn)

    def _bare_results(self, result: ToolRun, t: _Times, bench: Pgbench) -> None:
        """A bare bpftrace script: no output to read; attached when the watch said so."""
        result.start_to_attach_s = t.attached - t.start
        self.attach_seen.append(t.attached - t.spawn_last)
        self._fill_window(result, t, bench, attached=t.attached)

    def _pgprobe_results(
        self,
        result: ToolRun,
        t: _Times,
        out_path: Path,
        err_path: Path,
        rusage: Path,
        bench: Pgbench,
    ) -> None:
        lines = out_path.read_text(errors="replace").strip().splitlines()
        try:
            doc = json.loads(lines[-1])
        except (ValueError, IndexError):
            result.ok = False
            result.error = "no JSON document on stdout"
            return
        meta = doc.get("meta", {})
        result.attach_s = max(_attach_times(doc), default=0.0)
        # pgprobe times bpftrace from just before starting it; the bench saw it within
        # 10 ms. With several bpftrace (triage): the last one started + the longest attach.
        attached = t.spawn_last + result.attach_s
        result.spawn_s = t.spawn - t.start
        result.start_to_attach_s = attached - t.start
        self.attach_seen.append(attached - t.spawn_last)
        result.events_per_s = _events(self.config, doc)
        result.lost = int(meta.get("lost_events", 0)) + int(meta.get("lost_samples", 0))
        result.warnings = [str(w) for w in meta.get("warnings", [])]
        result.meta = {k: meta[k] for k in META_KEPT if meta.get(k) is not None}
        if rusage.exists():
            usage = json.loads(rusage.read_text())
            result.rss_mib = usage["self_maxrss_kib"] / common.KIB_PER_MIB
            result.tracer_rss_mib = usage["children_maxrss_kib"] / common.KIB_PER_MIB
        self._fill_window(result, t, bench, attached)


# -- a workload: A T A T ... A ---------------------------------------------------------------


@dataclass
class Pair:
    """A traced window and the untraced windows on either side of it."""

    config: str
    cycle: int
    before: Window
    run: ToolRun
    after: Window

    @property
    def ratio(self) -> float | None:
        base = (self.before.tps + self.after.tps) / 2
        if not self.run.ok or self.run.window is None or not base:
            return None
        return self.run.window.tps / base

    @property
    def extra_cpu_us_per_fire(self) -> float | None:
        """CPU the tracing added per probe fire, from CPU per transaction.

        traced tx/s x (traced - untraced CPU per transaction) is the CPU per second
        the tracing cost (in the backends: traps and BPF programs; in pgprobe and
        bpftrace); divided by the probe fires per second, the all-in cost of one fire.
        """
        w, fires = self.run.window, self.run.fires_per_s
        befores = [x.cpu_us_per_tx for x in (self.before, self.after)]
        if w is None or not fires or None in befores or w.cpu_us_per_tx is None:
            return None
        base = sum(b for b in befores if b is not None) / 2
        return w.tps * (w.cpu_us_per_tx - base) / fires

    @property
    def cpu_ratio(self) -> float | None:
        """CPU per transaction, traced / untraced (the tool's own CPU counted in)."""
        befores = [w.cpu_us_per_tx for w in (self.before, self.after)]
        if self.run.window is None or None in befores:
            return None
        traced = self.run.window.cpu_us_per_tx
        base = sum(b for b in befores if b is not None) / 2
        return traced / base if traced and base else None


@dataclass
class WorkloadResult:
    workload: Workload
    seconds: int
    pairs: list[Pair] = field(default_factory=list)
    untraced: list[Window] = field(default_factory=list)
    failed: list[ToolRun] = field(default_factory=list)
    foreign_cpu_pct: float | None = None  # other processes' CPU, % of the machine
    foreign_processes: set[str] = field(default_factory=set)
    loadavg_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    elapsed_s: float = 0.0
    long_runs: list[ToolRun] = field(default_factory=list)  # e.g. a 30 s dwarf capture
    cut_at_cycle: int | None = None  # the time box ended the cycles early


def run_workload(
    cluster: PgCluster,
    workload: Workload,
    entries: list[tuple[Config, int]],
    seconds: int,
    warmup: float,
    tracers: dict[str, Tracer],
    deadline: float | None = None,
    long_capture: tuple[str, int] | None = None,
) -> WorkloadResult:
    """Warm-up, then A T A T ... A over the configurations, each its own number of pairs.

    A tool that has never run yet runs once first for 1 s (not counted), so that its
    attach time is known and the first counted run does not start the window early.
    Past `deadline` (time.time()) no new cycle starts once every configuration has two
    pairs. `long_capture` (configuration key, seconds): one more traced run of that
    length at the end, for its finish time (not a pair).
    """
    result = WorkloadResult(workload, seconds, loadavg_before=common.loadavg())
    roots = [os.getpid(), cluster.postmaster_pid]
    busy0, total0 = common.machine_cpu_s()
    ours0 = common.tree_cpu_s(roots)
    started = time.time()
    plan_entries = [plan.Entry(workload.key, c.key, n) for c, n in entries]
    length = plan.workload_seconds(plan_entries, seconds, len(entries))
    length += long_capture[1] + plan.LONG_EXTRA_S if long_capture else 0
    bench = Pgbench(cluster, workload, int(length * 2 + 600))
    try:
        bench.wait_started()
        time.sleep(warmup)
        for config, _ in entries:
            tracer = tracers[config.key]
            if not tracer.attach_seen:
                common.log(
                    f"  [{workload.key}] {config.label}: a first run to learn its attach time"
                )
                tracer.run(bench, 1)
                if tracer.attach_seen:  # it ran: an early window is not a failure
                    tracer.failures = 0
        before = untraced_window(bench, seconds)
        result.untraced.append(before)
        n = 0
        for cycle in range(max((p for _, p in entries), default=0)):
            if deadline is not None and time.time() > deadline and cycle >= 2:
                common.log(f"  [{workload.key}] time box reached: no more cycles")
                result.cut_at_cycle = cycle
                break
            due = [c for c, p in entries if p > cycle]
            shift = cycle % len(due)
            for config in due[shift:] + due[:shift]:
                tracer = tracers[config.key]
                if tracer.failures >= 2:
                    continue
                n += 1
                run = tracer.run(bench, seconds)
                after = untraced_window(bench, seconds)
                result.untraced.append(after)
                result.foreign_processes.update(common.foreign_load_processes(roots))
                if not run.ok:
                    result.failed.append(run)
                    common.log(f"  [{workload.key} {n}] {config.label}: FAILED {run.error}")
                    before = after
                    continue
                pair = Pair(config.key, cycle, before, run, after)
                result.pairs.append(pair)
                common.log(f"  [{workload.key} {n}] {describe(pair)}")
                before = after
        if long_capture is not None and long_capture[0] in tracers:
            key, capture_s = long_capture
            common.log(f"  [{workload.key}] {key}: one {capture_s} s capture, for its finish time")
            long_run = tracers[key].run(bench, capture_s)
            result.long_runs.append(long_run)
            common.log(
                f"    finish {_f(long_run.finish_s, '.2f')} s, "
                f"{long_run.meta.get('bytes_per_sample', '-')} bytes/sample"
                + ("" if long_run.ok else f", FAILED {long_run.error}")
            )
    finally:
        bench.stop()
    busy1, total1 = common.machine_cpu_s()
    ours1 = common.tree_cpu_s(roots)
    if total1 > total0:
        result.foreign_cpu_pct = max(
            0.0, 100 * ((busy1 - busy0) - (ours1 - ours0)) / (total1 - total0)
        )
    result.elapsed_s = time.time() - started
    return result


def _interrupt(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)


def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Until none of pids is alive (a zombie counts as gone), at most `timeout` seconds."""
    deadline = time.time() + timeout
    for pid in pids:
        while time.time() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                break
            if state in ("Z", "X"):
                break
            time.sleep(0.02)


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def describe(pair: Pair) -> str:
    r, w = pair.run, pair.run.window
    assert w is not None
    return (
        f"{pair.config}: ratio {_f(pair.ratio, '.3f')} (traced {w.tps:,.0f} tps over "
        f"{w.seconds:.1f} s; untraced {pair.before.tps:,.0f} / {pair.after.tps:,.0f}) "
        f"cpu/tx ratio {_f(pair.cpu_ratio, '.3f')} "
        f"attach {_f(r.start_to_attach_s, '.2f')} s finish {_f(r.finish_s, '.2f')} s "
        f"rss {_f(r.rss_mib, '.0f')} MiB events/s {_f(r.events_per_s, ',.0f')} "
        f"fires/s {_f(r.fires_per_s, ',.0f')} tool cpu {_f(r.tool_cpu_pct, '.1f')} %"
    )


MIN_FIRES_FOR_COST = 1000.0
# The tools' own cost figures kept from their JSON meta
META_KEPT = ("unwind", "bytes_per_sample", "perf_stop_s", "unwind_cpu_s", "perf_cpu_s",
             "samples", "samples_taken", "truncated_samples", "source", "missed_runs",
             "unseen_events")  # fmt: skip

# -- summaries -------------------------------------------------------------------------------


@dataclass
class Summary:
    config: Config
    workload: Workload
    ratios: list[float]
    runs: list[ToolRun]
    untraced_tps: float | None
    busy_cpus: float | None  # machine CPUs busy in the untraced windows (median)

    def med(self, attr: str) -> float | None:
        return common.median(getattr(r, attr) for r in self.runs)

    def peak(self, attr: str) -> float | None:
        got = [getattr(r, attr) for r in self.runs if getattr(r, attr) is not None]
        return max(got) if got else None

    cpu_ratios: list[float] = field(default_factory=list)
    per_fire_us: list[float] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return common.median(self.ratios)

    @property
    def interval(self) -> stats.Interval | None:
        """The ratio's geometric mean with its 95 % confidence interval (2+ pairs)."""
        return stats.ratio_interval(self.ratios)

    @property
    def cpu_ratio(self) -> float | None:
        return common.median(self.cpu_ratios)

    @property
    def extra_cpu_us_per_fire(self) -> float | None:
        """Median of the pairs; only where probes fire often enough (1,000/s) for the
        cost to stand out of the noise, and only a positive cost."""
        fires = self.med("fires_per_s")
        value = common.median(self.per_fire_us)
        if value is None or fires is None or fires < MIN_FIRES_FOR_COST or value <= 0:
            return None
        return value


def summarize(result: WorkloadResult, configs: list[Config]) -> list[Summary]:
    out = []
    busy = common.median(w.busy_cpus for w in result.untraced)
    tps = common.median(w.tps for w in result.untraced)
    for config in configs:
        pairs = [p for p in result.pairs if p.config == config.key]
        ratios = [p.ratio for p in pairs if p.ratio is not None]
        cpu = [p.cpu_ratio for p in pairs if p.cpu_ratio is not None]
        runs = [p.run for p in pairs]
        fire = [p.extra_cpu_us_per_fire for p in pairs if p.extra_cpu_us_per_fire is not None]
        out.append(Summary(config, result.workload, ratios, runs, tps, busy, cpu, fire))
    return out
