"""What `pgprobe lwlocks` asks the probe: bpf/lwlock_wait.bt (d/lwlock_wait.d), or waits.bt.

Two sources give the same rows. SCHED, the default (PostgreSQL 14+): `pgprobe waits`'
capture (the compiled bpf/waits.bpf.c, else bpf/waits.bt), whose LWLock-class sleeps,
with the runqueue time after each and the mode read at the switch-out, are taken as the
waits (records.sleep_records): it costs per context switch, not per wait, and stays
attached however contended the server. USDT (--source usdt; the default on 13, where
the time model cannot run): the LWLock wait probes time every wait, keyed by (pid,
tranche, mode), exact counts at a uprobe trap per fire, hence its guard. `start` and
`check_server` are what triage and serve call too.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pgprobe import engines, usdt, waitevents
from pgprobe.discover import Targets
from pgprobe.engines import compiled as engine
from pgprobe.engines.base import Capture, KeyKind, MapSpec
from pgprobe.errors import EXIT_ENV, EXIT_USAGE, PgprobeError
from pgprobe.tools import common
from pgprobe.tools.lwlocks import compiled
from pgprobe.tools.waits import probe as waits_probe
from pgprobe.waitevents import address, lwmode

SCRIPT = "lwlock_wait"  # bpf/lwlock_wait.bt, d/lwlock_wait.d
PROBES = ("lwlock__wait__start", "lwlock__wait__done")
MIN_MAJOR = 13  # names in the probe equal pg_stat_activity's wait_event from 13 on

KEY: tuple[KeyKind, ...] = ("int", "str", "str")  # pid (0 unless keyed by pid), tranche, mode
MAPS = (
    MapSpec("wait_stats", KEY),
    MapSpec("wait_max_ns", KEY, combine="max"),
    MapSpec("wait_ns", KEY),
    MapSpec("wait_unfinished", ()),
)
# Where the figures come from: the LWLock wait probes, or the scheduler (sleeps).
USDT, SCHED = "usdt", "sched_switch"

# The --max-events-per-sec guard (USDT source only; guard.py): 1,000 fires/s x
# guard.FIRE_COST_US = 1.7 % of one CPU, the default bound; 0 turns the guard off.
DEFAULT_MAX_FIRES_PER_S = 1000
# Above 2**31 the script's comparison would be meaningless; no server gets near it.
MAX_FIRES_LIMIT = 2**31 - 1


def wanted_source(ns: argparse.Namespace, targets: Targets) -> str:
    """The source, "usdt" or "sched", as asked (--source) or by cost (auto: the scheduler,
    which stays attached on a busy server at no cost per wait; USDT on 13, which has no
    time model, and with DTrace), before any check of the server."""
    wanted = str(getattr(ns, "source", "auto"))
    if wanted != "auto":
        return wanted
    cluster = targets.cluster
    old = bool(cluster.version_num) and cluster.major < min(waitevents.MAJORS)
    dtrace = engines.choose(getattr(ns, "engine", "auto")) == "dtrace"
    return "usdt" if old or dtrace else "sched"


def pick_source(ns: argparse.Namespace, targets: Targets) -> str:
    """USDT or SCHED for this server (wanted_source), checked: a one-line refusal when
    the server or the engine cannot give it."""
    dtrace = engines.choose(getattr(ns, "engine", "auto")) == "dtrace"
    wanted = wanted_source(ns, targets)
    if wanted == "usdt":
        check_server(targets)
        return USDT
    if dtrace:
        raise PgprobeError(
            "lwlocks --source sched needs bpftrace (no DTrace twin of bpf/waits.bt yet)",
            EXIT_USAGE,
        )
    waits_probe.check_server(targets)
    return SCHED


def check_server(targets: Targets) -> None:
    cluster = targets.cluster
    if cluster.version_num and cluster.major < MIN_MAJOR:
        raise PgprobeError(
            f"lwlocks supports PostgreSQL {MIN_MAJOR} and later; this server is "
            f"{cluster.version}: before 13 the lwlock__wait__start probe names individual "
            "locks 'main' (11-12) or passes a tranche number (10 and older)",
            EXIT_ENV,
        )
    usdt.require(cluster.binary, PROBES)
    for foreign in usdt.foreign_uprobes(cluster.binary, PROBES):
        common.warn(foreign.describe())


def script_args(
    targets: Targets, by_pid: bool, interval: int | None, max_fires_per_s: int = 0
) -> list[int | Path]:
    """$1 binary, $2 postmaster, $3 key by pid, $4 interval, $5 single pid, $6 the guard."""
    cluster = targets.cluster
    single = targets.pids[0] if not targets.whole_cluster and len(targets.pids) == 1 else 0
    # A subset of several pids is filtered here in Python, from per-pid keys.
    key_by_pid = by_pid or (not targets.whole_cluster and not single)
    guard = int(max_fires_per_s)  # a validated int (command.py), never user text
    return [
        Path(cluster.binary),
        cluster.postmaster_pid,
        int(key_by_pid),
        interval or 0,
        single,
        guard,
    ]


def start_sleeps(
    ns: argparse.Namespace, targets: Targets, interval: int | None
) -> tuple[Capture, bool]:
    """The time model for the targets (the SCHED source), reading each LWLock sleep's
    mode, ready to run; and whether the modes are read (else said in one line)."""
    cluster = targets.cluster
    where = address.find(cluster.postmaster_pid, cluster.binary)
    args = waits_probe.script_args(targets, where, interval)
    modes = lwmode.find(where, cluster.major)
    if modes is None:
        common.warn(f"{cluster.binary} exports no MyProc (or PostgreSQL {cluster.major}'s "
                    "PGPROC is not known): each wait's MODE is unknown")  # fmt: skip
    return waits_probe.capture(ns, args, modes=modes), modes is not None


def start(
    ns: argparse.Namespace,
    targets: Targets,
    by_pid: bool,
    interval: int | None,
    max_fires_per_s: int = 0,
) -> Capture:
    """lwlock_wait for the targets, ready to run (iterate its events): bpf/lwlock_wait.bpf.c
    compiled where it is built and loads here, else the script (d/lwlock_wait.d with DTrace).

    max_fires_per_s: the guard (0: none). Triage and serve call this without it: a
    capture that ends itself would cut their fixed windows (triage's parts share one
    window; serve's stream of windows would stop).
    """
    args = script_args(targets, by_pid, interval, max_fires_per_s)
    # libbpf attaches a USDT probe at every site or none: one taken by another uprobe
    # (check_server said which) would fail the capture, where bcc loses that site alone
    foreign = usdt.foreign_uprobes(targets.cluster.binary, PROBES)
    taken = "another uprobe sits on a site of the LWLock probes" if foreign else None
    return engine.object_or_script(
        ns, compiled.OBJECT,
        lambda: compiled.capture(args, getattr(ns, "duration", None), interval, max_fires_per_s),
        lambda: common.capture(ns, SCRIPT, args, MAPS,
                               env={"BPFTRACE_MAP_KEYS_MAX": str(65536 if by_pid else 16384)},
                               cluster_pid=targets.cluster.postmaster_pid),
        f"ran bpf/{SCRIPT}.bt", not_here=taken,
    )  # fmt: skip
