"""What `pgprobe waits` asks the probe: bpf/waits.bt, its maps and its parameters."""

from __future__ import annotations

import argparse
from pathlib import Path

from pgprobe import engines, kernelbtf
from pgprobe.discover import Targets
from pgprobe.engines import compiled as engine
from pgprobe.engines.base import Capture, KeyKind, MapSpec
from pgprobe.errors import EXIT_ENV, PgprobeError
from pgprobe.tools import common
from pgprobe.tools.waits import compiled, lockdim, querydim
from pgprobe.waitevents import MAJORS, address, backend_state, lwmode

SCRIPT = "waits"  # bpf/waits.bt
INT: tuple[KeyKind, ...] = ("int",)
PAIR: tuple[KeyKind, ...] = ("int", "int")
MAPS = (
    MapSpec("window_ns", ()),
    MapSpec("now_ns", ()),
    MapSpec("cpu_ns", INT),
    MapSpec("runq_ns", PAIR),  # tid, how (2 preempted, 3 woken, 4 runnable at start)
    MapSpec("wait_ns", PAIR),  # tid, wait_event_info
    MapSpec("wait_hist", PAIR),
    MapSpec("born_ns", INT),
    MapSpec("exit_ns", INT),
    MapSpec("first_runs", INT),  # tid -> run count at its first switch-out (slept before)
    MapSpec("unseen", PAIR),  # kind, tid -> events the script knows it missed
    MapSpec("gap_ns", ()),  # total length of the breaks in a CPU's chain of switches
    # tid -> (since, state, a, b, then running totals: cpu, runq 2, runq 3, last wei, its
    # wait); tasks are deleted while it prints (keys may repeat)
    MapSpec("task", INT, combine="last"),
)
# @task holds an entry per task of the machine seen switching (most are "not ours").
ENV = {"BPFTRACE_MAP_KEYS_MAX": "65536"}

# --stacks: bpf/waits_stacks.bt, the same maps plus the user stack of every sleep
# (raw addresses, named by pgprobe from /proc/PID/maps snapshots).
STACKS_SCRIPT = "waits_stacks"
TRIPLE_STACK: tuple[KeyKind, ...] = ("int", "int", "stack")
STACKS_MAPS = (
    *MAPS,
    MapSpec("off_ns", TRIPLE_STACK),  # tid, wait_event_info, ustack -> ns off CPU
    MapSpec("open_ns", TRIPLE_STACK),  # the sleep open at exit -> its start
)
STACKS_ENV = {**ENV, "BPFTRACE_NO_USER_SYMBOLS": "1"}


def check_server(targets: Targets) -> None:
    cluster = targets.cluster
    if cluster.version_num and cluster.major not in MAJORS:
        raise PgprobeError(
            f"waits supports PostgreSQL {MAJORS[0]}-{MAJORS[-1]}; this server is "
            f"{cluster.version} (before 14 no my_wait_event_info to read)",
            EXIT_ENV,
        )


def script_args(
    targets: Targets, where: address.WaitEventAddress, interval: int | None
) -> list[int | Path]:
    """$1 postmaster, $2 address of my_wait_event_info, $3 interval, $4 single pid,
    $5 address of MyBEEntry and $6 offset of its st_state (ClientRead's state; 0 0: not read):
    the parameters waits.bt and waits.d share (bpf_args adds the .bt scripts' own)."""
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    state = backend_state.find(where, targets.cluster.major)
    return [targets.cluster.postmaster_pid, where.address, interval or 0, single,
            state.address if state else 0, state.offset if state else 0]  # fmt: skip


def bpf_args(args: list[int | Path]) -> list[int | Path]:
    """script_args plus $7-$12, this kernel's task_struct offsets (pgprobe.kernelbtf), which
    waits.bt and waits_stacks.bt read at (d/waits.d names curthread's fields instead)."""
    return [*args, *kernelbtf.task_offsets().as_args()]


def capture(
    ns: argparse.Namespace,
    args: list[int | Path],
    env: dict[str, str] | None = None,
    duty: float = 1.0,
    query: querydim.Dimension | None = None,
    locks: lockdim.Dimension | None = None,
    modes: lwmode.ModeAddress | None = None,
) -> Capture:
    """The time-model capture: bpf/waits.bpf.c compiled when it is built and loads here
    (a fraction of the script's cost per switch), else bpf/waits.bt, or d/waits.d.
    duty < 1 (with an interval): the compiled form runs that share of each interval; a
    script runs all the time, and says so. query: the time model keyed by statement too,
    locks: each Lock sleep by its lock (the compiled object only: a script's snapshot has
    no `query_ns`, no `lock_ns`); modes: each LWLock sleep's mode (lwmode; the compiled
    object only)."""
    dtrace = engines.choose(getattr(ns, "engine", "auto")) == "dtrace"

    def from_script() -> Capture:
        running = common.capture(ns, SCRIPT, args if dtrace else bpf_args(args), MAPS,
                                 env=ENV if env is None else env)  # fmt: skip
        if duty < 1.0:
            running.info.warnings.append(
                f"the time model's duty cycle ({duty:g}) needs the compiled object: the "
                "script runs all the time"
            )
        return running

    return engine.object_or_script(
        ns, compiled.OBJECT,
        lambda: compiled.capture(args, ns.duration, duty, query, locks, modes),
        from_script, "ran bpf/waits.bt, costlier per context switch",
    )  # fmt: skip


def client_read_note(where: address.WaitEventAddress, major: int) -> str | None:
    """One line when ClientRead's state (idle or in a transaction) is not read at all."""
    if backend_state.find(where, major) is not None:
        return None
    return (f"Client:ClientRead is not split into idle and idle in transaction "
            f"({backend_state.why_unknown(where, major)}): shown as state unknown")  # fmt: skip
