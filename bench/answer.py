"""Time to answer: the wall clock and CPU of `pgprobe TOOL -d 1`, phase by phase.

A throwaway cluster (or the caller's) gets N idle connections (one process holds them) and M
active clients (`pgbench -S`), then each tool runs with PGPROBE_TIMINGS=1, which makes pgprobe
print its phase marks on stderr (pgprobe/timings.py). Each run gives the whole command's wall
clock, its CPU (pgprobe and the tracers it waited for, from wait4), and per phase the wall and
CPU seconds since the previous mark.

    python -m bench.answer --idle 1000 --active 32 --repeat 3 flame lwlocks
    python -m bench.answer --json ...        # the dicts measure() returns

Wall times on a shared machine are noisy: compare CPU and the phase breakdown, and repeat.

Each checkout's modules are byte-compiled first (as pip does when it installs pgprobe):
with PYTHONDONTWRITEBYTECODE set, as in this project's shells, every run would otherwise
compile pgprobe's ~75 modules from source, 0.05-0.1 s of CPU counted as "imports".
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RUN_DIR
from pgprobe import timings
from pgprobe.sandbox import PgCluster

DURATION_S = 1
D = ["-d", str(DURATION_S)]
BPFTRACE = ["--engine", "bpftrace"]  # a tool's script rather than its compiled object
# the frame-pointer sampler rather than perf (auto picks perf where a library lacks frame
# pointers, as on Debian's 15): bpf/profile.bpf.c compiled, or profile.bt
FLAME_FP = ["flame", *D, "--unwind", "fp", "-o", "{out}.svg"]
# the USDT source without its guard (a loaded server passes it): bpf/lwlock_wait.bpf.c
# compiled, or the script
LWLOCKS_USDT = ["lwlocks", *D, "--source", "usdt", "--max-events-per-sec", "0"]
# The argv after `pgprobe` for each tool, without the connection options; {out} is a scratch
# file for tools that write one.
TOOLS: dict[str, list[str]] = {
    "flame": ["flame", *D, "-o", "{out}.svg"],
    "flame-fp": FLAME_FP,
    "flame-fp-bpftrace": [*FLAME_FP, *BPFTRACE],
    "lwlocks": ["lwlocks", *D],
    "lwlocks-usdt": LWLOCKS_USDT,
    "lwlocks-usdt-bpftrace": [*LWLOCKS_USDT, *BPFTRACE],
    "waits": ["waits", *D],
    "clog-reads": ["clog-reads", *D],
    "clog-reads-bpftrace": ["clog-reads", *D, *BPFTRACE],
    "triage": ["triage", *D, "-o", "{out}.html"],
    "hot": ["hot", *D],
    "locks": ["locks", *D],
    "queries": ["queries", *D],
}
# A run's uprobes are removed after it answers, in the background (bpftrace, or the compiled
# object's last holder: ~0.1 s a USDT site); the next run starts once that is over, as a
# user's next command would, not within it (the two contend for the kernel's uprobe lock:
# lwlocks --source usdt's attach took 0.74 s instead of 0.34 back to back).
SETTLE_S = 1.5
BUDGET_S = {5: 1.5, 1000: 2.5}  # issue 16: -d 1 wall with that many backends


@dataclass(frozen=True)
class Backends:
    idle: int = 5
    active: int = 0

    @property
    def label(self) -> str:
        return f"{self.idle} idle + {self.active} active"


@contextlib.contextmanager
def throwaway_cluster(backends: Backends) -> Iterator[PgCluster]:
    """A cluster sized for the backends, with pgbench's tables (scale 1)."""
    settings = {"max_connections": str(backends.idle + backends.active + 20)}
    with PgCluster(settings=settings, name="pgprobe-answer") as cluster:
        init = cluster.pgbench("-i", "-q", "-s", "1")
        out, _ = init.communicate()
        if init.returncode != 0:
            raise RuntimeError(f"pgbench -i failed: {out[-500:]}")
        yield cluster


