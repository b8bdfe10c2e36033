"""`scripts/bench`: measure pgprobe's overhead, start and finish times, memory, render and
symbolize speed on a throwaway cluster, write docs/benchmarks.md, and say which budgets
were missed (a report, not a gate: the exit status is 0 unless the bench itself fails).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
import time
from pathlib import Path

from bench import common, overhead, probe_cost, render, report, symbolize
from pgprobe.sandbox import PgCluster

QUIET_LOAD = 0.7
SETUP_S = 20.0
RENDER_SYMBOLIZE_S = 45.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 pair of 3 s windows, TPC-B only (~2 minutes)",
    )
    parser.add_argument("--pairs", type=int, help="pairs per tool and workload (default 5)")
    parser.add_argument(
        "--seconds", type=int, help="window length (default: the longest of 4-10 s that fits)"
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=17.0,
        help="time to plan the full run for when choosing the window length (default 17)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="MINUTES",
        help=f"first wait up to MINUTES for a quiet machine (1-min load < {QUIET_LOAD}, no "
        "other pgbench/bpftrace/perf), checking every minute",
    )
    parser.add_argument("--tools", help="comma-separated configuration keys (lwlocks,flame-99,...)")
    parser.add_argument(
        "--workloads", help="tpcb,select (default: both; --quick: tpcb, which has LWLock waits)"
    )
    parser.add_argument("--no-perf", action="store_true", help="skip the perf record anchor")
    parser.add_argument("--no-overhead", action="store_true", help="skip the pgbench rounds")
    parser.add_argument("--no-render", action="store_true", help="skip the render benchmark")
    parser.add_argument("--no-symbolize", action="store_true", help="skip symbolizing")
    parser.add_argument(
        "--no-probe-cost", action="store_true", help="skip the per-fire mechanism cost"
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=common.REPO / "docs" / "benchmarks.md",
        help="where to write the results (default docs/benchmarks.md)",
    )
    return parser.parse_args()


def wait_quiet(minutes: float) -> str:
    """Wait for a quiet machine; say what happened."""
    if minutes <= 0:
        return "The bench did not wait for a quiet machine (--wait-quiet 0)."
    started = time.time()
    while True:
        load = common.loadavg()[0]
        others = common.foreign_load_processes([os.getpid()])
        waited = (time.time() - started) / 60
        if load < QUIET_LOAD and not others:
            return (
                f"Waited {waited:.0f} min for a quiet machine (1-min load < {QUIET_LOAD}, "
                "no other pgbench/bpftrace/perf): it was quiet at the start."
            )
        if waited >= minutes:
            return (
                f"Waited {minutes:.0f} min for a quiet machine and it never was (1-min load "
                f"{load:.2f}; other processes: {', '.join(others) or 'none'}): ran anyway, "
                "so the figures carry other sessions' noise."
            )
        common.log(
            f"waiting for a quiet machine: load {load:.2f}, others: {', '.join(others) or 'none'}"
        )
        time.sleep(60)


def plan(args: argparse.Namespace, configs: int, workloads: int) -> tuple[int, int, float]:
    """(pairs, seconds per window, warm-up) and print the planned total."""
    pairs = args.pairs or (1 if args.quick else 5)
    warmup = 2.0 if args.quick else 5.0
    fixed = SETUP_S + RENDER_SYMBOLIZE_S * (0.5 if args.quick else 1.0)
    if args.seconds:
        seconds = args.seconds
    elif args.quick:
        seconds = 3
    else:
        seconds = 4
        for s in range(10, 3, -1):
            total = fixed + workloads * overhead.planned_seconds(configs, pairs, s, warmup)
            if total <= args.minutes * 60:
                seconds = s
                break
    per_workload = overhead.planned_seconds(configs, pairs, seconds, warmup)
    total = fixed + (0 if args.no_overhead else workloads * per_workload)
    common.log(
        f"plan: {configs} configurations x {pairs} pairs x {workloads} workloads, windows of "
        f"{seconds} s: about {total / 60:.1f} min in all ({per_workload / 60:.1f} min per "
        "workload, plus set-up, render and symbolize)"
    )
    return pairs, seconds, warmup


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        raise SystemExit("scripts/bench: run as root (it runs bpftrace and perf)")
    loadavg_before = common.loadavg()
    quiet = wait_quiet(args.wait_quiet)
    if args.wait_quiet > 0:
        loadavg_before = common.loadavg()
    started = time.time()
    tmp = tempfile.TemporaryDirectory(prefix="pgprobe-bench-")
    workdir = Path(tmp.name)
    os.chmod(workdir, 0o755)
    (workdir / "src").mkdir()
    source = common.snapshot_source(workdir / "src")
    common.log(f"running {source}, copied to {workdir / 'src'}")
    try:
        return _run(args, loadavg_before, quiet, started, workdir, source)
    finally:
        tmp.cleanup()


def _run(
    args: argparse.Namespace,
    loadavg_before: tuple[float, float, float],
    quiet: str,
    started: float,
    workdir: Path,
    source: str,
) -> int:
    configs, notes = overhead.choose_configs(with_perf=not args.no_perf)
    if args.tools:
        wanted = set(args.tools.split(","))
        configs = [c for c in configs if c.key in wanted]
    keys = (args.workloads or ("tpcb" if args.quick else "tpcb,select")).split(",")
    workloads = [w for w in overhead.WORKLOADS if w.key in keys]
    pairs, seconds, warmup = plan(args, len(configs), len(workloads))
    for note in notes:
        common.log(f"note: {note}")
    settings = {"max_wal_size": "'8GB'", "checkpoint_timeout": "'30min'"}
    cluster = PgCluster(settings=settings, name="pgprobe-bench")
    run = report.Run(
        started=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        mode="quick" if args.quick else "full",
        elapsed_min=0.0,
        machine=common.machine_info(cluster.bindir / "postgres"),
        loadavg_before=loadavg_before,
        quiet=quiet,
        pairs=pairs,
        seconds=seconds,
        notes=notes,
        source=source,
    )
    with cluster, common.BpfStats() as stats:
        if not stats.enabled:
            run.notes.append(f"BPF run-time statistics unavailable: {stats.error}")
        common.log(f"cluster at {cluster.root} (port {cluster.port}); pgbench -i -s 2")
        init = cluster.pgbench("-i", "-q", "-s", "2")
        out, _ = init.communicate(timeout=600)
        if init.returncode != 0:
            raise SystemExit(f"pgbench -i failed: {out}")
        if not args.no_symbolize:
            with cluster.connect() as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                common.log("symbolize: 100,000 raw stacks...")
                run.symbolize = symbolize.run(int(str(row[0])))
            common.log(f"  {run.symbolize}")
        if not args.no_probe_cost:
            common.log("probe cost: uprobe and syscall tracepoint, ns per fire...")
            run.probe_cost = probe_cost.run()
            for m in run.probe_cost.mechanisms:
                common.log(f"  {m.name}: {m.ns_per_fire} ns/fire")
        if not args.no_render:
            common.log("render: 50,000 stacks to SVG...")
            run.render = render.run(workdir, runs=3 if args.quick else 7)
            run.notes.extend(run.render.notes)
            common.log(
                f"  pgprobe flame --from: {run.render.command.wall} s, "
                f"{run.render.command.peak_rss} MiB"
            )
        if not args.no_overhead and configs:
            tracers = {c.key: overhead.Tracer(c, cluster, workdir) for c in configs}
            for workload in workloads:
                common.log(f"overhead: {workload.label}")
                result = overhead.run_workload(
                    cluster, workload, configs, pairs, seconds, warmup, tracers
                )
                run.workloads.append(result)
                run.summaries.extend(overhead.summarize(result, configs))
                tps = common.median(w.tps for w in result.untraced)
                if tps:
                    run.untraced_tps[workload.label] = tps
    run.elapsed_min = (time.time() - started) / 60
    report.write(args.output, run)
    common.log(f"\nwrote {args.output} ({run.elapsed_min:.1f} min)")
    for line in report.overhead_table(run):
        common.log(line)
    missed = [b for b in report.budgets(run) if b.verdict != "met"]
    if missed:
        common.log("\nbudgets missed or undecided:")
        for b in missed:
            common.log(f"  {b.what}: {b.measured} (budget {b.limit}): {b.verdict}")
    else:
        common.log("\nall budgets met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
