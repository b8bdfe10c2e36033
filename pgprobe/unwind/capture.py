"""A CPU-sampling capture through perf's DWARF mode, unwound by pgprobe.

``PerfCapture`` runs ``perf record -e cpu-clock -c 1e9/HZ --call-graph
dwarf,STACK -a`` into a temporary perf.data, stops it with SIGINT at the
end of the duration or on Ctrl-C, reads the samples of the targets and of
the processes they forked during the capture (pgprobe.unwind.perfdata, by
perf's FORK records: backends of the postmaster), unwinds each copied stack
(pgprobe.unwind.dwarf) and yields one final Snapshot shaped like
bpf/profile.bt's maps: ``stacks`` {(pid, user addresses)} or ``kstacks``
{(pid, kernel addresses, user addresses)}, and ``samples``. So the rest of
the profile pipeline does not know which way the stacks were walked;
``stops`` says why a stack stopped early, per (pid, user addresses).

Scope: per CPU (``-a``, system_wide) for CPU sampling, per task (``-p PIDS``)
for other events (a uprobe: system-wide, it would fire in every process of
the binary, other clusters included). A per-task event is switched out and
in with its task at every context switch: measured with a pipe ping-pong,
+1.4 us per switch, the 16-19 % TPS loss of `--unwind dwarf` under pgbench
(docs/flame.md). A per-CPU event costs nothing at a switch; the file holds
every process's samples, which the reader drops before unwinding.

cpu-clock counts time on a CPU: per CPU, one sample each 1/HZ s finds the
task that runs, so a backend gets CPU time x HZ samples; per task, the
period counts that task's CPU time alone (it under-counts tasks that switch
often: 75 per CPU-second at 99 Hz for the ping-pong).
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

from pgprobe import timings
from pgprobe.engines.base import AggValue, Event, Key, RunInfo, Snapshot, TickCallback
from pgprobe.errors import EXIT_TRACER, EXIT_USAGE, PgprobeError
from pgprobe.symbolize import Symbolizer
from pgprobe.unwind import perfdata
from pgprobe.unwind.dwarf import Unwinder

DEFAULT_STACK_BYTES = 16_384  # deep enough for PostgreSQL's stacks (measured: docs/flame.md)
ATTACH_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0
START_ATTEMPTS = 3
BUFFER_SECONDS = 2.0  # of samples perf's ring buffer per CPU holds while perf is not scheduled
MIN_BUFFER, MAX_BUFFER = 1 << 20, 16 << 20
DEFAULT_CAP, MIN_CAP = 1 << 30, 1 << 20  # perf data kept at most (data_cap)
CAP_ENV = "PGPROBE_DWARF_CAP_MIB"
CAP_REACHED = "size limit reached"  # perf record's line when --max-size stops it


@dataclass
class UnwindCost:
    """What the DWARF mode cost, for meta and the docs."""

    file_bytes: int = 0
    samples: int = 0
    post_cpu_s: float = 0.0  # reading perf.data and unwinding, CPU seconds of pgprobe
    perf_stop_s: float = 0.0  # wall seconds from SIGINT until perf record exited
    perf_cpu_s: float = 0.0  # CPU seconds perf record used, start to exit
    samples_in_file: int = 0  # of every process (system-wide: the whole machine's)
    lost: int = 0  # samples perf lost (buffer full), of every process it recorded

    @property
    def bytes_per_sample(self) -> int:
        """perf.data bytes per sample recorded (of any process)."""
        n = self.samples_in_file or self.samples
        return self.file_bytes // n if n else 0


def data_cap(directory: str) -> tuple[int, str]:
    """(bytes, why): how much perf data a capture keeps at most, and why that much.

    perf copies 16 KiB of stack per sample of every process on the machine (-a), into a
    temporary directory (/tmp: RAM on the many distributions where it is a tmpfs): -d 600
    on 32 busy CPUs is ~30 GB. 1 GiB is ~64,000 samples (30 s of 20 busy CPUs at 99 Hz;
    ~10 s of pgprobe's CPU to unwind at 0.15 ms each); a quarter of the free space where
    the file goes, if less, so a capture never fills the disk (or a tmpfs, whose free
    space is memory). $PGPROBE_DWARF_CAP_MIB sets another (tests; a host that wants more).
    """
    wanted = os.environ.get(CAP_ENV)
    if wanted:
        try:
            mib = float(wanted)
        except ValueError:
            mib = 0.0
        if not 0 < mib < 1 << 30:
            raise PgprobeError(f"{CAP_ENV}={wanted}: not a size in MiB", EXIT_USAGE)
        return max(1024, int(mib * (1 << 20))), CAP_ENV
    try:
        st = os.statvfs(directory)
    except OSError:
        return DEFAULT_CAP, "the default"
    quarter = st.f_bavail * st.f_frsize // 4
    if quarter >= DEFAULT_CAP:
        return DEFAULT_CAP, "the default"
    return max(MIN_CAP, quarter), f"a quarter of the free space in {directory}"


def perf_version(perf: str) -> str:
    try:
        out = subprocess.run([perf, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip().removeprefix("perf version ")


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _online_cpus() -> int:
    """CPUs perf opens a system-wide event on (/sys/devices/system/cpu/online: "0-3,6")."""
    try:
        with open("/sys/devices/system/cpu/online") as f:
            spans = f.read().strip().split(",")
        total = 0
        for span in spans:
            first, _, last = span.partition("-")
            total += int(last or first) - int(first) + 1
        return total
    except (OSError, ValueError):
        return os.cpu_count() or 1


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
        timed: bool = False,
        system_wide: bool | None = None,
    ) -> None:
        """event: perf's event options instead of cpu-clock at hz (``-e GROUP:NAME -c 1``
        for every hit of a uprobe, pgprobe.unwind.uprobe). timed: one entry per sample,
        map ``timed_stacks`` {(pid, time, user addresses): 1}, for a caller that joins
        each sample to another tracer's record of the same event (waits --stacks).
        system_wide: per-CPU events (``-a``) and only pids and their descendants kept
        when reading; default: True for cpu-clock, False (``-p``) for another event."""
        self.perf = perf
        self.pids = list(pids)
        self.hz = hz
        self.duration = duration
        self.kernel = kernel
        self.symbolizer = symbolizer
        self.stack_bytes = stack_bytes
        self.timed = timed
        # A fixed period of task CPU time (cpu-clock counts nanoseconds), not -F: perf's
        # frequency mode re-tunes the period as a task runs and idles, and overshot by
        # 10-15 % for a backend that competes for the CPU; a period gives CPU time x Hz.
        self.event = list(event) or ["-e", "cpu-clock", "-c", str(1_000_000_000 // hz)]
        self.system_wide = not event if system_wide is None else system_wide
        self.info = RunInfo(engine="perf", engine_version=perf_version(perf))
        self.on_tick: TickCallback | None = None
        self.stops: dict[tuple[int, tuple[int, ...]], str] = {}
        self.cost = UnwindCost()
        self._stop = False
        self._children_cpu_at_start = 0.0
        self.cap, self.cap_why = DEFAULT_CAP, "the default"  # set where the file goes

    def request_stop(self) -> None:
        self._stop = True

    def argv(self, output: str) -> list[str]:
        # --synth=no: perf's /proc walk of every process at start (maps, names) is not
        # read: pgprobe names from its own /proc snapshots. FORK records still come.
        # --no-data: --call-graph dwarf otherwise records every data mmap (mmap_data), of
        # the whole machine with -a: one burst of them (a malloc-heavy process) filled
        # a 41 MB file in 3 s and perf's buffer, and lost the samples. --no-bpf-event:
        # perf's side-band thread for BPF loads polls with a 1 s timeout, and perf waited
        # for it at SIGINT: 0.05-1.0 s to stop, 0.02-0.05 s without it.
        scope = ["-a", "--synth=no"] if self.system_wide else ["-p", ",".join(map(str, self.pids))]
        return [
            self.perf, "record", "-q", "-N", "-B", *self.event,
            "--call-graph", f"dwarf,{self.stack_bytes}", "--no-data", "--no-bpf-event",
            "-o", output, *scope, *self._buffer(), f"--max-size={max(1, self.cap // 1024)}K",
        ]  # fmt: skip

    def _buffer(self) -> list[str]:
        """perf's ring buffer per CPU, for cpu-clock: 2 s of samples (99 Hz: 4 MiB).

        perf's default (512 KiB: 30 stack copies) lost 278 of ~2,000 samples of a
        system-wide 10 s capture at load 16 on 2 CPUs, when perf itself waited for a CPU.
        Other events keep perf's default (clog-reads sizes its own with -m in event)."""
        if not self.system_wide or "-m" in self.event:
            return []
        wanted = BUFFER_SECONDS * self.hz * (self.stack_bytes + 1024)
        size = MIN_BUFFER
        while size < wanted and size < MAX_BUFFER:
            size *= 2
        return ["-m", f"{size // 1024}K"]

    def _events_open(self, perf_pid: int) -> bool:
        """perf has opened its events: one per CPU (system-wide) or per target."""
        wanted = _online_cpus() if self.system_wide else len(self.pids)
        return _perf_fds(perf_pid) >= wanted

    def events(self) -> Iterator[Event]:
        workdir = tempfile.mkdtemp(prefix="pgprobe-perf-")  # 0700, a name no one can guess
        try:
            output = os.path.join(workdir, "perf.data")
            self.cap, self.cap_why = data_cap(workdir)
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
        timings.mark("perf-spawned")
        attached: float | None = None
        try:
            while child.poll() is None:
                now = time.monotonic()
                if attached is None and self._events_open(child.pid):
                    attached = now
                    self.info.attach_seconds = now - started
                    timings.mark("perf-attached")
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
                try:  # wake at the end of the duration, not up to a tick after it
                    time.sleep(min(0.1, remaining) if remaining else 0.1)
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
            timings.mark("perf-signalled")
            try:
                _, err = child.communicate(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                child.kill()
                _, err = child.communicate()
            timings.mark("perf-exited")
            self.cost.perf_stop_s = time.monotonic() - stopping
            self.cost.perf_cpu_s = _children_cpu_s() - self._children_cpu_at_start
        problems = [ln.strip() for ln in (err or "").splitlines() if ln.strip()]
        if attached is None and not last and not self._stop:
            return False
        if not os.path.exists(output) or os.path.getsize(output) == 0:
            detail = problems[-1] if problems else f"exit status {child.returncode}"
            raise PgprobeError(f"perf record wrote no samples: {detail}", EXIT_TRACER)
        self.info.warnings.extend(f"perf: {ln}" for ln in problems if "Warning" in ln)
        if any(CAP_REACHED in ln for ln in problems):
            # perf stops at its first write past the cap: what its buffers held is kept too.
            self.info.warnings.append(
                f"stopped collecting DWARF stacks after {self.info.duration_seconds:.1f} s: "
                f"the cap of {self.cap / (1 << 20):g} MiB of perf data ({self.cap_why}) was "
                "reached; what was kept is shown"
            )
        return True

    def _snapshot(self, output: str) -> Snapshot:
        t0 = time.process_time()
        unwinder = Unwinder(self.symbolizer)
        counts: dict[Key, int] = {}

        def count(s: perfdata.Sample) -> None:  # one at a time: the file is never all in memory
            walk = unwinder.unwind(s.pid, s.regs, s.stack)
            key: Key = (s.pid, tuple(s.kernel), walk.addrs) if self.kernel else (s.pid, walk.addrs)
            if self.timed:
                key = (s.pid, s.time, walk.addrs)
            counts[key] = counts.get(key, 0) + 1
            if walk.stop:
                self.stops[(s.pid, walk.addrs)] = walk.stop

        try:
            data = perfdata.read(output, self.pids if self.system_wide else None, count)
        except (OSError, perfdata.PerfDataError) as exc:
            raise PgprobeError(f"cannot read perf's output: {exc}", EXIT_TRACER) from None
        # data.lost shows as lost_samples (samples minus the stored ones), not as lost events.
        self.cost.file_bytes, self.cost.samples = data.file_bytes, data.kept
        self.cost.samples_in_file, self.cost.lost = data.samples_in_file, data.lost
        self.cost.post_cpu_s = time.process_time() - t0
        timings.mark("perf-unwound")
        maps: dict[str, dict[Key, AggValue]] = {
            "timed_stacks" if self.timed else "kstacks" if self.kernel else "stacks": dict(counts),
            "samples": {(): data.kept + data.lost},
        }
        return Snapshot(label=time.strftime("%H:%M:%S"), final=True, maps=maps)