@contextlib.contextmanager
def open_backends(cluster: PgCluster, backends: Backends) -> Iterator[None]:
    """backends.idle idle connections and backends.active pgbench -S clients, while inside."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = backends.idle + 256
    if soft < wanted <= hard or hard == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    idle = [cluster.connect(application_name="answer-idle") for _ in range(backends.idle)]
    bench = None
    if backends.active:
        bench = cluster.pgbench("-n", "-S", "-c", str(backends.active), "-j", "2", "-T", "3600")
        time.sleep(2)  # the clients connect and reach their steady state (not a measured path)
    try:
        yield
    finally:
        if bench is not None:
            bench.terminate()
            bench.communicate()
        for conn in idle:
            conn.close()


def run_tool(
    cluster: PgCluster, tool: str, cprofile: Path | None = None, run_dir: Path = RUN_DIR
) -> dict[str, Any]:
    """One `pgprobe TOOL -d 1` run: wall, CPU and the phases of its PGPROBE_TIMINGS marks.

    run_dir: the checkout whose pgprobe runs (its cwd: `python -m pgprobe` imports it).
    """
    with tempfile.TemporaryDirectory(prefix="pgprobe-answer-") as scratch:
        args = [a.format(out=f"{scratch}/out") for a in TOOLS[tool]]
        python = [sys.executable]
        if cprofile is not None:
            python += ["-m", "cProfile", "-o", str(cprofile / f"{tool}-{time.time_ns()}.prof")]
        argv = [*python, "-m", "pgprobe", *args, *cluster.conn_args]
        env = {**os.environ, "PGPROBE_TIMINGS": "1"}
        started = time.monotonic()
        child = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=run_dir,
            env=env,
            start_new_session=True,  # as a DBA's shell: not the session of the server and pgbench
        )
        assert child.stderr is not None
        err = child.stderr.read().decode(errors="replace")
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.monotonic() - started
    marks = timings.parse(err)
    phases: list[dict[str, Any]] = []
    last_wall, last_cpu = 0.0, 0.0
    for phase, at_wall, at_cpu in marks:
        phases.append(
            {
                "phase": phase,
                "wall_s": round(at_wall - last_wall, 4),
                "cpu_s": round(at_cpu - last_cpu, 4),
                "at_s": at_wall,
            }
        )
        last_wall, last_cpu = at_wall, at_cpu
    others = [ln for ln in err.splitlines() if not ln.startswith(timings.PREFIX)]
    return {
        "tool": tool,
        "exit": os.waitstatus_to_exitcode(status),
        "wall_s": round(wall, 4),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 4),
        # the largest resident set of pgprobe and the tracers it waited for (not their sum)
        "max_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "phases": phases,
        "stderr": others[-5:],
    }


def measure(
    cluster: PgCluster | None,
    tools: Sequence[str],
    backends: Backends,
    repeat: int = 3,
    cprofile: Path | None = None,
    run_dirs: Sequence[Path] = (RUN_DIR,),
) -> list[dict[str, Any]]:
    """Each tool `repeat` times on `cluster` (None: a throwaway one), interleaved across tools
    and across run_dirs (checkouts to compare, e.g. before and after a change)."""
    unknown = [t for t in tools if t not in TOOLS]
    if unknown:
        raise ValueError(f"unknown tools {unknown}: choose from {sorted(TOOLS)}")
    for run_dir in run_dirs:
        compileall.compile_dir(run_dir / "pgprobe", quiet=1)
    with contextlib.ExitStack() as stack:
        if cluster is None:
            cluster = stack.enter_context(throwaway_cluster(backends))
        stack.enter_context(open_backends(cluster, backends))
        results = []
        for i in range(repeat):
            for tool in tools:
                for run_dir in run_dirs:
                    time.sleep(SETTLE_S)
                    result = run_tool(cluster, tool, cprofile, run_dir)
                    result.update(
                        run=i, idle=backends.idle, active=backends.active, code=str(run_dir)
                    )
                    results.append(result)
        return results


def summarize(results: list[dict[str, Any]]) -> str:
    """A text table: per tool, median wall and CPU, and each phase's median wall / CPU."""
    lines = []
    for tool, code in dict.fromkeys((r["tool"], r["code"]) for r in results):
        runs = [r for r in results if r["tool"] == tool and r["code"] == code]
        walls = [r["wall_s"] for r in runs]
        cpus = [r["cpu_s"] for r in runs]
        exits = sorted({r["exit"] for r in runs})
        lines.append(
            f"{tool} [{code}] ({runs[0]['idle']} idle + {runs[0]['active']} active, "
            f"{len(runs)} runs, exit {exits}): wall {statistics.median(walls):.2f} s "
            f"[{min(walls):.2f}-{max(walls):.2f}], CPU {statistics.median(cpus):.2f} s, "
            f"max RSS {statistics.median(r.get('max_rss_mib', 0.0) for r in runs):.0f} MiB"
        )
        phases: dict[str, list[tuple[float, float]]] = {}
        for r in runs:
            for p in r["phases"]:
                phases.setdefault(p["phase"], []).append((p["wall_s"], p["cpu_s"]))
        for name, values in phases.items():
            wall = statistics.median(v[0] for v in values)
            cpu = statistics.median(v[1] for v in values)
            lines.append(f"    {name:<24} wall {wall:6.3f} s  CPU {cpu:6.3f} s")
        for r in runs:
            if r["exit"] != 0:
                lines.append(f"    run {r['run']} exit {r['exit']}: {' / '.join(r['stderr'])}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.answer", description=__doc__)
    parser.add_argument("tools", nargs="*", default=["flame", "lwlocks", "waits", "clog-reads"])
    parser.add_argument("--idle", type=int, default=5, help="idle connections (default 5)")
    parser.add_argument("--active", type=int, default=0, help="pgbench -S clients (default 0)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print measure()'s dicts")
    parser.add_argument("--cprofile", type=Path, help="also write a cProfile file per run here")
    parser.add_argument(
        "--code",
        type=Path,
        action="append",
        help="run the pgprobe of this checkout (repeatable, to compare; default: this one)",
    )
    args = parser.parse_args(argv)
    if args.cprofile is not None:
        args.cprofile.mkdir(parents=True, exist_ok=True)
    results = measure(
        None,
        args.tools,
        Backends(args.idle, args.active),
        args.repeat,
        args.cprofile,
        [p.resolve() for p in args.code] if args.code else [RUN_DIR],
    )
    print(json.dumps(results, indent=1) if args.json else summarize(results))
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
