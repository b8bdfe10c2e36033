"""When the agent starts a tracer afresh: what a long run piles up in its kernel maps.

bpftrace's maps live as long as the tracer. Two of serve's sources keep things
that no window needs any more, and every window pays for them (printed by
bpftrace, parsed by the agent) or loses by them:

- waits.bt's maps are running totals (a window is the difference of two prints):
  they keep every process that exited (timemodel.RECYCLE_AFTER_EXITED), and @task
  can keep entries of other programs' tasks that have exited (re-created after the
  exit event deleted them, when the task switched out and in again on its way
  out: 4 a second on this shared machine): past RECYCLE_AFTER_STALE of them.
- profile.bt's stack map (bpftrace 0.17: 131,072 stacks, whatever
  BPFTRACE_MAP_KEYS_MAX says) is never emptied while bpftrace runs: the kernel
  refuses a new stack whose hash bucket holds an old one (-EEXIST), so the share
  of samples without a stack grows with the stacks seen. Past
  STACKLESS_RECYCLE_SHARE of the samples (over STACK_CHECK_SAMPLES at least), and
  not more often than every STACK_RECYCLE_MIN_S.

Each recycle is said in one line and counted as a restart; the new tracer starts
at once (the gap is its start-up).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pgprobe import proc
from pgprobe.engines.base import Key, Snapshot
from pgprobe.tools.profiling.result import Profile
from pgprobe.tools.serve import timemodel

RECYCLE_AFTER_STALE = 2000
STACK_CHECK_SAMPLES = 500
STACKLESS_RECYCLE_SHARE = 0.05
STACK_RECYCLE_MIN_S = 600.0


def stale_tasks(snapshot: Snapshot) -> int:
    """How many entries of waits.bt's @task belong to tasks that no longer exist and
    that the maps do not keep on purpose (an exited process of ours is in @exit_ns)."""
    kept = snapshot.get("exit_ns")
    return sum(1 for key in snapshot.get("task") if key not in kept and not alive_task(key))


def alive_task(key: Key) -> bool:
    """Whether the task of a @task key still exists."""
    return bool(key) and isinstance(key[0], int) and proc.exists(key[0])


def waits_full(snapshot: Snapshot) -> str:
    """Why the waits tracer must start afresh ("its maps held ..."), or ""."""
    gone = timemodel.exited(snapshot)
    if gone >= timemodel.RECYCLE_AFTER_EXITED:
        return f"its maps held {gone:,} processes that exited"
    # Only a map that big can hold that many (a look at /proc per entry is not free).
    big = len(snapshot.get("task")) >= RECYCLE_AFTER_STALE
    stale = stale_tasks(snapshot) if big else 0
    if stale >= RECYCLE_AFTER_STALE:
        return f"its maps held {stale:,} tasks of other programs that exited"
    return ""


@dataclass
class StackMapWatch:
    """The CPU tracer's share of samples without a user stack, window after window."""

    started: float = field(default_factory=time.monotonic)
    samples: int = 0
    stackless: int = 0

    def full(self, profile: Profile) -> str:
        """Why the CPU tracer must start afresh, or ""."""
        self.samples += profile.samples
        self.stackless += profile.samples_without_stack
        if self.samples < STACK_CHECK_SAMPLES:
            return ""
        samples, stackless = self.samples, self.stackless
        self.samples = self.stackless = 0
        old_enough = time.monotonic() - self.started >= STACK_RECYCLE_MIN_S
        if not old_enough or stackless < STACKLESS_RECYCLE_SHARE * samples:
            return ""
        return (f"{stackless:,} of its last {samples:,} samples had no user stack (its stack "
                "map is never emptied while it runs: a new stack colliding with an old one "
                "is refused)")  # fmt: skip
