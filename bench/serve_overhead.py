"""Overhead of `pgprobe serve` at its default rates: TPS ratio and CPU share (for scripts/bench).

    from bench import serve_overhead
    result = serve_overhead.measure(cluster)          # a pgbench-initialised PgCluster
    print(result.as_json())

``measure`` runs pgbench windows of ``seconds`` in pairs, without and with the agent
(the order alternates pair by pair, so that a drift of the machine weighs on both
sides alike). For a window with the agent, serve is started first and the window
begins only once every capture is up and has folded a window (bpftrace's start-up,
compiling and attaching, is not the steady cost being measured); serve is stopped
after it. Figures:

- ``tps_ratio``: median over the pairs of TPS with / TPS without (budget >= 0.99);
- ``cpu_pct``: CPU of pgprobe + its tracers during the windows with the agent, from
  /proc/PID/stat (utime + stime of the agent, its live tracers and the ones it reaped),
  in % of one CPU (budget < 1 %);
- ``rss_mib``, ``bpf_mib``: per process at the end of the last window with the agent, its
  RSS and the kernel memory of its BPF maps (memlock, each map once);
- ``bpf_ms_per_s`` (with ``bpf``, as ``python -m bench.serve_overhead`` asks): the BPF
  programs' run time (the agent's compiled time model and its tracers', kernel statistics),
  in ms per second of one more window with the agent after the pairs: the statistics cost
  two clock reads per run, so the TPS windows run without them.

Meaningful on a quiet machine only. ``python -m bench.serve_overhead`` runs it on a
throwaway cluster.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench import bpfstats, common
from bench.serve_soak import memory_mib, metric, start_agent, tracer_name
from pgprobe.sandbox import PgCluster, free_port

PGBENCH_ARGS = ("-c", "8", "-j", "2")
_TPS = re.compile(r"^tps = (\d+(?:\.\d+)?)", re.M)
SOURCE_NAMES = (
    "waits",
    "lwlock",
    "slru",
    "cpu",
)  # lwlock: fed by waits unless --lwlock-source usdt


@dataclass
class ServeOverhead:
    seconds: int
    pgbench_args: list[str]
    serve_args: list[str]
    tps_without: list[float] = field(default_factory=list)
    tps_with: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)  # pgprobe + tracers, per window with
    wall_s: list[float] = field(default_factory=list)
    rss_mib: dict[str, float] = field(default_factory=dict)  # at the end of the last window
    bpf_mib: dict[str, float] = field(default_factory=dict)  # kernel memory of the BPF maps
    lost_events: float = 0.0
    bpf_ms_per_s: dict[str, float] = field(default_factory=dict)  # per program, and "all"

    @property
    def tps_ratio(self) -> float | None:
        ratios = [w / wo for w, wo in zip(self.tps_with, self.tps_without, strict=True) if wo]
        return common.median(ratios)

    @property
    def cpu_pct(self) -> float:
        return 100 * sum(self.cpu_s) / sum(self.wall_s) if self.wall_s else 0.0

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "tps_ratio": self.tps_ratio, "cpu_pct_of_one_cpu": self.cpu_pct}


def pgbench_tps(cluster: PgCluster, args: Sequence[str], seconds: int) -> float:
    out, _ = cluster.pgbench(*args, "-T", str(seconds)).communicate(timeout=seconds + 120)
    found = _TPS.search(out or "")
    if found is None:
        raise RuntimeError(f"pgbench printed no tps: {(out or '')[-500:]}")
    return float(found.group(1))


def wait_all_up(port: int, agent: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Until every source is up and the agent has folded two windows of each: a source's
    first window carries its start (the CPU source reads the server's ELF images to name
    the stacks), which is not the steady cost measured."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if agent.poll() is not None:
            raise RuntimeError(f"pgprobe serve ended ({agent.returncode})")
        up = metric(port, "pgprobe_capture_up")
        windows = [
            metric(port, f'pgprobe_capture_windows_total{{source="{s}"}}') for s in SOURCE_NAMES
        ]
        if up >= len(SOURCE_NAMES) and min(windows) >= 2:
            return
        time.sleep(1)
    raise RuntimeError("pgprobe serve: not every capture came up")


def with_agent(cluster: PgCluster, result: ServeOverhead) -> None:
    port = free_port()
    agent = start_agent(cluster, port, *result.serve_args)
    try:
        wait_all_up(port, agent)
        cpu0, t0 = common.tree_cpu_s([agent.pid]), time.monotonic()
        result.tps_with.append(pgbench_tps(cluster, result.pgbench_args, result.seconds))
        result.cpu_s.append(common.tree_cpu_s([agent.pid]) - cpu0)
        result.wall_s.append(time.monotonic() - t0)
        result.rss_mib = {"agent": memory_mib(agent.pid)["rss"]}
        for child in common.children(agent.pid):
            memory = memory_mib(child)
            result.rss_mib[tracer_name(child)] = memory["rss"]
            result.bpf_mib[tracer_name(child)] = memory["bpf"]
        result.lost_events = metric(port, "pgprobe_capture_lost_events_total")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)


def bpf_time(cluster: PgCluster, result: ServeOverhead) -> None:
    """One window of pgbench with the agent and the kernel's BPF statistics on: the run time
    of every BPF program of the agent and of its tracers, per second of the window."""
    port = free_port()
    agent = start_agent(cluster, port, *result.serve_args)
    try:
        wait_all_up(port, agent)
        with bpfstats.BpfStats() as stats:
            if not stats.enabled:
                raise RuntimeError(f"BPF statistics: {stats.error}")
            pids = [agent.pid, *common.children(agent.pid)]
            before = [p for pid in pids for p in bpfstats.programs(pid)]
            t0 = time.monotonic()
            pgbench_tps(cluster, result.pgbench_args, result.seconds)
            wall = time.monotonic() - t0
            after = [p for pid in pids for p in bpfstats.programs(pid)]
        per: dict[str, float] = {}
        for prog in bpfstats.delta(before, after):
            per[prog.name] = per.get(prog.name, 0.0) + prog.ns / 1e6 / wall
        result.bpf_ms_per_s = {**per, "all": sum(per.values())}
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)


def measure(
    cluster: PgCluster,
    *,
    seconds: int = 60,
    pairs: int = 3,
    pgbench_args: Sequence[str] = PGBENCH_ARGS,
    serve_args: Sequence[str] = (),
    bpf: bool = False,
) -> ServeOverhead:
    """TPS with and without `pgprobe serve` (default rates unless serve_args), CPU share."""
    result = ServeOverhead(seconds, list(pgbench_args), list(serve_args))
    for pair in range(pairs):
        steps = ("without", "with") if pair % 2 == 0 else ("with", "without")
        for step in steps:
            if step == "with":
                with_agent(cluster, result)
            else:
                result.tps_without.append(pgbench_tps(cluster, pgbench_args, seconds))
            common.log(f"serve overhead: pair {pair + 1}/{pairs}, {step} the agent done")
    if bpf:
        bpf_time(cluster, result)
    return result


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    name = "bench.serve_overhead"
    parser = argparse.ArgumentParser(name, description=__doc__, formatter_class=raw)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument(
        "--pgbench",
        default=" ".join(PGBENCH_ARGS),
        help="pgbench's options "
        f"for the load (default {' '.join(PGBENCH_ARGS)!r}; '-S ...': select-only)",
    )
    parser.add_argument("serve_args", nargs="*", help="pgprobe serve's options (after --)")
    args = parser.parse_args()
    with PgCluster(name="pgprobe-serve-overhead") as pg:
        pg.pgbench("-i", "-q", "-s", str(args.scale)).communicate(timeout=600)
        result = measure(pg, seconds=args.seconds, pairs=args.pairs, serve_args=args.serve_args,
                         pgbench_args=args.pgbench.split(), bpf=True)  # fmt: skip
    print(json.dumps(result.as_json(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
