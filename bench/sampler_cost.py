"""The CPU sampler's BPF cost per fire: bpf/profile.bpf.c compiled against bpf/profile.bt.

A throwaway cluster, pgbench -S clients keeping the CPUs busy with the cluster's backends,
then `pgprobe flame --unwind fp` on the whole cluster, once with each form, in turns. While
each samples, the kernel's BPF statistics (bench/bpfstats.py) give its perf_event program's
runs and run time over a few seconds: the mean ns per fire (every CPU's sample, a target's
or not, as both forms filter in the program).

    python -m bench.sampler_cost --pairs 5 --hz 997
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from bench import bpfstats
from bench.answer import Backends, open_backends, throwaway_cluster
from bench.common import RUN_DIR
from pgprobe import proc
from pgprobe.sandbox import PgCluster

FORMS = {"compiled": [], "bpftrace": ["--engine", "bpftrace"]}


def _holder(pgprobe_pid: int, form: str) -> int | None:
    """The process holding the sampler's programs: pgprobe itself, or its bpftrace."""
    if form == "compiled":
        return pgprobe_pid
    return next((c for c in proc.children(pgprobe_pid)
                 if (i := proc.read_info(c)) and i.comm == "bpftrace"), None)  # fmt: skip


def one(cluster: PgCluster, form: str, hz: int, seconds: float) -> tuple[int, int]:
    """(runs, ns) of the perf_event program over `seconds` of one capture."""
    cmd = [sys.executable, "-m", "pgprobe", "flame", *cluster.conn_args, "--unwind", "fp",
           "-F", str(hz), "-d", "600", "--folded", *FORMS[form]]  # fmt: skip
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=RUN_DIR)
    try:
        deadline = time.monotonic() + 60
        progs: list[bpfstats.Program] = []
        while time.monotonic() < deadline and not progs:
            holder = _holder(child.pid, form)
            if holder is not None:
                progs = [p for p in bpfstats.programs(holder) if p.kind == "perf_event"]
            time.sleep(0.1)
        if not progs or holder is None:
            raise RuntimeError(f"{form}: no perf_event program seen")
        time.sleep(1.0)  # attached on every CPU
        before = [p for p in bpfstats.programs(holder) if p.kind == "perf_event"]
        time.sleep(seconds)
        after = [p for p in bpfstats.programs(holder) if p.kind == "perf_event"]
        moved = bpfstats.delta(before, after)
        return sum(p.runs for p in moved), sum(p.ns for p in moved)
    finally:
        child.send_signal(signal.SIGINT)
        child.wait(timeout=120)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sampler_cost", description=__doc__)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--hz", type=int, default=997)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--active", type=int, default=8, help="pgbench -S clients (default 8)")
    args = parser.parse_args(argv)
    per_fire: dict[str, list[float]] = {form: [] for form in FORMS}
    backends = Backends(idle=5, active=args.active)
    with bpfstats.BpfStats(), throwaway_cluster(backends) as cluster, \
            open_backends(cluster, backends):  # fmt: skip
        for i in range(args.pairs):
            for form in FORMS if i % 2 == 0 else reversed(FORMS):
                runs, ns = one(cluster, form, args.hz, args.seconds)
                per_fire[form].append(ns / runs if runs else 0.0)
                print(f"pair {i} {form}: {runs} fires, {ns / max(runs, 1):.0f} ns each")
    for form, values in per_fire.items():
        print(f"{form}: median {statistics.median(values):.0f} ns per fire "
              f"[{min(values):.0f}-{max(values):.0f}], {len(values)} runs")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
