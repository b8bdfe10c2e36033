"""The compiled time model's cost on the server, fine enough to tell 0.98 from 0.985 (issue 14).
Kept in one module (~420 lines): one method, whose variants, windows, BPF statistics and
report share one Result and one Switcher; its arithmetic is tested apart (test_bench_toggle).

    python -m bench.toggle [--workload select|tpcb|many] [--protocol simple|extended|prepared]
                           [--minutes 10] [--window 1] [--no-floor] [--queries] [--locks]
                           [--modes]
                           [--cost-rounds 1] [--object OTHER.bpf.o ...] [--json FILE]

Why a method of its own. The main bench (bench/overhead.py) starts `pgprobe waits` for
each traced window of 10 s: with 30 such pairs the interval of the TPS ratio is still
about ±1.7 % wide on a 2-CPU VM, as wide as the budget's whole margin (an empty
sched_switch program measured 0.985 [0.968–1.003] that way). bpf/build/waits.bpf.o loads
once and attaches or detaches in under a millisecond, so its cost can be measured with
windows of a second or two, hundreds of them, where the machine's drift cannot follow.

Method. One pgbench load for the whole run, its throughput reported every second
(bench.overhead.Pgbench: -P 1 --progress-timestamp). Blocks of one window of ``--window``
seconds per variant, back to back, in a random order per block: nothing attached; an empty
program on the same tracepoint (bench/sched_empty.bpf.c: the floor, the tracepoint's
dispatch to a program; --no-floor leaves it out); the time model, loaded with the
parameters `pgprobe waits` gives it for this cluster (tools.waits.compiled.rodata); with
--queries, the same object loaded a second time with the query dimension on as well
("waits+queries": the globals of `pgprobe queries`, statement.StatementAddress.rodata,
keyed by query id: text_hash 0); any --object, another build of it (with --queries,
loaded with the query dimension on). Each window begins and
ends at one of pgbench's report boundaries, where the programs are swapped (by this
thread, at nice -10); a window whose swap came more than 10 ms late is left out, and
counted. Within a block, a ratio per variant against "nothing" (and the time model against
the floor); over the blocks, the geometric mean and its 95 % interval (bench.stats). What
`pgprobe waits` does beside its programs (the seed at the attach, the read at the end:
once per capture) is not in these windows. Then one window each with the kernel's BPF
statistics on (they cost two clock reads per run, so the TPS windows run without them):
fires/s of sched_switch and BPF ns per fire, every program's time (on_proc_exit's too) over
those fires (--cost-rounds N: N such rounds, the variants in turn; the medians).

With --locks, the same object loaded once more with the lock dimension on as well
("waits+locks": the globals of `pgprobe locks`, lockwait.LockAddress: each Lock sleep keyed
by its lock), and the report adds waits+locks against the time model without it, and the
Lock sleeps it charged to a lock (the reads it made).

With --queries the cluster runs with query ids, as a server `pgprobe queries` keys by id
does: shared_preload_libraries = 'pg_stat_statements' and compute_query_id = on (without
--queries neither, as before), and the report adds waits+queries against the time model
without it, and the share of @query_ns the object keyed by an id (a check that ids were
there to read). --protocol: pgbench's -M (default simple, pgbench's own).

Meaningful on a quiet machine only. Needs root, clang (scripts/build-bpf) and the object
built by scripts/setup. Results and what they say: docs/dev/benchmark-analyses.md ("waits
compiled: its TPS cost to half a percent"); with --queries, docs/benchmarks.md ("waits
compiled: the query dimension's TPS cost").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import bpfstats, common, stats
from bench.configs import MANY, SELECT, TPCB, Workload, many_statements
from bench.overhead import Pgbench
from pgprobe import discover
from pgprobe.engines import libbpf
from pgprobe.engines.libbpf import BpfObject
from pgprobe.sandbox import PgCluster
from pgprobe.tools.waits import compiled, lockdim, probe, querydim
from pgprobe.waitevents import address, lockwait, lwmode, statement

HERE = Path(__file__).resolve().parent
EMPTY = HERE / "build" / "sched_empty.bpf.o"
NONE, FLOOR, WAITS, QUERIES, LOCKS = "none", "empty", "waits", "waits+queries", "waits+locks"
MODES = "waits+modes"  # `pgprobe lwlocks`' time model: each LWLock sleep's mode read
VARIANTS = (NONE, FLOOR, WAITS, QUERIES, LOCKS, MODES)
QUERY_ID_SETTINGS = {"shared_preload_libraries": "'pg_stat_statements'", "compute_query_id": "on"}
BUDGET = 0.98  # issue 14: TPS ratio of `pgprobe waits`
WARMUP_S = 10
STATS_WINDOW_S = 10
SWAP_NICE = -10
LATE_S = 0.01  # a swap this long after its report boundary spoils the window


@dataclass
class Block:
    order: list[str]
    tps: dict[str, float] = field(default_factory=dict)

    def ratio(self, variant: str, base: str = NONE) -> float | None:
        b = self.tps.get(base)
        return self.tps[variant] / b if b and variant in self.tps else None


@dataclass
class Cost:
    """One variant's programs with the kernel's statistics on, over one window."""

    fires_per_s: float
    ns_per_fire: float
    switches_per_s: float


@dataclass
class Result:
    workload: str
    window_s: int
    seed: int
    blocks: list[Block] = field(default_factory=list)
    costs: dict[str, Cost] = field(default_factory=dict)  # medians over the rounds
    cost_rounds: dict[str, list[Cost]] = field(default_factory=dict)
    untraced_tps: list[float] = field(default_factory=list)
    late_windows: int = 0
    # waits+queries: ns of @query_ns's CPU time keyed by a query id, and in all (run's end)
    query_ns_with_id: int = 0
    query_ns_total: int = 0
    lock_sleeps: int = 0  # waits+locks: Lock sleeps charged to a lock, over the run

    def interval(self, variant: str, base: str = NONE) -> stats.Interval | None:
        ratios = [r for b in self.blocks if (r := b.ratio(variant, base)) is not None]
        return stats.ratio_interval(ratios)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["intervals"] = {
            f"{v}/{base}": {"mean": i.mean, "low": i.low, "high": i.high, "n": i.n}
            for v in {v for b in self.blocks for v in b.order} - {NONE}
            for base in (NONE, FLOOR, WAITS, QUERIES, LOCKS, MODES)
            if v != base and (i := self.interval(v, base)) is not None
        }
        return out


def build_floor() -> None:
    """bench/build/sched_empty.bpf.o, with the flags of pgprobe's own objects."""
    script = HERE.parent / "scripts" / "build-bpf"
    subprocess.run(["bash", str(script), str(HERE / "sched_empty.bpf.c")], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip


def waits_rodata(
    cluster: PgCluster, queries: bool = False, locks: bool = False, modes: bool = False
) -> tuple[dict[str, int], dict[str, int], dict[str, tuple[str, str]]]:
    """The time model's globals as `pgprobe waits` sets them for the whole cluster; with
    `queries`, also the query dimension's as `pgprobe queries` sets them on a server with
    query ids (text_hash 0), and its uprobe; with `locks`, the lock dimension's as
    `pgprobe locks` sets them; with `modes`, the LWLock modes' as `pgprobe lwlocks` does;
    else {}."""
    options = discover.ConnOptions(host=str(cluster.root), port=cluster.port, user="postgres")
    targets = discover.discover(options, discover.Filters())
    where = address.find(targets.cluster.postmaster_pid, targets.cluster.binary)
    waits = compiled.rodata(probe.script_args(targets, where, None))
    if modes:
        found_modes = lwmode.find(where, targets.cluster.major)
        if found_modes is None:
            raise SystemExit(f"bench.toggle: no MyProc offsets for {targets.cluster.major}")
        return waits, found_modes.rodata(), {}
    if locks:
        found_lock = lockwait.find(where, targets.cluster.major)
        if found_lock is None:
            raise SystemExit(f"bench.toggle: no MyProc offsets for {targets.cluster.major}")
        return waits, lockdim.Dimension(found_lock).rodata(), {}
    if not queries:
        return waits, {}, {}
    found = statement.address_of(where, targets.cluster.major)
    if found is None:
        raise SystemExit(f"bench.toggle: no statement address for {targets.cluster.major}")
    dimension = querydim.Dimension(found, False, targets.cluster.binary)
    return waits, dimension.rodata(), dimension.uprobes()


def workload_of(key: str, protocol: str) -> Workload:
    load = {"select": SELECT, "tpcb": TPCB, "many": MANY}[key]
    if protocol == "simple":
        return load
    return Workload(f"{load.key}-{protocol}", f"{load.label} -M {protocol}",
                    (*load.args, "-M", protocol))  # fmt: skip


def count_query_ns(obj: BpfObject, result: Result, cluster: PgCluster) -> None:
    """How much of @query_ns's CPU time the object keyed by a query id (0: a statement
    without one; the sleeps between transactions are keyed without one by design)."""
    options = discover.ConnOptions(host=str(cluster.root), port=cluster.port, user="postgres")
    pids = discover.discover(options, discover.Filters()).pids
    for (_tid, kind, state, _wei, qid), ns in compiled.query_totals(obj, pids).items():
        if kind != querydim.CPU or state & statement.SPANNED:
            continue  # SPANNED: counted beside the statement's own time, not in it
        result.query_ns_total += ns
        if qid:
            result.query_ns_with_id += ns


class Switcher:
    """Which variant's programs are attached: at most one at a time."""

    def __init__(self, objects: dict[str, BpfObject]) -> None:
        self.objects = objects
        self.current = NONE

    def to(self, variant: str) -> None:
        if variant == self.current:
            return
        if self.current != NONE:
            self.objects[self.current].detach()
        if variant != NONE:
            self.objects[variant].attach()
        self.current = variant


def run_blocks(bench: Pgbench, switch: Switcher, result: Result, deadline: float) -> None:
    """Blocks back to back until the deadline, each window's TPS read once all are reported.
    A window whose swap came late (this process kept from its CPU by the load) is left out:
    part of its first second ran with the programs of the window before."""
    rng = random.Random(result.seed)
    w = result.window_s
    variants = [NONE, *switch.objects]
    t = bench.next_boundary(time.time() + 0.05)  # pgbench reports on a 1 s schedule
    planned: list[tuple[Block, list[tuple[str, float]]]] = []
    while t + len(variants) * w < deadline:
        block = Block(order=rng.sample(variants, len(variants)))
        spans = []
        for i, variant in enumerate(block.order):
            common.sleep_until(t + i * w)
            switch.to(variant)
            if time.time() - (t + i * w) <= LATE_S:
                spans.append((variant, t + i * w))
            else:
                result.late_windows += 1
        planned.append((block, spans))
        t += len(variants) * w
        if len(planned) % 100 == 0:
            common.log(f"toggle: {len(planned)} blocks")
    common.sleep_until(t)
    switch.to(NONE)
    bench.wait_report(t - 0.5)
    for block, spans in planned:
        for variant, start in spans:
            window = bench.window(start + 1, start + w, not_before=start - 0.5)
            if window.intervals == w:
                block.tps[variant] = window.tps
        result.blocks.append(block)
        if NONE in block.tps:
            result.untraced_tps.append(block.tps[NONE])


def measure_costs(switch: Switcher, result: Result, rounds: int = 1) -> None:
    """Fires/s and BPF ns per fire of each variant, one window each per round (the order
    turned by one each round), statistics on; result.costs: the medians over the rounds."""
    with bpfstats.BpfStats() as on:
        if not on.enabled:
            common.log(f"toggle: no BPF statistics ({on.error})")
            return
        variants = list(switch.objects)
        for r in range(rounds):
            for variant in variants[r % len(variants) :] + variants[: r % len(variants)]:
                switch.to(variant)
                time.sleep(1)
                names: dict[int, str] = {}
                before, switches0 = bpfstats.programs(os.getpid(), names), common.context_switches()
                time.sleep(STATS_WINDOW_S)
                after, switches = bpfstats.programs(os.getpid(), names), common.context_switches()
                switch.to(NONE)
                # every program's time (the query dimension's on_proc_exit too) per switch-out
                runs = [p for p in bpfstats.delta(before, after) if p.runs]
                fires = sum(p.runs for p in runs if p.name == "on_switch")
                common.log(f"toggle: {variant}: " + ", ".join(
                    f"{p.name} {p.runs / STATS_WINDOW_S:,.0f}/s x {p.ns / p.runs:.0f} ns"
                    for p in runs))  # fmt: skip
                if fires:
                    ns = sum(p.ns for p in runs)
                    per_s = common.switches_per_s(switches0, switches)
                    cost = Cost(fires / STATS_WINDOW_S, ns / fires, per_s)
                    result.cost_rounds.setdefault(variant, []).append(cost)
    for variant, costs in result.cost_rounds.items():
        fields = ("fires_per_s", "ns_per_fire", "switches_per_s")
        result.costs[variant] = Cost(
            *(statistics.median(getattr(c, f) for c in costs) for f in fields)
        )


def measure(
    workload: str,
    minutes: float,
    window_s: int,
    scale: int,
    seed: int,
    others: list[Path],
    floor: bool = True,
    queries: bool = False,
    protocol: str = "simple",
    cost_rounds: int = 1,
    locks: bool = False,
    modes: bool = False,
) -> Result:
    """The blocks and the costs; `others`: more builds of the time model (a change to
    bpf/waits.bpf.c, say) as variants of their own, named by their files; without
    `floor`, no empty program (the blocks are shorter: more of them); `queries`: the time
    model with the query dimension too, on a cluster with query ids."""
    if floor:
        build_floor()
    path = compiled.object_path()
    if path is None:
        raise SystemExit("bench.toggle: bpf/build/waits.bpf.o is not built (scripts/build-bpf)")
    load = workload_of(workload, protocol)
    result = Result(workload=load.label, window_s=window_s, seed=seed)
    settings = {"max_wal_size": "'8GB'", "checkpoint_timeout": "'30min'"}
    if queries:
        settings.update(QUERY_ID_SETTINGS)
    with PgCluster(settings=settings, name="pgprobe-toggle") as cluster:
        cluster.pgbench("-i", "-q", "-s", str(scale)).communicate(timeout=600)
        if workload == "many":
            load = Workload(load.key, load.label, (*load.args, *many_statements(cluster.root)))
        rodata, query_rodata, uprobes = waits_rodata(cluster, queries)
        objects = {FLOOR: BpfObject(EMPTY, {})} if floor else {}
        objects[WAITS] = BpfObject(path, rodata, compiled.QUERY_PROGRAMS)  # as `pgprobe waits`
        if queries:
            objects[QUERIES] = BpfObject(path, {**rodata, **query_rodata}, uprobes=uprobes)
        if locks:  # as `pgprobe locks`
            lock_rodata = waits_rodata(cluster, locks=True)[1]
            objects[LOCKS] = BpfObject(path, {**rodata, **lock_rodata}, compiled.QUERY_PROGRAMS)
        if modes:  # as `pgprobe lwlocks`
            mode_rodata = waits_rodata(cluster, modes=True)[1]
            objects[MODES] = BpfObject(path, {**rodata, **mode_rodata}, compiled.QUERY_PROGRAMS)
        # with --queries, another build is one of the query dimension's (loaded as such)
        other = {**rodata, **query_rodata} if queries else rodata
        off = frozenset() if queries else compiled.QUERY_PROGRAMS
        for o in others:  # an older build: only the globals it has (a newer part off)
            known = libbpf.rodata_names(o)
            objects[o.stem] = BpfObject(o, {k: v for k, v in other.items() if k in known}, off,
                                        uprobes)  # fmt: skip
        switch = Switcher(objects)
        costs_s = (STATS_WINDOW_S + 1) * len(objects) * cost_rounds
        total = int(minutes * 60) + WARMUP_S + costs_s + 30
        bench = Pgbench(cluster, load, total)
        try:
            bench.wait_started()
            # Swaps on time: this thread ahead of the load (not pgbench, spawned before)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SWAP_NICE)
            time.sleep(WARMUP_S)
            run_blocks(bench, switch, result, time.time() + minutes * 60)
            measure_costs(switch, result, cost_rounds)
            if queries:
                count_query_ns(objects[QUERIES], result, cluster)
            if locks:
                result.lock_sleeps = sum(v[1] for v in lockdim.read_map(objects[LOCKS]).values())
        finally:
            switch.to(NONE)
            bench.stop()
            for obj in objects.values():
                obj.close()
    return result


def report(result: Result) -> str:
    size = len(result.blocks[0].order) if result.blocks else 0
    lines = [f"{result.workload}: {len(result.blocks)} blocks of {size} windows of "
             f"{result.window_s} s (seed {result.seed}); untraced "
             f"{common.median(result.untraced_tps) or 0:,.0f} tps (median); "
             f"{result.late_windows} windows left out (swapped late)"]  # fmt: skip
    others = sorted({v for b in result.blocks for v in b.order} - set(VARIANTS))
    pairs = [(FLOOR, NONE), (WAITS, NONE), (WAITS, FLOOR), (QUERIES, NONE), (QUERIES, WAITS),
             (LOCKS, NONE), (LOCKS, WAITS), (MODES, NONE), (MODES, WAITS)]  # fmt: skip
    pairs += [p for o in others for p in ((o, NONE), (o, WAITS))]
    for variant, base in pairs:
        i = result.interval(variant, base)
        if i is not None:
            verdict = f", {i.verdict(BUDGET)} against {BUDGET}" if base == NONE else ""
            lines.append(f"  TPS {variant}/{base}: {i.text()} (±{i.half_width_pct:.2f} %, "
                         f"{i.n} blocks){verdict}")  # fmt: skip
    if result.query_ns_total:
        share = result.query_ns_with_id / result.query_ns_total
        lines.append(f"  waits+queries: {share:.1%} of @query_ns's CPU time keyed by a query id")
    if result.lock_sleeps:
        lines.append(f"  waits+locks: {result.lock_sleeps:,} Lock sleeps charged to a lock "
                     "(the wait under way in each task's entry not counted)")  # fmt: skip
    for variant, c in result.costs.items():
        rounds = result.cost_rounds.get(variant, [])
        if len(rounds) > 1:
            each = ", ".join(f"{r.ns_per_fire:.0f}" for r in rounds)
            lines.append(f"  {variant}: ns per fire in {len(rounds)} rounds: {each}; medians:")
        lines.append(f"  {variant}: {c.fires_per_s:,.0f} fires/s x {c.ns_per_fire:.0f} ns = "
                     f"{c.fires_per_s * c.ns_per_fire / 1e6:.1f} ms/s of BPF; "
                     f"{c.switches_per_s:,.0f} context switches/s")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.toggle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workload", choices=("select", "tpcb", "many"), default="select")
    parser.add_argument("--protocol", choices=("simple", "extended", "prepared"),
                        default="simple", help="pgbench -M (default simple)")  # fmt: skip
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window", type=int, default=1, help="seconds per window (default 1)")
    parser.add_argument("--scale", type=int, default=10, help="pgbench scale (default 10)")
    parser.add_argument("--seed", type=int, default=None, help="the blocks' order (random)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--cost-rounds", type=int, default=1,
                        help="windows per variant with BPF statistics on (default 1)")  # fmt: skip
    parser.add_argument("--object", type=Path, action="append", default=[],
                        help="another build of the time model to compare (repeatable)")  # fmt: skip
    parser.add_argument("--queries", action="store_true",
                        help="also the time model with the query dimension (waits+queries), "
                        "on a cluster with query ids")  # fmt: skip
    parser.add_argument(
        "--locks",
        action="store_true",
        help="also the time model with its lock dimension (waits+locks)",
    )
    parser.add_argument("--modes", action="store_true",
                        help="also the time model reading LWLock modes (waits+modes)")  # fmt: skip
    parser.add_argument("--no-floor", action="store_true",
                        help="no empty program: pairs of nothing and the time model")  # fmt: skip
    ns = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.toggle: run as root (it loads BPF programs)", file=sys.stderr)
        return 2
    # A SIGTERM ends the run through the finally blocks: programs detached, cluster stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    seed = ns.seed if ns.seed is not None else random.SystemRandom().randrange(1 << 31)
    result = measure(ns.workload, ns.minutes, ns.window, ns.scale, seed, ns.object,
                     floor=not ns.no_floor, queries=ns.queries, protocol=ns.protocol,
                     cost_rounds=ns.cost_rounds, locks=ns.locks, modes=ns.modes)  # fmt: skip
    print(report(result))
    if ns.json:
        ns.json.write_text(json.dumps(result.as_json(), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
