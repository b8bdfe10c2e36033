"""Running a d/ script: ``dtrace -q -L d/lib/<platform> -s d/<tool>.d ARG1 ARG2 ...``.

The positional parameters are exactly those the bpftrace engine gives
bpf/<tool>.bt (integers, and paths pgprobe resolved itself), read by the
script as macro arguments ($1, $2, ...; a path as $$1). Nothing is spliced
into a script, except on Linux the pids of the USDT probe descriptions
(perpid.py). -L adds the per-platform D library (d/lib/linux or d/lib/fds:
how a file descriptor's path is read). No -p: the postgresql provider is per
process.

The capture ends at the end of the duration or on Ctrl-C / SIGTERM: dtrace
gets SIGINT once (a second one makes it quit without END's output), runs
END, which prints the aggregations and then "@@end", and exits. DTrace for
Linux 2.0.7 then spends 20-100 s of CPU freeing its kernel type data (libctf,
measured here) after it has removed its probes; pgprobe kills it once "@@end"
is printed and its probe events are gone from tracefs, instead of waiting.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from pgprobe import proc
from pgprobe.engines.base import Event, MapSpec, RunInfo, TickCallback
from pgprobe.engines.bpftrace import validate_args
from pgprobe.engines.dtrace import perpid
from pgprobe.engines.dtrace.output import DtraceOutput
from pgprobe.engines.dtrace.platform import find_dtrace
from pgprobe.engines.dtrace.stderr import classify_stderr, explain_failure
from pgprobe.engines.runner import TracerProcess
from pgprobe.errors import EXIT_TRACER, PgprobeError
from pgprobe.scripts import script_path

Arg = int | Path

# After SIGINT, how long dtrace may take to run END and print before it is
# killed (and its maps lost). Naming thousands of user stacks takes a while:
# measured here, 10 s of profile.d at 997 Hz printed in about 10 s on a loaded
# 2-CPU machine; the margin is for larger captures.
STOP_KILL_S = 180.0
# DTrace for Linux: after "@@end", how long to wait for its probe events to be
# removed (0.1-0.4 s measured) before killing it.
TEARDOWN_WAIT_S = 15.0
# DTrace for Linux: starts again after "failed to grab process N" (perpid.py).
GRAB_RETRIES = 3
_UPROBE_EVENTS = ("/sys/kernel/tracing/uprobe_events", "/sys/kernel/debug/tracing/uprobe_events")


class DtraceCapture:
    """One run of a D script; iterate `events()` for snapshots and lines."""

    def __init__(
        self,
        script: str,
        args: Sequence[Arg],
        specs: Sequence[MapSpec],
        duration: float | None,
        env: dict[str, str] | None = None,
        on_tick: TickCallback | None = None,
        cluster_pid: int | None = None,
    ) -> None:
        self.dtrace = find_dtrace()
        self.script = script_path("d", script)
        self.specs = {s.name: s for s in specs}
        self.on_tick = on_tick
        self.info = RunInfo(engine="dtrace", engine_version=self.dtrace.version)
        options = ["-q", "-L", str(self.dtrace.library_dir)]
        self.traced_pids: set[int] | None = None
        self.ungrabbed: set[int] = set()  # pids dtrace could not grab: started again without
        self.generated: Path | None = None
        self.cluster_pid = cluster_pid
        self._options = options
        self._args = validate_args(args)
        run_script = self.script
        if self.dtrace.linux and perpid.uses_usdt(self.script.read_text()):
            options.append("-Z")  # a process may exit before its probes are enabled
            run_script = self._per_pid_script()
        self._killed_after_end = False
        self.process = TracerProcess(
            "dtrace",
            self._argv(run_script),
            {**os.environ, **(env or {})},
            duration,
            self.info,
            resend_sigint=False,
            kill_after_s=STOP_KILL_S,
        )

    def _argv(self, run_script: Path) -> list[str]:
        return [self.dtrace.path, *self._options, "-s", str(run_script), *self._args]

    def _per_pid_script(self) -> Path:
        """The script for the server processes running now (less those dtrace could not grab)."""
        if self.generated is not None:
            self.generated.unlink(missing_ok=True)
        self.traced_pids = perpid.provider_pids(self.cluster_pid) - self.ungrabbed
        self.generated = perpid.write_script(self.script, self.traced_pids)
        return self.generated

    def request_stop(self) -> None:
        self.process.request_stop()

    def events(self) -> Iterator[Event]:
        self.process.on_tick = self.on_tick
        parser = DtraceOutput(self.specs, self.info)

        def feed(raw: bytes) -> Iterable[Event]:
            events = list(parser.feed(raw.decode(errors="replace")))
            if parser.complete and self.dtrace.linux and not self._killed_after_end:
                self._killed_after_end = True
                threading.Thread(target=self._end_teardown, daemon=True).start()
            return events

        try:
            yield from self.process.run(feed)
            while self._start_again_without_ungrabbed():
                yield from self.process.run(feed)
        finally:
            if self.generated is not None:
                self.generated.unlink(missing_ok=True)
        self._check_exit(self.process.returncode or 0)
        if self.traced_pids is not None:
            note = perpid.untraced_note(self.traced_pids | self.ungrabbed, self.cluster_pid)
            if note:
                self.info.warnings.append(note)
        yield from parser.finish()

    def _start_again_without_ungrabbed(self) -> bool:
        """After "failed to grab process N": ready dtrace again without N, and say so.

        N exited between the listing and the grab (the usual case: an autovacuum
        worker, a client that disconnected) or cannot be grabbed (another debugger
        holds it). Bounded: a server whose processes come and go faster than dtrace
        compiles fails in one line that says so and points to bpftrace.
        """
        if self.generated is None or self.info.probes_attached or self.process.asked_to_stop:
            return False
        pid = perpid.ungrabbed_pid(self.process.stderr)
        if pid is None or pid in self.ungrabbed:
            return False
        if len(self.ungrabbed) >= GRAB_RETRIES:
            raise PgprobeError(
                f"dtrace failed: {GRAB_RETRIES + 1} starts in a row could not grab a server "
                f"process (the last: pid {pid}): they exit faster than dtrace compiles; use "
                "--engine bpftrace, which also sees processes that start during the capture",
                EXIT_TRACER,
            )
        self.ungrabbed.add(pid)
        info = proc.read_info(pid)
        if info is None or not proc.is_postgres(info):
            what = f"pid {pid} exited while dtrace compiled: started again without it"
        else:
            title = info.cmdline.removeprefix("postgres: ")
            what = f"dtrace could not grab pid {pid} ({title}; another debugger?): not traced"
        self.info.warnings.append(f"DTrace for Linux: {what}")
        self.process.rearm(self._argv(self._per_pid_script()))
        return True

    def _end_teardown(self) -> None:
        """DTrace for Linux printed everything: kill it once its probes are removed."""
        pid = self.process.pid
        if pid is None:
            return
        deadline = time.monotonic() + TEARDOWN_WAIT_S
        while time.monotonic() < deadline and _has_probe_events(pid):
            time.sleep(0.1)
        self.process.kill(output_complete=True)

    def _check_exit(self, returncode: int) -> None:
        report = classify_stderr(self.process.stderr)
        self.info.lost_events += report.lost_events
        self.info.failed_map_updates += report.failed_map_updates
        if report.matched:
            self.info.probes_attached = report.matched
        if not self.info.probes_attached:
            raise explain_failure(report)
        self.info.warnings.extend(report.warnings())
        expected = {0, -signal.SIGINT} | ({-signal.SIGKILL} if self._killed_after_end else set())
        if returncode not in expected:
            self.info.warnings.append(f"dtrace exited with status {returncode}")


def _has_probe_events(pid: int) -> bool:
    """Whether dtrace `pid` still has uprobe events in tracefs (dt_<pid>_..., BEGIN/END)."""
    marker = f"dt_{pid}_"
    for path in _UPROBE_EVENTS:
        try:
            with open(path) as events:
                return any(marker in line for line in events)
        except OSError:
            continue
    return False
