"""What one probe fire costs, measured directly: the mechanism, without PostgreSQL.

A TPS ratio on a 2-CPU machine cannot resolve a 2 % overhead in a run of reasonable
length (the pairs' spread is about 10 %). The cost of a tool is instead the sum over its
probes of fires/s × (mechanism ns + BPF ns) per fire. BPF ns per fire comes from
kernel.bpf_stats_enabled during the overhead runs; this module measures the mechanism:

- a uprobe: the breakpoint trap, the kernel's uprobe handling and an empty-ish BPF
  program (a count), per call of a function in a small C program (bench/probe_cost.c);
- a syscall tracepoint: the same, per getppid() system call, with the pid filter that
  pgprobe's scripts put first.

Each is the thread CPU time per iteration, traced minus untraced, medians of
interleaved rounds: CPU time, not wall time, so other load on the machine does not
count in it.

And what a context switch costs under bpf/waits.bt (issue 14), against its floor: two
processes pinned to one CPU ping-pong over pipes (probe_cost.c `switch`), CPU time per
switch of both, untraced and under each of SWITCH_VARIANTS in turn, in interleaved rounds;
beside it the BPF run time per switch of every program (kernel BPF statistics: the
caller turns them on, as the bench does for the whole run, or main() below). The floor is
an empty sched_switch program (the tracepoint's perf-event path itself), the filter the
least a script must do to reject a task that is not the cluster's (a hash lookup of prev
and of next), and waits.bt with the two processes foreign to it, one of them its own (a
backend and its pgbench client), and both its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import bpfstats, common
from pgprobe import kernelbtf

SOURCE = Path(__file__).with_name("probe_cost.c")
ROUNDS = 5
CALLS = 200_000  # a uprobe fire costs microseconds: 200k is plenty
SYSCALLS = 500_000
ATTACH_TIMEOUT_S = 30.0
SWITCH_ROUNDS = 5
SWITCH_ITERATIONS = 150_000  # 300,000 switches a run, about 0.5 s of CPU
SWITCH_CPU = (os.cpu_count() or 1) - 1  # both processes on this CPU (the last one)
WAITS = Path(__file__).resolve().parent.parent / "bpf" / "waits.bt"
FOREIGN_PM = 2**22 + 1  # above pid_max: no task is its child


@dataclass(frozen=True)
class SwitchVariant:
    key: str
    label: str
    program: str  # bpftrace -e text, or "waits" for bpf/waits.bt
    ours: int  # waits.bt: how many of the two processes are its own (0, 1, 2)


SWITCH_VARIANTS = (
    SwitchVariant("floor", "floor: empty sched_switch", "tracepoint:sched:sched_switch {}", 0),
    SwitchVariant(
        "floor2",
        "floor: empty sched_switch + sched_wakeup",
        "tracepoint:sched:sched_switch {} tracepoint:sched:sched_wakeup {}",
        0,
    ),
    SwitchVariant(
        "filter",
        "filter: prev and next looked up in a hash map, both foreign",
        "BEGIN { @t[0] = 1; } tracepoint:sched:sched_switch "
        "{ if (@t[args->prev_pid] == 2 || @t[args->next_pid] == 2) { @x = 1; } }",
        0,
    ),
    SwitchVariant("waits-foreign", "waits.bt, both processes foreign", "waits", 0),
    SwitchVariant("waits-mixed", "waits.bt, one of its own (a backend and its client)", "waits", 1),
    SwitchVariant("waits-ours", "waits.bt, both its own", "waits", 2),
)


@dataclass
class SwitchCost:
    """CPU ns per context switch under one variant, and BPF ns per switch."""

    key: str
    label: str
    untraced_ns: list[float] = field(default_factory=list)
    traced_ns: list[float] = field(default_factory=list)
    bpf_ns: list[float] = field(default_factory=list)  # all its programs, per switch
    per_program: dict[str, list[float]] = field(default_factory=dict)  # BPF ns per fire

    @property
    def ns_per_switch(self) -> float | None:
        """Median over the rounds of traced minus that round's untraced."""
        return common.median([t - u for t, u in zip(self.traced_ns, self.untraced_ns, strict=True)])


@dataclass
class Mechanism:
    name: str
    probe: str  # the bpftrace probe, for the report
    untraced_ns: list[float] = field(default_factory=list)
    traced_ns: list[float] = field(default_factory=list)

    @property
    def ns_per_fire(self) -> float | None:
        base, traced = common.median(self.untraced_ns), common.median(self.traced_ns)
        return None if base is None or traced is None else traced - base


@dataclass
class ProbeCostResult:
    mechanisms: list[Mechanism] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    switches: list[SwitchCost] = field(default_factory=list)


