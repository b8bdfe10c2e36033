"""What one SLRU read costs the reading backend under each clog-reads source, on a real cluster.

For docs/clog-reads.md: a throwaway cluster with the SLRU test workload's settings
(tests/slru_workload.py: 128kB of shared_buffers, so every pg_xact lookup of an old
xid misses), one backend that looks up old xids in a loop, and its CPU time
(/proc/PID/schedstat, ns) per read (pg_stat_slru's blks_read delta) with no tracer,
with bpf/clog_reads_uprobe.bt and with bpf/clog_reads.bt, interleaved rounds,
medians. With kernel.bpf_stats_enabled the BPF programs' own run time and run
count (from bpftrace's /proc/PID/fdinfo) say what the probes did meanwhile, and an
idle second says how often the syscall script's tracepoints fire on this machine
when nothing reads. CPU time, not wall time: other load on the machine does not
count in it. Usage (root): .venv/bin/python -m bench.clog_read_cost [ROUNDS]
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pgprobe.sandbox import PgCluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import slru_workload as w  # noqa: E402 - the tests' workload, shared on purpose

CHECKOUT = Path(__file__).resolve().parent.parent
CALLS = 40  # provoke_xact_reads calls per measurement


def _cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _prog_stats(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs bpftrace pid holds."""
    run_ns = run_cnt = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        if "prog_tag" not in text:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        run_ns += int(fields.get("run_time_ns", "0").strip() or 0)
        run_cnt += int(fields.get("run_cnt", "0").strip() or 0)
    return run_ns, run_cnt


def _tracer(pg: PgCluster, source: str, postgres: str) -> subprocess.Popen[str]:
    postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
    if source == "uprobe":
        argv = ["bpftrace", str(CHECKOUT / "bpf/clog_reads_uprobe.bt"), postgres,
                str(postmaster), "0", "0", "0"]  # fmt: skip
    else:
        argv = ["bpftrace", str(CHECKOUT / "bpf/clog_reads.bt"), str(postmaster), "1"]
    env = {**os.environ, "BPFTRACE_STRLEN": "40"}
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=env)  # fmt: skip
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("@@live"):
            time.sleep(0.2)
            return child
    raise RuntimeError(f"bpftrace ended: {argv}")


def _measure(conn: Any, pid: int, first: int, last: int) -> tuple[int, int]:
    """(backend CPU ns, pg_xact reads) of CALLS rounds of lookups."""
    before, cpu0 = w.slru_stats(conn), _cpu_ns(pid)
    for _ in range(CALLS):
        w.provoke_xact_reads(conn, first, last)
    cpu1, after = _cpu_ns(pid), w.slru_stats(conn)
    return cpu1 - cpu0, w.slru_delta(before, after)[w.XACT][1]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    Path("/proc/sys/kernel/bpf_stats_enabled").write_text("1")
    pg = PgCluster(settings=w.CLUSTER_SETTINGS, name="pgprobe-clog-cost").start()
    postgres = str(pg.bindir / "postgres")
    per_read: dict[str, list[float]] = {"none": [], "uprobe": [], "syscalls": []}
    bpf: dict[str, list[tuple[int, int, int]]] = {"uprobe": [], "syscalls": []}
    idle: dict[str, tuple[int, int]] = {}
    try:
        with pg.connect() as conn:
            pid = int(conn.info.backend_pid)
            first, last = w.burn_xids(pg.conninfo, w.xact_burn_size(conn))
            _measure(conn, pid, first, last)  # warm-up
            for _ in range(rounds):
                for source in per_read:
                    tracer = _tracer(pg, source, postgres) if source != "none" else None
                    try:
                        if tracer is not None and source not in idle:
                            a = _prog_stats(tracer.pid)
                            time.sleep(1.0)
                            b = _prog_stats(tracer.pid)
                            idle[source] = (b[0] - a[0], b[1] - a[1])
                        s0 = _prog_stats(tracer.pid) if tracer else (0, 0)
                        cpu, reads = _measure(conn, pid, first, last)
                        s1 = _prog_stats(tracer.pid) if tracer else (0, 0)
                    finally:
                        if tracer is not None:
                            tracer.send_signal(signal.SIGINT)
                            tracer.communicate(timeout=300)
                    per_read[source].append(cpu / reads)
                    if source != "none":
                        bpf[source].append((s1[0] - s0[0], s1[1] - s0[1], reads))
    finally:
        pg.stop()
        Path("/proc/sys/kernel/bpf_stats_enabled").write_text("0")
    base = statistics.median(per_read["none"])
    print(f"PostgreSQL {postgres}; {rounds} interleaved rounds of {CALLS} lookup calls")
    print(f"backend CPU per pg_xact read, untraced: {base:,.0f} ns")
    for source in ("uprobe", "syscalls"):
        med = statistics.median(per_read[source])
        run_ns = sum(b[0] for b in bpf[source])
        run_cnt = sum(b[1] for b in bpf[source])
        reads = sum(b[2] for b in bpf[source])
        idle_ns, idle_cnt = idle[source]
        print(
            f"{source}: {med:,.0f} ns per read (+{med - base:,.0f} ns); BPF programs ran "
            f"{run_cnt / reads:,.1f} times per read, {run_ns / reads:,.0f} ns of BPF per read; "
            f"idle machine: {idle_cnt:,} fires/s, {idle_ns / 1e6:.2f} ms/s of BPF"
        )
    print("per round (ns per read):", {k: [round(v) for v in vs] for k, vs in per_read.items()})


if __name__ == "__main__":
    main()
