"""A compiled object's BPF cost per fire against its script's, the same capture in turns.

- `--tool flame`: bpf/profile.bpf.c against bpf/profile.bt. pgbench -S clients keep the
  CPUs busy with the cluster's backends; `pgprobe flame --unwind fp` on the whole cluster.
  Its perf_event program's runs: every CPU's sample, a target's or not, as both forms
  filter in the program.
- `--tool lwlocks`: bpf/lwlock_wait.bpf.c against bpf/lwlock_wait.bt. A TPC-B-like pgbench
  (-c 8: thousands of LWLock waits a second); `pgprobe lwlocks --source usdt` without its
  guard. Its two USDT programs' runs (kind kprobe/uprobe), starts and dones.

While each runs, the kernel's BPF statistics (bench/bpfstats.py) give its programs' runs
and run time over a few seconds: the mean ns per fire. The mechanism's own cost (the
uprobe trap, the perf interrupt) is the same for both forms and is not in it.

    python -m bench.fire_cost --tool flame --pairs 5 --hz 997
    python -m bench.fire_cost --tool lwlocks --pairs 5
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

from bench import bpfstats
from bench.answer import Backends, open_backends, throwaway_cluster
from bench.common import RUN_DIR
from pgprobe import proc
from pgprobe.sandbox import PgCluster

FORMS = {"compiled": [], "bpftrace": ["--engine", "bpftrace"]}


def _holder(pgprobe_pid: int, form: str) -> int | None:
    """The process holding the capture's programs: pgprobe itself, or its bpftrace."""
    if form == "compiled":
        return pgprobe_pid
    return next((c for c in proc.children(pgprobe_pid)
                 if (i := proc.read_info(c)) and i.comm == "bpftrace"), None)  # fmt: skip


# The capture of each tool (run until signalled) and the kind of its programs.
TOOLS = {
    "flame": (["flame", "--unwind", "fp", "-F", "{hz}", "-d", "600", "--folded"], "perf_event"),
    "lwlocks": (["lwlocks", "--source", "usdt", "--max-events-per-sec", "0", "-d", "600"],
                "kprobe/uprobe"),
}  # fmt: skip


def one(cluster: PgCluster, tool: str, form: str, hz: int, seconds: float) -> tuple[int, int]:
    """(runs, ns) of the tool's programs over `seconds` of one capture."""
    argv, kind = TOOLS[tool]
    cmd = [sys.executable, "-m", "pgprobe", *(a.format(hz=hz) for a in argv),
           *cluster.conn_args, *FORMS[form]]  # fmt: skip
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=RUN_DIR)
    try:
        deadline = time.monotonic() + 60
        progs: list[bpfstats.Program] = []
        while time.monotonic() < deadline and not progs:
            holder = _holder(child.pid, form)
            if holder is not None:
                progs = [p for p in bpfstats.programs(holder) if p.kind == kind]
            time.sleep(0.1)
        if not progs or holder is None:
            raise RuntimeError(f"{form}: no {kind} program seen")
        time.sleep(1.0)  # attached on every CPU, at every site
        before = [p for p in bpfstats.programs(holder) if p.kind == kind]
        time.sleep(seconds)
        after = [p for p in bpfstats.programs(holder) if p.kind == kind]
        moved = bpfstats.delta(before, after)
        return sum(p.runs for p in moved), sum(p.ns for p in moved)
    finally:
        child.send_signal(signal.SIGINT)
        child.wait(timeout=120)


@contextlib.contextmanager
def tpcb(cluster: PgCluster, args: argparse.Namespace) -> Iterator[None]:
    """With --tool lwlocks: a TPC-B-like pgbench of --active clients, while inside."""
    if args.tool != "lwlocks":
        yield
        return
    load = cluster.pgbench("-n", "-c", str(args.active), "-j", "2", "-T", "3600")
    time.sleep(2)  # the clients connect and reach their steady state
    try:
        yield
    finally:
        load.terminate()
        load.communicate()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fire_cost", description=__doc__)
    parser.add_argument("--tool", choices=TOOLS, default="flame")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--hz", type=int, default=997)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--active", type=int, default=8, help="pgbench clients (default 8)")
    args = parser.parse_args(argv)
    per_fire: dict[str, list[float]] = {form: [] for form in FORMS}
    # flame: pgbench -S clients (open_backends); lwlocks: TPC-B-like clients, started here
    backends = Backends(idle=5, active=args.active if args.tool == "flame" else 0)
    with bpfstats.BpfStats(), throwaway_cluster(backends) as cluster, \
            open_backends(cluster, backends), tpcb(cluster, args):  # fmt: skip
        for i in range(args.pairs):
            for form in FORMS if i % 2 == 0 else reversed(FORMS):
                runs, ns = one(cluster, args.tool, form, args.hz, args.seconds)
                per_fire[form].append(ns / runs if runs else 0.0)
                print(f"pair {i} {form}: {runs} fires, {ns / max(runs, 1):.0f} ns each")
    for form, values in per_fire.items():
        print(f"{form}: median {statistics.median(values):.0f} ns per fire "
              f"[{min(values):.0f}-{max(values):.0f}], {len(values)} runs")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