def _per_iteration_cpu_ns(binary: Path, mode: str, n: int) -> float:
    out = subprocess.run([str(binary), mode, str(n)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def _tracer(program: str, argv: list[str] | None = None) -> subprocess.Popen[str]:
    """bpftrace running `program` (or bpftrace with argv), once its probes are attached."""
    child = subprocess.Popen(
        ["bpftrace", *(argv or ["-e", program])],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert child.stdout is not None
    deadline = time.time() + ATTACH_TIMEOUT_S
    for line in child.stdout:
        if line.startswith("Attaching"):
            time.sleep(0.3)  # "Attaching" comes before the probes are live
            return child
        if time.time() > deadline:
            break
    child.kill()
    raise RuntimeError(f"bpftrace did not attach: {program or argv}")


def _stop(child: subprocess.Popen[str]) -> None:
    child.terminate()
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _measure(binary: Path, mech: Mechanism, mode: str, n: int, program: str, rounds: int) -> None:
    for _ in range(rounds):
        mech.untraced_ns.append(_per_iteration_cpu_ns(binary, mode, n))
        tracer = _tracer(program)
        try:
            mech.traced_ns.append(_per_iteration_cpu_ns(binary, mode, n))
        finally:
            _stop(tracer)


def _switch_run(
    binary: Path, variant: SwitchVariant | None, waits: Path, n: int
) -> tuple[float, dict[str, tuple[int, int]]]:
    """CPU ns per switch of one ping-pong run, and per BPF program (runs, ns) under it."""
    mixed = ["mixed"] if variant is not None and variant.ours == 1 else []
    pp = subprocess.Popen(
        [str(binary), "switch", str(n), str(SWITCH_CPU), *mixed],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert pp.stdin is not None and pp.stdout is not None
    pid, addr = pp.stdout.readline().split()
    tracer = None
    try:
        if variant is not None and variant.program == "waits":
            pm = pid if variant.ours else str(FOREIGN_PM)
            offsets = [str(o) for o in kernelbtf.task_offsets().as_args()]
            tracer = _tracer("", [str(waits), pm, addr, "0", "0", "0", "0", *offsets])
        elif variant is not None:
            tracer = _tracer(variant.program)
        before = bpfstats.programs(tracer.pid) if tracer else []
        pp.stdin.write("\n")
        pp.stdin.flush()
        cpu_ns = float(pp.stdout.readline().split()[0])
        if pp.wait() != 0:
            raise RuntimeError("probe_cost switch failed")
        after = bpfstats.programs(tracer.pid) if tracer else []
    finally:
        if tracer is not None:
            _stop(tracer)
        if pp.poll() is None:
            pp.kill()
            pp.wait()
    progs = {p.name: (p.runs, p.ns) for p in bpfstats.delta(before, after) if p.runs}
    return cpu_ns, progs


def measure_switches(
    binary: Path, rounds: int = SWITCH_ROUNDS, n: int = SWITCH_ITERATIONS, waits: Path = WAITS
) -> list[SwitchCost]:
    """Each variant in every round, beside that round's untraced run."""
    costs = [SwitchCost(v.key, v.label) for v in SWITCH_VARIANTS]
    switches = 2 * n
    for _ in range(rounds):
        untraced, _progs = _switch_run(binary, None, waits, n)
        for variant, cost in zip(SWITCH_VARIANTS, costs, strict=True):
            traced, progs = _switch_run(binary, variant, waits, n)
            cost.untraced_ns.append(untraced)
            cost.traced_ns.append(traced)
            # the programs also ran for the rest of the machine: per switch of the
            # ping-pong is an upper bound, per fire is exact
            cost.bpf_ns.append(sum(ns for _r, ns in progs.values()) / switches)
            for name, (runs, ns) in progs.items():
                cost.per_program.setdefault(name, []).append(ns / runs)
    return costs


def run(rounds: int = ROUNDS, switch_rounds: int = SWITCH_ROUNDS) -> ProbeCostResult:
    result = ProbeCostResult()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("bpftrace") is None:
        result.notes.append("probe cost not measured: needs a C compiler and bpftrace")
        return result
    with tempfile.TemporaryDirectory(prefix="pgprobe-probe-cost-") as tmp:
        binary = Path(tmp) / "probe_cost"
        subprocess.run([cc, "-O2", "-o", str(binary), str(SOURCE)], check=True)
        uprobe = Mechanism("uprobe (trap + count)", f"uprobe:{binary.name}:target")
        _measure(
            binary, uprobe, "call", CALLS, f"uprobe:{binary}:target {{ @n = count(); }}", rounds
        )
        # The filter is what pgprobe's scripts do first: a foreign pid returns at once.
        # Here the target's own pid is unknown in advance, so filter on its name.
        tracepoint = Mechanism(
            "syscall tracepoint (filter + count)", "tracepoint:syscalls:sys_enter_getppid"
        )
        _measure(
            binary,
            tracepoint,
            "syscall",
            SYSCALLS,
            'tracepoint:syscalls:sys_enter_getppid /comm == "probe_cost"/ { @n = count(); }',
            rounds,
        )
        result.mechanisms = [uprobe, tracepoint]
        if switch_rounds:
            result.switches = measure_switches(binary, switch_rounds)
    return result


def switch_lines(costs: list[SwitchCost]) -> list[str]:
    """ "ns per context switch: floor, filter, waits.bt", one line per variant."""
    out = []
    for c in costs:
        ns, bpf = c.ns_per_switch, common.median(c.bpf_ns)
        fires = ", ".join(
            f"{name} {common.median(v):.0f}" for name, v in sorted(c.per_program.items())
        )
        out.append(
            f"{c.label}: {'-' if ns is None else f'{ns:+.0f}'} ns per context switch "
            f"(BPF {'-' if bpf is None else f'{bpf:.0f}'} ns per switch; ns per fire: {fires})"
        )
    return out


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root (bpftrace)")
    with bpfstats.BpfStats():
        got = run()
    for m in got.mechanisms:
        print(
            f"{m.name}: {m.ns_per_fire:.0f} ns/fire "
            f"(untraced {common.median(m.untraced_ns):.1f} ns, "
            f"traced {common.median(m.traced_ns):.1f} ns per iteration)"
        )
    print("ns per context switch (traced minus untraced CPU time, median of rounds):")
    for line in switch_lines(got.switches):
        print(f"  {line}")
    for note in got.notes:
        print(note)


if __name__ == "__main__":
    main()
