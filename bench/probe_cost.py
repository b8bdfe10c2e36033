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
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import common

SOURCE = Path(__file__).with_name("probe_cost.c")
ROUNDS = 5
CALLS = 200_000  # a uprobe fire costs microseconds: 200k is plenty
SYSCALLS = 500_000
ATTACH_TIMEOUT_S = 30.0


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


def _per_iteration_cpu_ns(binary: Path, mode: str, n: int) -> float:
    out = subprocess.run([str(binary), mode, str(n)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def _tracer(program: str) -> subprocess.Popen[str]:
    """bpftrace running `program`, once its probes are attached."""
    child = subprocess.Popen(
        ["bpftrace", "-e", program],
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
    raise RuntimeError(f"bpftrace did not attach: {program}")


def _stop(child: subprocess.Popen[str]) -> None:
    child.terminate()
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _measure(binary: Path, mech: Mechanism, mode: str, n: int, program: str) -> None:
    for _ in range(ROUNDS):
        mech.untraced_ns.append(_per_iteration_cpu_ns(binary, mode, n))
        tracer = _tracer(program)
        try:
            mech.traced_ns.append(_per_iteration_cpu_ns(binary, mode, n))
        finally:
            _stop(tracer)


def run() -> ProbeCostResult:
    result = ProbeCostResult()
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("bpftrace") is None:
        result.notes.append("probe cost not measured: needs a C compiler and bpftrace")
        return result
    with tempfile.TemporaryDirectory(prefix="pgprobe-probe-cost-") as tmp:
        binary = Path(tmp) / "probe_cost"
        subprocess.run([cc, "-O2", "-o", str(binary), str(SOURCE)], check=True)
        uprobe = Mechanism("uprobe (trap + count)", f"uprobe:{binary.name}:target")
        _measure(binary, uprobe, "call", CALLS, f"uprobe:{binary}:target {{ @n = count(); }}")
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
        )
        result.mechanisms = [uprobe, tracepoint]
    return result


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root (bpftrace)")
    got = run()
    for m in got.mechanisms:
        print(
            f"{m.name}: {m.ns_per_fire:.0f} ns/fire "
            f"(untraced {common.median(m.untraced_ns):.1f} ns, "
            f"traced {common.median(m.traced_ns):.1f} ns per iteration)"
        )
    for note in got.notes:
        print(note)


if __name__ == "__main__":
    main()
