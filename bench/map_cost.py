"""What BPF map operations cost in the scheduler's tracepoints under a real load (issue 14).

probe_cost's ping-pong times a context switch with two tasks and hot caches. On the real
load (pgbench -S -c 8, both CPUs saturated) bpf/waits.bt's sched_switch program ran 5-7x
longer per fire than there (docs/benchmarks.md). This splits that cost: small bpftrace
programs, each adding one kind of map operation to the empty pair, waits.bt itself and
the lean design's cost probe (bench/sched_lean.bt), run in turn (the order reversed every
other round) against one pgbench load on a throwaway cluster; the kernel's BPF statistics
give the run time per fire of every program.

    python -m bench.map_cost [--rounds 2] [--seconds 8] [--keys 65536]

Needs root and bpftrace; meaningful on a quiet machine only.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import bpfstats, common
from pgprobe import kernelbtf
from pgprobe.sandbox import PgCluster
from pgprobe.waitevents import address

SWITCH = "tracepoint:sched:sched_switch"
WAKEUP = "tracepoint:sched:sched_wakeup"
LIVE = 'BEGIN { printf("@@live\\n"); }'
ATTACH_TIMEOUT_S = 60.0
# A 9-field tuple like waits.bt's @task entry.
TUPLE = "(nsecs, 1, (uint64)2, (uint64)3, (uint64)4, (uint64)5, (uint64)6, (uint64)7, (uint64)8)"


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    program: str  # bpftrace -e text, or "waits" for bpf/waits.bt


VARIANTS = (
    Variant("empty", "empty programs on both", f"{LIVE} {SWITCH} {{ }} {WAKEUP} {{ }}"),
    Variant(
        "update",
        "switch: one hash update keyed by prev (8-byte value)",
        f"{LIVE} {SWITCH} {{ @t[args->prev_pid] = nsecs; }} {WAKEUP} {{ }}",
    ),
    Variant(
        "lookup",
        "the same, and wakeup: one lookup of that hash",
        f"{LIVE} {SWITCH} {{ @t[args->prev_pid] = nsecs; }} "
        f'{WAKEUP} {{ $s = @t[args->pid]; if ($s == 1) {{ printf("x"); }} }}',
    ),
    Variant(
        "tuple",
        "switch: one hash update with a 9-field tuple (waits.bt's @task)",
        f"{LIVE} {SWITCH} {{ @t[args->prev_pid] = {TUPLE}; }} {WAKEUP} {{ }}",
    ),
    Variant(
        "count",
        "wakeup: count() keyed by pid (per-CPU hash)",
        f"{LIVE} {SWITCH} {{ }} {WAKEUP} {{ @c[args->pid] = count(); }}",
    ),
    Variant(
        "hist",
        "wakeup: hist() keyed by pid",
        f"{LIVE} {SWITCH} {{ }} {WAKEUP} {{ @h[args->pid] = hist(nsecs & 0xfffff); }}",
    ),
    Variant("waits", "bpf/waits.bt (the cluster's processes are its own)", "waits"),
    Variant(
        "lean",
        "bench/sched_lean.bt: switch-out only, one lookup and one update per backend's switch",
        "lean",
    ),
)


@dataclass
class Reading:
    """One window of one variant: BPF ns per fire and fires/s of each program."""

    ns_per_fire: dict[str, float] = field(default_factory=dict)
    fires_per_s: dict[str, float] = field(default_factory=dict)


def _argv(variant: Variant, pm: int, wait_event_address: int) -> list[str]:
    here = Path(__file__).resolve().parent
    if variant.program == "waits":
        offsets = [str(n) for n in kernelbtf.task_offsets().as_args()]
        zeros = ["0"] * 4  # interval, single pid, MyBEEntry and its st_state: not read
        return ["bpftrace", str(here.parent / "bpf" / "waits.bt"), str(pm),
                str(wait_event_address), *zeros, *offsets]  # fmt: skip
    if variant.program == "lean":
        task = kernelbtf.task_offsets()
        run_delay = kernelbtf.member_offset("task_struct", "sched_info.run_delay")
        fields = [task.sum_exec_runtime, run_delay, task.real_parent, task.tgid]
        return ["bpftrace", str(here / "sched_lean.bt"), str(pm), str(wait_event_address),
                *(str(n) for n in fields)]  # fmt: skip
    return ["bpftrace", "-e", variant.program]


def _program(name: str) -> str:
    """bpftrace names a program after its probe, cut to 15 characters."""
    return "sched_switch" if "switch" in name else "sched_wakeup" if "wakeup" in name else name


def measure_one(argv: list[str], seconds: float, keys: int) -> Reading:
    env = {**os.environ, "BPFTRACE_MAP_KEYS_MAX": str(keys)}
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True
    )
    assert child.stdout is not None
    try:
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        while child.stdout.readline().strip() != "@@live":
            if time.monotonic() > deadline or child.poll() is not None:
                raise SystemExit(f"bench.map_cost: {argv[1:3]} did not attach")
        time.sleep(1.0)  # maps filled with the load's tasks
        names: dict[int, str] = {}
        before = bpfstats.programs(child.pid, names)
        time.sleep(seconds)
        after = bpfstats.programs(child.pid, names)
    finally:
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=60)
    reading = Reading()
    for p in bpfstats.delta(before, after):
        if p.runs and p.kind == "tracepoint":
            name = _program(p.name)
            reading.ns_per_fire[name] = p.ns / p.runs
            reading.fires_per_s[name] = p.runs / seconds
    return reading


def measure(rounds: int, seconds: float, keys: int) -> dict[str, list[Reading]]:
    out: dict[str, list[Reading]] = {v.key: [] for v in VARIANTS}
    with PgCluster(name="pgprobe-map-cost") as pg:
        pg.pgbench("-i", "-s", "2", "-q").communicate()
        pm = pg.postmaster_pid
        where = address.find(pm, os.readlink(f"/proc/{pm}/exe"))
        length = rounds * len(VARIANTS) * (seconds + 6) + 30
        load = pg.pgbench("-S", "-c", "8", "-j", "2", "-T", str(int(length)), "-n")
        time.sleep(3)
        try:
            with bpfstats.BpfStats() as stats:
                if not stats.enabled:
                    raise SystemExit(f"bench.map_cost: BPF statistics: {stats.error}")
                for r in range(rounds):
                    for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                        reading = measure_one(_argv(variant, pm, where.address), seconds, keys)
                        out[variant.key].append(reading)
                        common.log(f"map_cost {variant.key}: {_line(reading)}")
        finally:
            load.send_signal(signal.SIGINT)
            load.communicate(timeout=60)
    return out


def _line(reading: Reading) -> str:
    return ", ".join(
        f"{name} {reading.ns_per_fire[name]:.0f} ns x {reading.fires_per_s[name]:,.0f}/s"
        for name in sorted(reading.ns_per_fire)
    )


def _median(readings: list[Reading], name: str, fires: bool = False) -> str:
    values = [(r.fires_per_s if fires else r.ns_per_fire).get(name) for r in readings]
    m = common.median(values)
    return "-" if m is None else f"{m:,.0f}"


def table(results: dict[str, list[Reading]]) -> str:
    """Markdown: median BPF ns per fire of each program, per variant, and fires/s."""
    rows = [
        "| variant | sched_switch ns/fire | sched_wakeup ns/fire | switches/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    for variant in VARIANTS:
        readings = results[variant.key]
        rows.append(
            f"| {variant.label} | {_median(readings, 'sched_switch')} "
            f"| {_median(readings, 'sched_wakeup')} "
            f"| {_median(readings, 'sched_switch', fires=True)} |"
        )
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.map_cost", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--keys", type=int, default=65536, help="BPFTRACE_MAP_KEYS_MAX")
    ns = parser.parse_args(argv)
    print(table(measure(ns.rounds, ns.seconds, ns.keys)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
