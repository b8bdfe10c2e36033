"""What `pgprobe waits` asks the probe: bpf/waits.bt, its maps and its parameters."""

from __future__ import annotations

from pathlib import Path

from pgprobe.discover import Targets
from pgprobe.engines.base import KeyKind, MapSpec
from pgprobe.errors import EXIT_ENV, PgprobeError
from pgprobe.waitevents import MAJORS, address

SCRIPT = "waits"  # bpf/waits.bt
INT: tuple[KeyKind, ...] = ("int",)
PAIR: tuple[KeyKind, ...] = ("int", "int")
MAPS = (
    MapSpec("window_ns", ()),
    MapSpec("now_ns", ()),
    MapSpec("cpu_ns", INT),
    MapSpec("runq_ns", PAIR),  # tid, how (2 preempted, 3 woken)
    MapSpec("wait_ns", PAIR),  # tid, wait_event_info
    MapSpec("wait_hist", PAIR),
    MapSpec("born_ns", INT),
    MapSpec("exit_ns", INT),
    MapSpec("unseen", INT),  # kind -> events the script knows it missed
    MapSpec("task", INT),  # tid -> (since, state, a, b)
)
# @task holds an entry per task of the machine seen switching (most are "not ours").
ENV = {"BPFTRACE_MAP_KEYS_MAX": "65536"}


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
    """$1 postmaster, $2 address of my_wait_event_info, $3 interval, $4 single pid."""
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    return [targets.cluster.postmaster_pid, where.address, interval or 0, single]
