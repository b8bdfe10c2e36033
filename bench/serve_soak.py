"""Soak of `pgprobe serve`: memory and CPU of the agent and each tracer over a long run.

    .venv/bin/python -m bench.serve_soak [--minutes 10] [--window 10] [-F 19] [--rate 300]

A throwaway cluster under pgbench -c 8 at a fixed rate (TPC-B-like, --rate
transactions per second), `pgprobe serve` at its defaults against it, and every
--every seconds, per process (the agent; each tracer by its script): RSS, PSS (the
shared pages of libLLVM and libclang divided among the processes that map them),
private anonymous memory, and the kernel memory of its BPF maps (memlock, from
/proc/PID/fdinfo, each map once); its CPU seconds (the agent's user and sys apart,
and what its reaped tracers took) and what it wrote (a tracer: its map prints);
plus the CPU share of agent + tracers since the last sample (one CPU = 100 %),
/metrics' windows and lost events. Prints per process the start (first sample,
after start-up), end and max, and the verdict: memory flat when the last third's
mean is within 10 % of the first third's; then per minute the CPU of each process
(a rise shows in whoever does more work per window). A process's CPU seconds are
its own on a shared machine too; the shares of a whole machine mean something on a
quiet one only.
"""

from __future__ import annotations

import argparse
import glob
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import common
from pgprobe.sandbox import PgCluster, free_port

MEMORY_FIELDS = ("rss", "pss", "anon", "bpf")  # MiB


def memory_mib(pid: int) -> dict[str, float]:
    """RSS, PSS, private anonymous memory and BPF map memory (memlock) of a process."""
    out = dict.fromkeys(MEMORY_FIELDS, 0.0)
    names = {"Rss": "rss", "Pss": "pss", "Anonymous": "anon"}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key = line.split(":")[0]
                if key in names:
                    out[names[key]] = int(line.split()[1]) / common.KIB_PER_MIB
    except OSError:
        return out
    out["bpf"] = sum(bpf_maps(pid).values()) / 2**20
    return out


def bpf_maps(pid: int) -> dict[int, int]:
    """map id -> kernel memory of the BPF maps the process holds open (memlock, bytes).

    From /proc/PID/fdinfo: each map once, however many descriptors point at it.
    """
    maps: dict[int, int] = {}
    for path in glob.glob(f"/proc/{pid}/fdinfo/*"):
        try:
            with open(path) as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if "map_id" in fields and "memlock" in fields:
            maps[int(fields["map_id"])] = int(fields["memlock"])
    return maps


def cpu_times(pid: int) -> dict[str, float]:
    """CPU seconds of a process: user, sys, and what its reaped children took (reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return {"user": 0.0, "sys": 0.0, "reaped": 0.0}
    fields = text[text.rfind(")") + 2 :].split()  # fields[11:15]: utime stime cutime cstime
    ticks = [int(v) / common.CLK_TCK for v in fields[11:15]]
    return {"user": ticks[0], "sys": ticks[1], "reaped": ticks[2] + ticks[3]}


def written_kib(pid: int) -> float:
    """KiB the process has written (a tracer: its map prints, to the agent's pipe)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tracer_name(pid: int) -> str:
    scripts = [a for a in common.cmdline(pid) if a.endswith(".bt")]
    return Path(scripts[0]).stem if scripts else common.comm(pid)


def metric(port: int, name: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return float("nan")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name))  # fmt: skip


def start_agent(pg: PgCluster, port: int, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "serve", *pg.conn_args, "--listen",
         f"127.0.0.1:{port}", *args],
        cwd=common.RUN_DIR,
    )  # fmt: skip


