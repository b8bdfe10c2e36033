"""pgprobe top's own CPU per refresh, with many backends: `python -m bench.top`.

A throwaway cluster gets N idle connections and M active pgbench -S clients
(bench.answer's), then `pgprobe top` runs in each mode: the full screen (in a tmux pane of
80x24, as a user would see it), the text of a pipe, and --json lines. After a warm-up of
two refreshes, its CPU (utime + stime, /proc/PID/stat: pgprobe's process, which reads the
compiled object's maps, /proc and the SQL views, and draws) is read at the start and the
end of a span: CPU per second, and per refresh at the interval. The programs' own cost in
the kernel at each context switch is the time model's, measured apart (docs/benchmarks.md).

    sudo .venv/bin/python -m bench.top --idle 1000 --active 8 --seconds 30
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from bench.answer import Backends, open_backends, throwaway_cluster
from bench.common import proc_cpu_s
from pgprobe.sandbox import PgCluster

SESSION = "pgprobe-bench-top"
MODES = ("screen", "text", "json")


def start(
    mode: str, cluster: PgCluster, interval: int
) -> tuple[int, subprocess.Popen[bytes] | None]:
    """pgprobe top in one mode: (its pid, the Popen for the piped modes)."""
    argv = [sys.executable, "-m", "pgprobe", "top", *cluster.conn_args,
            "--interval", str(interval)]  # fmt: skip
    if mode == "screen":
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
        subprocess.run(["tmux", "new-session", "-d", "-s", SESSION, "-x", "80", "-y", "24",
                        "exec " + " ".join(argv)], check=True)  # fmt: skip
        pid = subprocess.run(["tmux", "display", "-p", "-t", SESSION, "#{pane_pid}"],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        return int(pid), None
    if mode == "json":
        argv.append("--json")
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return child.pid, child


def measure(mode: str, cluster: PgCluster, interval: int, seconds: float) -> float:
    """pgprobe's CPU seconds per second in steady state."""
    pid, child = start(mode, cluster, interval)
    try:
        time.sleep(3 + 2 * interval)  # attached, the first refreshes drawn
        t0, c0 = time.monotonic(), proc_cpu_s(pid)
        time.sleep(seconds)
        t1, c1 = time.monotonic(), proc_cpu_s(pid)
        assert c0 is not None and c1 is not None, f"pgprobe top ({mode}) ended early"
        return (c1 - c0) / (t1 - t0)
    finally:
        if child is not None:
            child.send_signal(signal.SIGINT)
            child.wait(timeout=30)
        else:
            subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--active", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--interval", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args(argv)
    backends = Backends(args.idle, args.active)
    with throwaway_cluster(backends) as cluster, open_backends(cluster, backends):
        print(f"{backends.label} backends, {os.cpu_count()} CPUs, refresh every "
              f"{args.interval} s, {args.seconds:g} s measured per mode")  # fmt: skip
        for mode in args.modes:
            per_s = measure(mode, cluster, args.interval, args.seconds)
            print(f"{mode:6}  {100 * per_s:5.2f} % of one CPU  "
                  f"{1000 * per_s * args.interval:6.1f} ms per refresh", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
