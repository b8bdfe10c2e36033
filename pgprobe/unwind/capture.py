"""A CPU-sampling capture through perf's DWARF mode, unwound by pgprobe.

``PerfCapture`` runs ``perf record -e cpu-clock -c 1e9/HZ --call-graph
dwarf,STACK -p PIDS`` into a temporary perf.data (perf follows the children
the targets fork while it runs: backends of the postmaster), stops it with
SIGINT at the end of the duration or on Ctrl-C, reads the samples
(pgprobe.unwind.perfdata), unwinds each copied stack (pgprobe.unwind.dwarf)
and yields one final Snapshot shaped like bpf/profile.bt's maps: ``stacks``
{(pid, user addresses)} or ``kstacks`` {(pid, kernel addresses, user
addresses)}, and ``samples``. So the rest of the profile pipeline does not
know which way the stacks were walked; ``stops`` says why a stack stopped
early, per (pid, user addresses).

cpu-clock on a task counts that task's CPU time, and with a fixed period
(``-c 1e9/HZ`` ns) a backend gets one sample per 1/HZ s it runs, whatever
else the machine does.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pgprobe.engines.base import AggValue, Event, Key, RunInfo, Snapshot, TickCallback
from pgprobe.errors import EXIT_TRACER, PgprobeError
from pgprobe.symbolize import Symbolizer
from pgprobe.unwind import perfdata
from pgprobe.unwind.dwarf import Unwinder

DEFAULT_STACK_BYTES = 16_384  # deep enough for PostgreSQL's stacks (measured: docs/flame.md)
ATTACH_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0
START_ATTEMPTS = 3


@dataclass
class UnwindCost:
    """What the DWARF mode cost, for meta and the docs."""

    file_bytes: int = 0
    samples: int = 0
    post_cpu_s: float = 0.0  # reading perf.data and unwinding, CPU seconds of pgprobe
    perf_stop_s: float = 0.0  # wall seconds from SIGINT until perf record exited
    perf_cpu_s: float = 0.0  # CPU seconds perf record used, start to exit

    @property
    def bytes_per_sample(self) -> int:
        return self.file_bytes // self.samples if self.samples else 0


def perf_version(perf: str) -> str:
    try:
        out = subprocess.run([perf, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().removeprefix("perf version ")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _perf_fds(pid: int) -> int:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    n = 0
    for fd in fds:
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
        except OSError:
            continue
    return n


class PerfCapture:
    """A Capture (pgprobe.engines.base) of CPU samples with DWARF-unwound user stacks."""

    def __init__(
        self,
        perf: str,
        pids: Sequence[int],
        hz: int,
        duration: float,
        kernel: bool,
        symbolizer: Symbolizer,
        stack_bytes: int = DEFAULT_STACK_BYTES,
        event: Sequence[str] = (),
    ) -> None:
        """event: perf's event options instead of cpu-clock at hz (``-e GROUP:NAME -c 1``
        for every hit of a uprobe, pgprobe.unwind.uprobe)."""
        self.perf = perf
        self.pids = list(pids)
        self.hz = hz
        self.duration = duration
        self.kernel = kernel
        self.symbolizer = symbolizer
        self.stack_bytes = stack_bytes
        # A fixed period of task CPU time (cpu-clock counts nanoseconds), not -F: perf's
        # frequency mode re-tunes the period as a task runs and idles, and overshot by
        # 10-15 % for a backend that competes for the CPU; a period gives CPU time x Hz.
        self.event = list(event) or ["-e", "cpu-clock", "-c", str(1_000_000_000 // hz)]
        self.info = RunInfo(engine="perf", engine_version=perf_version(perf))
        self.on_tick: TickCallback | None = None
        self.stops: dict[tuple[int, tuple[int, ...]], str] = {}
        self.cost = UnwindCost()
        self._stop = False
        self._children_cpu_at_start = 0.0

    def request_stop(self) -> None:
        self._stop = True

    def argv(self, output: str) -> list[str]:
        return [
            self.perf, "record", "-q", "-N", "-B", *self.event,
            "--call-graph", f"dwarf,{self.stack_bytes}", "-o", output,
            "-p", ",".join(str(p) for p in self.pids),
        ]  # fmt: skip

    def events(self) -> Iterator[Event]:
        workdir = tempfile.mkdtemp(prefix="pgprobe-perf-")
        try:
            output = os.path.join(workdir, "perf.data")
            for attempt in range(START_ATTEMPTS):
                # perf record -p fails as a whole when one pid has gone: only live ones,
                # and again if one went between the check and perf's start.
                self.pids = [p for p in self.pids if os.path.exists(f"/proc/{p}")]
                if not self.pids:
                    raise PgprobeError("every target process has exited", EXIT_TRACER)
                if self._record(output, last=attempt == START_ATTEMPTS - 1):
                    break
            yield self._snapshot(output)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _record(self, output: str, last: bool = True) -> bool:
        """Run perf record until the end of the capture. False: it could not start."""
        started = time.monotonic()
        self._children_cpu_at_start = _children_cpu_s()
        child = subprocess.Popen(
            self.argv(output),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # Ctrl-C reaches pgprobe, which stops perf itself
        )
        attached: float | None = None
        try:
            while child.poll() is None:
                now = time.monotonic()
                if attached is None and _perf_fds(child.pid) >= len(self.pids):
                    attached = now
                    self.info.attach_seconds = now - started
                    self.info.probes_attached = len(self.pids)
                if attached is None and now - started > ATTACH_TIMEOUT_S:
                    raise PgprobeError(
                        "perf record did not start sampling within 30 s", EXIT_TRACER
                    )
                remaining = None if attached is None else max(0.0, self.duration - (now - attached))
                if self.on_tick is not None:
                    self.on_tick(self.info, remaining)
                if remaining == 0.0 or (self._stop and attached is not None):
                    self.info.interrupted = self._stop
                    break
                try:
                    time.sleep(0.1)
                except KeyboardInterrupt:
                    self._stop = True
        except KeyboardInterrupt:
            self.info.interrupted = True
        finally:
            if attached is not None:
                self.info.duration_seconds = time.monotonic() - attached
            stopping = time.monotonic()
            if child.poll() is None:
                child.send_signal(signal.SIGINT)
            try:
                _, err = child.communicate(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                _, err = child.communicate()
            self.cost.perf_stop_s = time.monotonic() - stopping
            self.cost.perf_cpu_s = _children_cpu_s() - self._children_cpu_at_start
        problems = [ln.strip() for ln in (err or "").splitlines() if ln.strip()]
        if attached is None and not last and not self._stop:
            return False
        if not os.path.exists(output) or os.path.getsize(output) == 0:
            detail = problems[-1] if problems else f"exit status {child.returncode}"
            raise PgprobeError(f"perf record wrote no samples: {detail}", EXIT_TRACER)
        self.info.warnings.extend(f"perf: {ln}" for ln in problems if "Warning" in ln)
        return True

    def _snapshot(self, output: str) -> Snapshot:
        t0 = time.process_time()
        try:
            data = perfdata.read(output)
        except (OSError, perfdata.PerfDataError) as exc:
            raise PgprobeError(f"cannot read perf's output: {exc}", EXIT_TRACER) from None
        unwinder = Unwinder(self.symbolizer)
        counts: dict[Key, int] = {}
        for s in data.samples:
            walk = unwinder.unwind(s.pid, s.regs, s.stack)
            key: Key = (s.pid, tuple(s.kernel), walk.addrs) if self.kernel else (s.pid, walk.addrs)
            counts[key] = counts.get(key, 0) + 1
            if walk.stop:
                self.stops[(s.pid, walk.addrs)] = walk.stop
        # data.lost shows as lost_samples (samples minus the stored ones), not as lost events.
        self.cost.file_bytes, self.cost.samples = data.file_bytes, len(data.samples)
        self.cost.post_cpu_s = time.process_time() - t0
        maps: dict[str, dict[Key, AggValue]] = {
            "kstacks" if self.kernel else "stacks": dict(counts),
            "samples": {(): len(data.samples) + data.lost},
        }
        return Snapshot(label=time.strftime("%H:%M:%S"), final=True, maps=maps)