def wait_all_up(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(port, "pgprobe_capture_up") >= 4 and metric(port, "pgprobe_capture_windows") > 0:
            return
        time.sleep(1)
    common.log("soak: not every capture came up")


def soak(pg: PgCluster, minutes: float, every: float, agent_args: list[str]) -> dict[str, Any]:
    port = free_port()
    agent = start_agent(pg, port, *agent_args)
    samples: list[dict[str, Any]] = []
    try:
        wait_all_up(port)
        started = time.monotonic()
        cpu0 = last_cpu = common.tree_cpu_s([agent.pid])
        last_t = 0.0
        last_times: dict[int, dict[str, float]] = {}  # pid -> cpu_times, wchar at the last sample
        last_times[agent.pid] = cpu_times(agent.pid)
        for child in common.children(agent.pid):
            last_times[child] = {**cpu_times(child), "out": written_kib(child)}
        while time.monotonic() - started < minutes * 60:
            time.sleep(every)
            t = time.monotonic() - started
            cpu = common.tree_cpu_s([agent.pid])
            procs = {"agent": memory_mib(agent.pid)}
            times = {agent.pid: cpu_times(agent.pid)}
            names = {agent.pid: "agent"}
            for child in common.children(agent.pid):
                names[child] = tracer_name(child)
                procs[names[child]] = memory_mib(child)
                times[child] = {**cpu_times(child), "out": written_kib(child)}
            # Per process, over this sample: CPU seconds user / sys, KiB written (a tracer's
            # prints); a tracer started since the last sample counts from its start, and the
            # agent's "reaped" is what the tracers that ended took.
            cpu_by = {names[pid]: {k: v - last_times.get(pid, {}).get(k, 0.0)
                                   for k, v in now.items()}
                      for pid, now in times.items()}  # fmt: skip
            samples.append({
                "t_s": round(t, 1), "procs": procs, "cpu_s": cpu_by,
                "cpu_pct": 100 * (cpu - last_cpu) / (t - last_t),
                "windows": metric(port, "pgprobe_capture_windows_total"),
                "lost": metric(port, "pgprobe_capture_lost_events_total"),
                "restarts": metric(port, "pgprobe_capture_restarts_total"),
            })  # fmt: skip
            last_t, last_cpu, last_times = t, cpu, times
            total = sum(p["rss"] for p in procs.values())
            common.log(f"soak: {t:.0f} s, RSS {total:.1f} MiB, CPU {samples[-1]['cpu_pct']:.2f} %"
                       + "".join(f", {n} {c['user'] + c['sys']:.2f} s"
                                 for n, c in cpu_by.items()))  # fmt: skip
        cpu_total = common.tree_cpu_s([agent.pid]) - cpu0
        elapsed = time.monotonic() - started
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
    return {"samples": samples, "cpu_pct": 100 * cpu_total / elapsed, "elapsed_s": elapsed}


def cpu_by_minute(samples: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: per minute, the CPU of the agent (user, sys) and of each tracer, in %
    of one CPU, and what the tracers wrote (their map prints), KiB/s."""
    minutes: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in samples:
        minutes[int((s["t_s"] - 1) // 60)].append(s)
    names = sorted({n for s in samples for n in s["cpu_s"] if n != "agent"})
    lines = ["| minute | agent user % | agent sys % | " + " | ".join(f"{n} %" for n in names)
             + " | reaped % | tracers' prints KiB/s |",
             "|---:|---:|---:|" + "---:|" * (len(names) + 2)]  # fmt: skip
    last_t = 0.0
    for minute, group in sorted(minutes.items()):
        span = group[-1]["t_s"] - last_t
        last_t = group[-1]["t_s"]

        def total(name: str, key: str, group: list[dict[str, Any]] = group) -> float:
            return sum(float(s["cpu_s"].get(name, {}).get(key, 0.0)) for s in group)

        def pct(seconds: float, span: float = span) -> str:
            return f"{100 * seconds / span:.2f}"

        tracers = [pct(total(n, "user") + total(n, "sys")) for n in names]
        out = sum(total(n, "out") for n in names) / span
        lines.append(f"| {minute + 1} | {pct(total('agent', 'user'))} | "
                     f"{pct(total('agent', 'sys'))} | {' | '.join(tracers)} | "
                     f"{pct(total('agent', 'reaped'))} | {out:.1f} |")  # fmt: skip
    return lines


def summary(result: dict[str, Any]) -> list[str]:
    """Markdown lines: per process and memory kind, start / end / max, and the verdicts."""
    samples = result["samples"]
    series: dict[tuple[str, str], list[float]] = defaultdict(list)
    for s in samples:
        for name, mem in s["procs"].items():
            for kind in MEMORY_FIELDS:
                series[name, kind].append(mem[kind])
    lines = ["| process | memory (MiB) | start | end | max | last third / first third |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    flat = True
    for (name, kind), values in sorted(series.items()):
        third = max(1, len(values) // 3)
        first, last = sum(values[:third]) / third, sum(values[-third:]) / third
        ratio = last / first if first else 1.0
        if kind in ("rss", "anon"):
            flat = flat and ratio <= 1.10
        lines.append(f"| {name} | {kind} | {values[0]:.1f} | {values[-1]:.1f} | "
                     f"{max(values):.1f} | {ratio:.3f} |")  # fmt: skip
    last = samples[-1]
    lines.append("")
    if "cpu_s" in samples[0]:
        lines += cpu_by_minute(samples)
        lines.append("")
    lines.append(
        f"{len(samples)} samples over {result['elapsed_s'] / 60:.1f} min; memory "
        f"{'flat' if flat else 'GROWING'} (RSS and anonymous memory, last third within 10 % "
        f"of the first); CPU of agent + tracers {result['cpu_pct']:.2f} % of one CPU; "
        f"{last['windows']:.0f} windows, {last['lost']:.0f} lost events, "
        f"{last['restarts']:.0f} tracer restarts"
    )
    return lines


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser("bench.serve_soak", description=__doc__, formatter_class=raw)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("-F", dest="hz", type=int, default=19)
    parser.add_argument("--rate", type=int, default=300, help="pgbench transactions per second")
    parser.add_argument("--json", type=Path, help="also write the samples here")
    args = parser.parse_args()
    with PgCluster(name="pgprobe-soak") as pg:
        pg.pgbench("-i", "-q", "-s", "10").communicate(timeout=600)
        seconds = int(args.minutes * 60) + 180
        load = pg.pgbench("-c", "8", "-j", "2", "-R", str(args.rate), "-T", str(seconds))
        try:
            result = soak(pg, args.minutes, args.every,
                          ["--window", str(args.window), "-F", str(args.hz)])  # fmt: skip
        finally:
            load.kill()
            load.wait()
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print("\n".join(summary(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
