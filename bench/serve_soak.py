"""Soak of `pgprobe serve`: memory and CPU of the agent and its tracers over a long run.

    .venv/bin/python -m bench.serve_soak [--minutes 10] [--window 10] [-F 19]

A throwaway cluster under pgbench -c 8 (TPC-B-like), `pgprobe serve` at its
defaults against it, and every 30 s: the agent's RSS, its tracers' RSS, the
CPU share of agent + tracers since the last sample (one CPU = 100 %), /metrics'
windows and lost events. Prints a Markdown table and the verdict against the
budget (memory flat: the last third's RSS within 10 % of the first third's
after warm-up; under 1 % of one CPU). Run it on a quiet machine only (the
numbers of a shared machine say nothing); they belong in docs/benchmarks.md.

The TPS ratio of the agent (budget >= 0.99) needs the interleaved windows of
bench/overhead.py, which starts and stops a tool per window: serve runs for
good, so that comparison is left to a later change of overhead.py.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
import urllib.request

from bench import common
from pgprobe.sandbox import PgCluster, free_port

SAMPLE_EVERY_S = 30


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / common.KIB_PER_MIB
    except OSError:
        pass
    return 0.0


def metric(port: int, name: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return float("nan")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench.serve_soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("-F", dest="hz", type=int, default=19)
    args = parser.parse_args()
    rows: list[tuple[float, float, float, float, float, float]] = []
    with PgCluster(name="pgprobe-soak") as pg:
        init = pg.pgbench("-i", "-q", "-s", "10")
        init.communicate(timeout=600)
        seconds = int(args.minutes * 60) + 60
        load = pg.pgbench("-c", "8", "-j", "2", "-T", str(seconds))
        port = free_port()
        agent = subprocess.Popen(
            [sys.executable, "-m", "pgprobe", "serve", *pg.conn_args, "--listen",
             f"127.0.0.1:{port}", "--window", str(args.window), "-F", str(args.hz)],
            cwd=common.RUN_DIR,
        )  # fmt: skip
        try:
            started = time.monotonic()
            cpu0 = common.tree_cpu_s([agent.pid])
            while time.monotonic() - started < args.minutes * 60:
                time.sleep(SAMPLE_EVERY_S)
                tracers = common.children(agent.pid)
                rows.append((
                    time.monotonic() - started,
                    rss_mib(agent.pid),
                    sum(rss_mib(p) for p in tracers),
                    common.tree_cpu_s([agent.pid]) - cpu0,
                    metric(port, "pgprobe_capture_windows_total"),
                    metric(port, "pgprobe_capture_lost_events_total"),
                ))  # fmt: skip
                common.log(f"soak: {rows[-1]}")
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=60)
            load.kill()
            load.wait()
    print("| t (s) | agent RSS MiB | tracers RSS MiB | CPU % of one CPU since the last row "
          "| windows | lost |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    last_t = last_cpu = 0.0
    for t, rss, trss, cpu, windows, lost in rows:
        share = 100 * (cpu - last_cpu) / (t - last_t)
        print(f"| {t:.0f} | {rss:.1f} | {trss:.1f} | {share:.2f} | {windows:.0f} | {lost:.0f} |")
        last_t, last_cpu = t, cpu
    if len(rows) >= 6:
        third = len(rows) // 3
        first = sum(r[1] + r[2] for r in rows[1 : third + 1]) / third
        last = sum(r[1] + r[2] for r in rows[-third:]) / third
        # After the first row: bpftrace's start (compiling, attaching) is not the steady cost.
        cpu_pct = 100 * (rows[-1][3] - rows[0][3]) / (rows[-1][0] - rows[0][0])
        print(f"\nRSS first third {first:.1f} MiB, last third {last:.1f} MiB "
              f"({'flat' if last <= 1.1 * first else 'GROWING'}); CPU {cpu_pct:.2f} % of one CPU "
              f"({'within' if cpu_pct < 1 else 'over'} the 1 % budget)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
