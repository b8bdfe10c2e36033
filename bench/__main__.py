"""`scripts/bench`: everything the open issues ask to be measured, in one run.

    sudo scripts/bench --full     # the quiet-machine run: about 33 minutes
    sudo scripts/bench --quick    # smoke test of every part with tiny sizes (~8 minutes)

Overhead of each tool as TPS ratios with 95 % intervals (bench/overhead.py, the plan in
bench/configs.py and bench/plan.py), per-fire costs (kernel BPF statistics per program,
bench/probe_cost.py), the dwarf capture's finish time, lwlocks under heavy contention,
time to answer (bench/answer.py) and `pgprobe serve` (fleet2's measure(); see
bench/hooks.py), render and symbolize speed. The run is written to docs/benchmarks.json,
and docs/benchmarks.md and docs/overhead.md's Overhead table are rendered from it
(bench/report.py). A report, not a gate: the exit status is 0 unless the bench fails.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import (
    bpfstats,
    common,
    configs,
    hooks,
    overhead,
    plan,
    probe_cost,
    render,
    report,
    results,
    symbolize,
)
from pgprobe.sandbox import PgCluster

QUIET_LOAD = 0.7
BOX_MIN = 33.0
QUICK_PAIRS = 2
QUICK_SECONDS = 3
QUICK_LONG_S = 5
SERVE_PAIRS, SERVE_SECONDS = 6, 8
DEADLINE_SLACK = 1.1  # a workload may overrun its planned time by this factor, no more


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--full", action="store_true", help="the full run (the default)")
    mode.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK_PAIRS} pairs of {QUICK_SECONDS} s windows per row, "
        "tiny sizes everywhere",
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=BOX_MIN,
        help=f"time box the window length is chosen for (default {BOX_MIN:g})",
    )
    parser.add_argument("--seconds", type=int, help="window length (default: fits the box)")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="MINUTES",
        help=f"first wait up to MINUTES for a quiet machine (1-min load < "
        f"{QUIET_LOAD}, no other pgbench/bpftrace/perf)",
    )
    parser.add_argument("--workloads", help="select,tpcb,contention (default: all three)")
    parser.add_argument("--tools", help="configuration keys to keep (clog-reads,waits,...)")
    parser.add_argument(
        "--perf",
        action="store_true",
        help="also the perf record -F 99 -g anchor (3 pairs per workload)",
    )
    for part in ("overhead", "probe-cost", "render", "symbolize", "answer", "serve"):
        parser.add_argument(f"--no-{part}", action="store_true", help=f"skip {part}")
    parser.add_argument(
        "--json",
        type=Path,
        default=common.REPO / "docs" / "benchmarks.json",
        help="the run's results (default docs/benchmarks.json)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=common.REPO / "docs" / "benchmarks.md",
        help="the page rendered from them (default docs/benchmarks.md)",
    )
    parser.add_argument(
        "--overhead-page",
        type=Path,
        default=common.REPO / "docs" / "overhead.md",
        help="whose Overhead table to rewrite (default docs/overhead.md)",
    )
    return parser.parse_args(argv)


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


def entries(args: argparse.Namespace) -> list[plan.Entry]:
    """The (workload, configuration, pairs) of this run, from the profile and the filters."""
    keys = (args.workloads or ",".join(configs.PROFILE)).split(",")
    tools = set(args.tools.split(",")) if args.tools else None
    out = []
    for workload in keys:
        rows = list(configs.PROFILE.get(workload, ()))
        if args.perf:
            rows.append((configs.PERF_CONFIG.key, configs.PAIRS_COMPARISON))
        for key, pairs in rows:
            if tools is None or key in tools:
                out.append(plan.Entry(workload, key, QUICK_PAIRS if args.quick else pairs))
    return out


def fixed_seconds(args: argparse.Namespace) -> float:
    parts = {
        "probe_cost": plan.PROBE_COST_S,
        "symbolize": plan.SYMBOLIZE_S,
        "render": plan.RENDER_S,
        "answer": plan.ANSWER_S,
        "serve": plan.SERVE_S,
    }
    return plan.SETUP_S + sum(v for k, v in parts.items() if not getattr(args, f"no_{k}"))


def make_plan(args: argparse.Namespace, chosen: list[plan.Entry]) -> tuple[int, float, int]:
    """(window seconds, planned total seconds, long capture seconds), and say so."""
    long_s = QUICK_LONG_S if args.quick else configs.LONG_CAPTURE[2]
    if not any(
        e.workload == configs.LONG_CAPTURE[0] and e.config == configs.LONG_CAPTURE[1]
        for e in chosen
    ):
        long_s = 0
    fixed = fixed_seconds(args)
    if args.seconds:
        seconds = args.seconds
    elif args.quick:
        seconds = QUICK_SECONDS
    else:
        seconds = plan.choose_seconds(chosen, fixed, args.minutes * 60, long_capture_s=long_s)
    over = 0.0 if args.no_overhead else plan.overhead_seconds(chosen, seconds, long_s)
    total = fixed + over
    common.log(
        f"plan: windows of {seconds} s, about {total / 60:.1f} min in all "
        f"({over / 60:.1f} min of pgbench windows)"
    )
    for e in chosen:
        hw = plan.expected_half_width_pct(e.pairs, seconds)
        resolves = f"expected to resolve ±{hw:.1f} %" if hw else "no interval"
        common.log(f"  {e.workload:<10} {e.config:<20} {e.pairs:>2} pairs, {resolves}")
    return seconds, total, long_s


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("scripts/bench: run as root (it runs bpftrace and perf)")
    loadavg_before = common.loadavg()
    quiet = wait_quiet(args.wait_quiet)
    if args.wait_quiet > 0:
        loadavg_before = common.loadavg()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="pgprobe-bench-") as tmp:
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)
        (workdir / "src").mkdir()
        source = common.snapshot_source(workdir / "src")
        common.log(f"running {source}, copied to {workdir / 'src'}")
        meta = {
            "started": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "mode": "quick" if args.quick else "full",
            "command": "scripts/bench " + " ".join(sys.argv[1:] if argv is None else argv),
            "loadavg_before": loadavg_before,
            "quiet": quiet,
            "source": source,
            "box_min": args.minutes,
        }
        doc = _run(args, meta, started, workdir)
    results.save(args.json, doc)
    report.write_benchmarks(args.output, doc)
    readme = report.write_overhead_page(args.overhead_page, doc)
    common.log(
        f"\nwrote {args.json}, {args.output}"
        + (f" and the Overhead table of {args.overhead_page}" if readme else "")
        + f" ({doc['elapsed_min']:.1f} min)"
    )
    for b in doc["budgets"]:
        common.log(f"  {b['verdict']:<9} {b['what']}: {b['measured']} (budget {b['limit']})")
    return 0


def _run(args: argparse.Namespace, meta: dict[str, Any], started: float, workdir: Path) -> Any:
    chosen = entries(args)
    available, notes = configs.choose(
        list(dict.fromkeys(e.config for e in chosen)), with_perf=args.perf
    )
    for note in notes:
        common.log(f"note: {note}")
    chosen = [e for e in chosen if e.config in available]
    seconds, planned, long_s = make_plan(args, chosen)
    settings = {"max_wal_size": "'8GB'", "checkpoint_timeout": "'30min'"}
    cluster = PgCluster(settings=settings, name="pgprobe-bench")
    meta.update(
        machine=common.machine_info(cluster.bindir / "postgres"),
        seconds=seconds,
        notes=notes,
        planned_min=round(planned / 60, 1),
        plan=[{"workload": e.workload, "config": e.config, "pairs": e.pairs} for e in chosen],
    )
    sym = pc = rend = None
    workloads: list[overhead.WorkloadResult] = []
    summaries: list[overhead.Summary] = []
    serve: dict[str, Any] | None = None
    with cluster, bpfstats.BpfStats() as stats:
        if not stats.enabled:
            notes.append(f"BPF run-time statistics unavailable: {stats.error}")
        common.log(f"cluster at {cluster.root} (port {cluster.port}); pgbench -i -s 2")
        init = cluster.pgbench("-i", "-q", "-s", "2")
        out, _ = init.communicate(timeout=600)
        if init.returncode != 0:
            raise SystemExit(f"pgbench -i failed: {out}")
        if not args.no_symbolize:
            with cluster.connect() as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
                assert row is not None
                common.log("symbolize: raw stacks...")
                sym = symbolize.run(int(str(row[0])), stacks=10_000 if args.quick else 100_000)
        if not args.no_probe_cost:
            common.log(
                "probe cost: uprobe and tracepoint per fire, context switch under waits.bt..."
            )
            pc = probe_cost.run(
                rounds=2 if args.quick else probe_cost.ROUNDS,
                switch_rounds=1 if args.quick else probe_cost.SWITCH_ROUNDS,
            )
            for m in pc.mechanisms:
                common.log(f"  {m.name}: {m.ns_per_fire} ns/fire")
            common.log("  ns per context switch: floor, filter, waits.bt")
            for line in probe_cost.switch_lines(pc.switches):
                common.log(f"    {line}")
        if not args.no_render:
            common.log("render: stacks to SVG...")
            rend = render.run(workdir, runs=2 if args.quick else 3)
            notes.extend(rend.notes)
        if not args.no_overhead and chosen:
            tracers = {k: overhead.Tracer(c, cluster, workdir) for k, c in available.items()}
            workload_keys = list(dict.fromkeys(e.workload for e in chosen))
            for key in workload_keys:
                workload = next(w for w in configs.WORKLOADS if w.key == key)
                mine = [(available[e.config], e.pairs) for e in chosen if e.workload == key]
                new = sum(1 for c, _ in mine if not tracers[c.key].attach_seen)
                budget_s = plan.workload_seconds(
                    [plan.Entry(key, c.key, n) for c, n in mine], seconds, new
                )
                long_capture = None
                if key == configs.LONG_CAPTURE[0] and long_s:
                    long_capture = (configs.LONG_CAPTURE[1], long_s)
                common.log(f"overhead: {workload.label} (about {budget_s / 60:.1f} min)")
                result = overhead.run_workload(
                    cluster,
                    workload,
                    mine,
                    seconds,
                    plan.WARMUP_S,
                    tracers,
                    deadline=time.time() + DEADLINE_SLACK * budget_s,
                    long_capture=long_capture,
                )
                workloads.append(result)
                summaries.extend(overhead.summarize(result, [c for c, _ in mine]))
        if not args.no_serve:
            common.log("serve: pgprobe serve at its default rates (fleet2's measure())...")
            pairs = QUICK_PAIRS if args.quick else SERVE_PAIRS
            serve = hooks.run_serve(
                cluster, pairs, seconds if args.quick else SERVE_SECONDS, args.quick
            )
            common.log(f"  serve: {serve['status']} {serve.get('note', '')}")
    answer = None
    if not args.no_answer:
        common.log("time to answer: -d 1 at 5 and 1,000 + 32 backends (bench/answer.py)...")
        answer = hooks.run_answer(args.quick)
        common.log(f"  answer: {answer['status']} {answer.get('note', '')}")
    meta["elapsed_min"] = round((time.time() - started) / 60, 1)
    return results.document(meta, workloads, summaries, pc, rend, sym, answer, serve)


if __name__ == "__main__":
    raise SystemExit(main())
