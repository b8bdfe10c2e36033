"""CPU priority for pgprobe's short bursts of work on a saturated server.

On a server whose CPUs are busy, pgprobe and its tracer wait in the run queue for the
little CPU they need: a tracer's start (0.25 s of CPU) waited 2.0-2.3 s, pgprobe's own
imports and discovery (about 0.3 s of CPU) 1-3 s (docs/benchmarks.md, time to answer).
The kernel shares the CPU between autogroups first (one per session, where
sched_autogroup_enabled is on), then between the threads of a group: so a nice only
helps when it is set on the autogroup too. PGPROBE_TRACER_NICE (-20..19, default -10;
0 leaves every priority alone) is the nice used for both: the tracer while it starts
and answers (engines/runner.py), pgprobe itself while a one-shot command runs
(launch.py). Failures are not said: the capture is the same, only slower.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

DEFAULT_NICE = -10


def configured_nice(text: str | None) -> int:
    """$PGPROBE_TRACER_NICE: -20..19; unset or not a number: the default."""
    try:
        return max(-20, min(19, int(text))) if text else DEFAULT_NICE
    except ValueError:
        return DEFAULT_NICE


NICE = configured_nice(os.environ.get("PGPROBE_TRACER_NICE"))


def set_priority(pid: int, nice: int) -> None:
    """nice for every thread of pid and for its autogroup (its own session's).

    Without /proc/PID/task (not Linux), setpriority of the pid, which there is the
    whole process.
    """
    if not NICE:
        return
    with contextlib.suppress(OSError), open(f"/proc/{pid}/autogroup", "w") as f:
        f.write(str(nice))
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, nice)


def autogroup_nice(pid: int | str = "self") -> int | None:
    """The nice of pid's autogroup ("/autogroup-12 nice 0"); None without autogroups."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def raise_own(nice: int = NICE) -> Callable[[], None]:
    """Raise this process (one thread yet) and its session's autogroup to nice.

    Returns what puts the autogroup back. The autogroup is the user's session (the
    shell and whatever else runs in it), so it is raised only from a lower priority
    and put back only if it is still at ours: two pgprobes in one session never leave
    it raised, whichever ends first. Only a SIGKILL leaves it raised until the session
    ends (see README, Troubleshooting).
    """
    if not nice:
        return lambda: None
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) > nice:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
    before = autogroup_nice()
    if before is None or before <= nice or not _write_autogroup(nice):
        return lambda: None

    def restore() -> None:
        if autogroup_nice() == nice:
            _write_autogroup(before)

    return restore


def _write_autogroup(nice: int) -> bool:
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        return False
    return autogroup_nice() == nice
