"""Running a tracer process: what bpftrace and dtrace captures share.

Long because the tracer's life is one state machine (~490 lines): start, attach,
window, the answer probe's ending with its SIGINT fallback and its end in the
background (which a long-running agent waits for before it exits), and stop;
splitting it would spread one sequence of signals over files (the nice values it
sets while the tracer starts and answers are pgprobe.priority's; cutting its stdout into
lines, in linear time whatever their length, is pgprobe.engines.lines').

Start the tracer in its own session (so a terminal's Ctrl-C reaches pgprobe
only), read its stdout line by line without blocking, start the duration when
the parser says the probes are attached, and stop it with SIGINT — at the end
of the duration, on Ctrl-C / SIGTERM, or on request from another thread — so
that it prints its aggregations, which are still parsed and reported.

A script that can answer while its probes are still attached (an ``Answer``:
bpftrace scripts with an answer probe) is stopped by the answer's signal
instead: the script stops counting at that sigqueue system call, prints its maps
and a marker line, and the tracer is then sent SIGINT and left to end in the
background: pgprobe does not wait for it to detach its probes (bpftrace 0.17
detaches them one by one before END, a uprobe in 80-150 ms here, and then
waits 100 ms more for output that never comes).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from pgprobe import priority, timings
from pgprobe.engines import sigqueue
from pgprobe.engines.base import Event, RunInfo, TickCallback
from pgprobe.engines.lines import LineSplitter
from pgprobe.errors import EXIT_OUTPUT, EXIT_TRACER, PgprobeError

STARTUP_TIMEOUT_S = 60.0
STOP_RESEND_S = 1.0  # seconds between repeated SIGINTs
STOP_KILL_S = 20.0  # then the tracer is killed and its maps are lost
TICK_S = 0.2  # the longest wait for the tracer's output between ticks
ANSWER_TIMEOUT_S = 3.0  # no answer marker by then: SIGINT, the ordinary end


@dataclass(frozen=True)
class Answer:
    """How a tracer answers while its probes are attached (see the module's docstring).

    signal: what pgprobe sends at the end of the window (one the tracer ignores:
    the script's probe on the sigqueue system call is what acts on it); complete: the
    stdout line that shows the whole answer has been printed.
    """

    signal: int
    complete: Callable[[bytes], bool]


def _since(t: float) -> float:
    return time.monotonic() - t


class TracerProcess:
    """One tracer run; `lines()` yields what the feed function makes of its stdout."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: dict[str, str],
        duration: float | None,
        info: RunInfo,
        benign_stderr: tuple[str, ...] = (),
        resend_sigint: bool = True,
        kill_after_s: float = STOP_KILL_S,
        ends_output: Callable[[bytes], bool] | None = None,
        answer: Answer | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.duration = duration
        self.info = info
        self.benign_stderr = benign_stderr
        self.resend_sigint = resend_sigint
        self.kill_after_s = kill_after_s
        # A stdout line that shows the tracer is printing its final output after SIGINT.
        self.ends_output = ends_output or (lambda raw: bool(raw.strip()))
        self._ending = False
        self.answer = answer
        self._answered = False  # the answer is complete: the tracer ends in the background
        self.on_tick: TickCallback | None = None
        # A script that stops counting when pgprobe signals it (clog_reads.bt watches
        # pgprobe's sigqueue): the window ends at the first SIGINT, not at END's first line
        # (bpftrace 0.17 stops the syscall tracepoints a second or more before END under
        # load). before_signal runs just before that SIGINT (the tool's closing SQL read).
        self.stops_on_signal = False
        self.before_signal: Callable[[], None] | None = None
        self.stderr: list[str] = []
        self.returncode: int | None = None
        self.pid: int | None = None  # the tracer's, while it runs
        self._child: subprocess.Popen[bytes] | None = None
        self._stop_requested = threading.Event()
        self._resends = 0
        self._started = 0.0
        self._attached_at: float | None = None
        self._signalled_at: float | None = None
        self._killed_complete = False

    def request_stop(self) -> None:
        """End the capture early (thread-safe): the maps are still printed and parsed."""
        self._stop_requested.set()

    def kill(self, *, output_complete: bool = False) -> None:
        """SIGKILL the tracer if it still runs (thread-safe; never another process).

        output_complete: the engine saw the tracer print everything (DTrace for
        Linux's @@end): the SIGKILL is the normal end, not a death to report.
        """
        self._killed_complete = output_complete
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()

    def rearm(self, argv: Sequence[str]) -> None:
        """Ready a second run with a new command line after one that failed to start.

        The failed run's stderr and exit status are forgotten: the engine reads them
        for the run that counts. Only for a tracer that never attached nor was signalled.
        """
        assert not self.info.probes_attached and not self.asked_to_stop
        self.argv = list(argv)
        self.stderr = []
        self.returncode = None
        self.pid, self._child = None, None

    @property
    def asked_to_stop(self) -> bool:
        """Ctrl-C, SIGTERM, request_stop() or the end of the duration reached the tracer."""
        return self._signalled_at is not None or self._stop_requested.is_set()

    def run(self, feed: Callable[[bytes], Iterable[Event]]) -> Iterator[Event]:
        started = self._started = time.monotonic()
        child = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,  # our signal handler decides when the tracer stops
            preexec_fn=_stop_with_parent,
        )
        assert child.stdout is not None and child.stderr is not None
        timings.mark(f"{self.name}-spawned")
        self.pid, self._child = child.pid, child
        # Raised while it starts (compiles, attaches) and answers, 0 while it counts: on a
        # saturated 2-CPU server its start waited 2.0-2.3 s for 0.25 s of CPU; at -10, 0.1 s
        # (docs/benchmarks.md). Its session, hence its autogroup, is its own. Its threads
        # got the nice at the fork; this sets its autogroup's.
        priority.set_priority(child.pid, priority.NICE)
        reader = threading.Thread(target=self._drain_stderr, args=(child.stderr,), daemon=True)
        reader.start()
        feed = _recording(feed, self.name, child.pid)
        with StopSignals() as signals:
            try:
                yield from self._pump(child, feed, signals, started)
            finally:
                if self._answered and child.poll() is None:
                    # The answer is complete: the tracer detaches its probes (a uprobe in
                    # 80-150 ms) after pgprobe has moved on. What it wrote on stderr before
                    # the answer has been read by then.
                    _finish_in_background(child)
                    reader.join(timeout=0.01)
                else:
                    if child.poll() is None:
                        child.kill()
                    child.wait()
                    reader.join(timeout=2)
        # Answered: stopped after printing everything, as asked (its exit is not awaited).
        code = 0 if self._answered else child.returncode
        self.returncode = code
        timings.mark(f"{self.name}-answered" if self._answered else f"{self.name}-exited")
        self._say_how_it_ended(code, time.monotonic())

    def _say_how_it_ended(self, returncode: int, now: float) -> None:
        """A tracer that ended by itself, or not by our SIGINT, is a fact to report."""
        asked = self._signalled_at is not None
        if asked and returncode in (0, -signal.SIGINT):
            return
        if self._killed_complete and returncode == -signal.SIGKILL:
            return
        if not self.info.probes_attached or self.info.ended_early:
            return  # a failure to start: the engine explains it from stderr
        how = describe_exit(returncode)
        since = self._attached_at if self._attached_at is not None else self._started
        when = f"{now - since:.1f} s after its probes attached"
        if asked:
            self.info.ended_early = (
                f"{self.name} {how} while printing its results, {when}, "
                f"{now - self._signalled_at:.1f} s after it was asked to stop"  # type: ignore[operator]
            )
        else:
            self.info.ended_early = f"{self.name} {how} {when}, before the end of the capture"
        if self.stderr:
            self.info.ended_early += f" (its last words: {self.stderr[-1][:160]})"

    def _pump(
        self,
        child: subprocess.Popen[bytes],
        feed: Callable[[bytes], Iterable[Event]],
        signals: StopSignals,
        started: float,
    ) -> Iterator[Event]:
        assert child.stdout is not None
        fd = child.stdout.fileno()
        selector = selectors.DefaultSelector()
        selector.register(fd, selectors.EVENT_READ)
        pending = LineSplitter()  # linear whatever a line's length (a map is one line)
        attached_at: float | None = None
        signalled_at: float | None = None
        wait = TICK_S
        while True:
            if selector.select(timeout=wait):
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                for raw in pending.push(chunk):
                    if signalled_at is not None and self._waits_for_answer(raw):
                        yield from feed(raw)
                        self._answered = True
                        return
                    if signalled_at is not None and not self._ending:
                        self._ending = self.ends_output(raw)
                        closed = self.stops_on_signal or self.answer is not None
                        if self._ending and attached_at is not None and not closed:
                            # END's first output: the probes have stopped counting.
                            self.info.stopped_counting = True
                            self.info.duration_seconds = time.monotonic() - attached_at
                    yield from feed(raw)
            now = time.monotonic()
            if attached_at is None and self.info.probes_attached:
                attached_at = self._attached_at = now
                self.info.attach_seconds = now - started
                timings.mark(f"{self.name}-attached")
                priority.set_priority(child.pid, 0)  # the capture itself runs as anything else
            if attached_at is not None and signalled_at is None:
                self.info.duration_seconds = now - attached_at
            remaining = None
            if attached_at is not None and self.duration is not None:
                remaining = max(0.0, self.duration - (now - attached_at))
            stopping = signals.requested or self._stop_requested.is_set()
            if signalled_at is None and (stopping or remaining == 0.0):
                self.info.interrupted = stopping
                self.info.missed_runs = bpf_recursion_misses(child.pid)
                if self.before_signal is not None:
                    self.before_signal()
                if attached_at is None:
                    self.answer = None  # never attached: the ordinary end
                answering = self.answer is not None
                # sigqueue, as the scripts' answer and window-edge probes watch (sigqueue.py)
                with contextlib.suppress(ProcessLookupError):  # ended: its end is read below
                    sigqueue.send(child.pid, self.answer.signal if self.answer else signal.SIGINT)
                # Its answer (or END) comes sooner. After the signal: raised, the tracer
                # may take this CPU at once, and the signal that closes the window (right
                # after before_signal's SQL read) would wait its turn (+9-16 % of reads in
                # test_one_window under a saturating load).
                priority.set_priority(child.pid, priority.NICE)
                timings.mark(f"{self.name}-signalled")
                signalled_at = self._signalled_at = now
                # The answer's probe stops the counting at that kill system call.
                if (self.stops_on_signal or answering) and attached_at is not None:
                    self.info.stopped_counting = True
                    self.info.duration_seconds = time.monotonic() - attached_at
            elif signalled_at is not None:
                self._insist(child, now - signalled_at)
            if attached_at is None and signalled_at is None and now - started > STARTUP_TIMEOUT_S:
                child.kill()
                raise PgprobeError(
                    f"{self.name} did not attach its probes within {STARTUP_TIMEOUT_S:.0f} s",
                    EXIT_TRACER,
                )
            if self.on_tick is not None:
                self.on_tick(self.info, remaining)
            # Wake at the end of the duration, not up to a tick after it.
            wait = TICK_S if not remaining else min(TICK_S, max(0.001, remaining - _since(now)))
        last = pending.rest()
        if last.strip():
            yield from feed(last)

    def _waits_for_answer(self, raw: bytes) -> bool:
        """True when raw is the answer's last line (the tracer then ends in the background)."""
        return self.answer is not None and self.answer.complete(raw)

    def _insist(self, child: subprocess.Popen[bytes], waited: float) -> None:
        """Repeat SIGINT until the tracer exits (if asked), and kill it if it never does.

        bpftrace 0.17 only notices SIGINT when the signal interrupts its epoll_wait;
        one sent while it is busy elsewhere can be missed, so it is sent again — but
        only until it starts printing its maps: a SIGINT then cuts the output short.
        DTrace must get one only: a second SIGINT makes it quit without its END output.
        """
        if child.poll() is not None:
            return
        if self.answer is not None:
            if waited > ANSWER_TIMEOUT_S:
                # No answer (its probe did not run): the ordinary end. The script stopped
                # counting at the answer's signal all the same, so END prints the same maps.
                self.answer = None
                self._resends = int(waited / STOP_RESEND_S)
                child.send_signal(signal.SIGINT)
            return
        if waited > self.kill_after_s:
            child.kill()
            child.wait()
            self.info.ended_early = (
                f"{self.name} did not stop within {self.kill_after_s:.0f} s of SIGINT and was "
                "killed: its maps are lost"
            )
        elif (
            self.resend_sigint and not self._ending and waited > STOP_RESEND_S * (self._resends + 1)
        ):
            self._resends += 1
            child.send_signal(signal.SIGINT)

    def _drain_stderr(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace").rstrip()
            if line and not any(b in line for b in self.benign_stderr):
                self.stderr.append(line)


def _finish_in_background(child: subprocess.Popen[bytes]) -> None:
    """SIGINT a tracer whose answer is complete and let it end while pgprobe goes on.

    Not SIGKILL: a tracer killed mid-way leaves behind the probes it created through
    tracefs (bcc falls back to uprobe_events when the perf uprobe PMU refuses a site, e.g.
    a site taken by another uprobe), which would stay registered. Its later output is
    read and dropped (a full pipe would stall its exit); SIGINT is repeated as the
    runner does; it is killed after STOP_KILL_S. If pgprobe exits first, the tracer gets
    SIGTERM (PR_SET_PDEATHSIG), which bpftrace handles as SIGINT.
    """
    child.send_signal(signal.SIGINT)

    def finish() -> None:
        assert child.stdout is not None
        fd = child.stdout.fileno()
        started = time.monotonic()
        resends = 0
        # poll, not select: a descriptor past 1,023 (top keeps one open per backend) is
        # out of select()'s range
        readable = select.poll()
        readable.register(fd, select.POLLIN)
        while child.poll() is None:
            waited = time.monotonic() - started
            if waited > STOP_KILL_S:
                child.kill()
                break
            if readable.poll(TICK_S * 1000):
                if not os.read(fd, 1 << 16):
                    break  # EOF: it is exiting
            elif waited > STOP_RESEND_S * (resends + 1):
                resends += 1
                child.send_signal(signal.SIGINT)
        child.wait()
        _finishing.discard(threading.current_thread())

    thread = threading.Thread(target=finish, daemon=True, name="tracer-finish")
    _finishing.add(thread)
    thread.start()


# Tracers ending in the background (their answers given). A one-shot command leaves
# them to PR_SET_PDEATHSIG; a long-running agent waits for them before it exits.
_finishing: set[threading.Thread] = set()


def wait_for_finishing_tracers() -> None:
    """Return when every tracer left to end in the background has exited (or been killed)."""
    for thread in list(_finishing):
        thread.join(timeout=STOP_KILL_S + 5)


def bpf_recursion_misses(pid: int) -> int:
    """Runs of pid's BPF programs the kernel skipped (Linux 5.12+ fdinfo; 0 elsewhere).

    A tracepoint program does not run while another BPF program is running on the
    same CPU (e.g. an interrupt's sched_wakeup inside another tool's syscall probe):
    the event is lost without any other trace.
    """
    total = 0
    try:
        fds = list(Path(f"/proc/{pid}/fdinfo").iterdir())
    except OSError:
        return 0
    for fd in fds:
        try:
            text = fd.read_text()
        except OSError:
            continue
        if "prog_type:" in text:
            for line in text.splitlines():
                if line.startswith("recursion_misses:"):
                    total += int(line.split()[1])
    return total


# prctl is looked up here, in the parent: the child, between fork and exec, must not
# import or take locks (another thread of ours may have held them at the fork).
_PRCTL = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1


def _stop_with_parent() -> None:
    """In the tracer's child process: SIGTERM it if pgprobe dies (even by SIGKILL).

    The tracer runs in its own session, so nothing else would stop it, and its
    probes would stay attached to the server. Linux only (prctl PR_SET_PDEATHSIG).
    """
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if priority.NICE:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, priority.NICE)


def _recording(
    feed: Callable[[bytes], Iterable[Event]], name: str, pid: int
) -> Callable[[bytes], Iterable[Event]]:
    """With $PGPROBE_RECORD_DIR set, also keep the tracer's raw output (for bug reports)."""
    directory = os.environ.get("PGPROBE_RECORD_DIR")
    if not directory:
        return feed
    path = os.path.join(directory, f"{name}-{pid}.out")

    def recorded(raw: bytes) -> Iterable[Event]:
        try:  # said as this file's, not taken for stdout's (cli.main)
            out.write(raw + b"\n")
            out.flush()
        except OSError as exc:
            raise PgprobeError(f"cannot write {path}: {exc.strerror}", EXIT_OUTPUT) from None
        return feed(raw)

    try:
        out = open(path, "ab")  # noqa: SIM115
    except OSError as exc:
        raise PgprobeError(f"cannot write {path}: {exc.strerror}", EXIT_OUTPUT) from None

    return recorded


def describe_exit(returncode: int) -> str:
    """'was killed by signal 9 (SIGKILL)' or 'exited with status 1'."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-returncode} ({name})"
    return f"exited with status {returncode}"


class StopSignals:
    """Turns Ctrl-C and SIGTERM into a flag while a capture runs.

    Only the main thread may install signal handlers; a capture run in another
    thread (triage runs several at once) is stopped through request_stop().
    """

    requested = False

    def __enter__(self) -> StopSignals:
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            self._old = {
                sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)
            }
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
