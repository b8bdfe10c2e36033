"""What the benchmark's parts share: statistics, /proc readings, measured child processes,
and the facts about the machine (BPF run-time statistics: bench/bpfstats.py)."""

from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
# Where the tools and sub-benchmarks run from (their cwd, so `python -m pgprobe` imports the
# pgprobe found there): the checkout, or a copy of it taken when the bench starts.
RUN_DIR = REPO
CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1
KIB_PER_MIB = 1024


# -- statistics ------------------------------------------------------------------------------


def median(values: Iterable[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def spread(values: Iterable[float | None]) -> tuple[float, float] | None:
    got = [v for v in values if v is not None]
    return (min(got), max(got)) if got else None


def log(text: str) -> None:
    print(text, flush=True)


def sleep_until(t: float) -> None:
    delay = t - time.time()
    if delay > 0:
        time.sleep(delay)


# -- /proc -----------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the command name (field 3, state, is index 0)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def proc_cpu_s(pid: int, reaped_children: bool = False) -> float | None:
    """User + system CPU seconds of a process (and of its reaped children)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / CLK_TCK


def _ppids() -> dict[int, int]:
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                out[int(entry.name)] = int(fields[1])
    return out


def process_tree(roots: Iterable[int]) -> set[int]:
    """The roots and all their live descendants."""
    kids: dict[int, list[int]] = {}
    for pid, parent in _ppids().items():
        kids.setdefault(parent, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots if r > 0]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(kids.get(pid, []))
    return seen


def tree_cpu_s(roots: Iterable[int]) -> float:
    """CPU seconds of a process tree: every live member plus the children it reaped."""
    return sum(proc_cpu_s(pid, reaped_children=True) or 0.0 for pid in process_tree(roots))


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    total = sum(values)
    idle = values[3] + values[4]  # idle, iowait
    return (total - idle) / CLK_TCK, total / CLK_TCK


def context_switches() -> tuple[int, float]:
    """(context switches of the whole machine since boot, monotonic time), from /proc/stat.

    sched_switch-based probes fire once per switch: this is their fire rate.
    """
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("ctxt "):
                return int(line.split()[1]), time.monotonic()
    return 0, time.monotonic()


def switches_per_s(before: tuple[int, float], after: tuple[int, float]) -> float:
    elapsed = after[1] - before[1]
    return (after[0] - before[0]) / elapsed if elapsed > 0 else 0.0


def children(pid: int) -> list[int]:
    """Live children of pid, started by any of its threads."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(p) for p in f.read().split())
        except OSError:
            continue
    return out


def snapshot_source(dest: Path) -> str:
    """Copy the code the bench runs (pgprobe, bpf, d, bench) to dest and run it from
    there, so that edits made to the checkout during a run do not reach it. Returns a
    description of the source: the commit, and what differed from it."""
    for part in ("pgprobe", "bpf", "d", "bench"):
        if (REPO / part).is_dir():
            shutil.copytree(REPO / part, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
    global RUN_DIR
    RUN_DIR = dest
    head = _first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    if not re.fullmatch(r"[0-9a-f]{4,40}", head):
        return "a tree outside git (no commit to name)"
    try:
        status = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "pgprobe", "bpf", "d"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        status = []
    changed = sorted(line[3:] for line in status if line.strip())
    if not changed:
        return f"commit {head}"
    return f"commit {head} plus uncommitted changes in {', '.join(changed)}"


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def fd_targets(pid: int) -> list[tuple[str, str]]:
    """(fd, link target) of every open file descriptor of pid."""
    out = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                out.append((fd, os.readlink(f"/proc/{pid}/fd/{fd}")))
            except OSError:
                continue
    except OSError:
        pass
    return out


def perf_event_fds(pid: int) -> int:
    return sum(1 for _, target in fd_targets(pid) if target == "anon_inode:[perf_event]")


def loadavg() -> tuple[float, float, float]:
    with open("/proc/loadavg") as f:
        a, b, c = f.read().split()[:3]
    return float(a), float(b), float(c)


TRACER_COMMS = ("pgbench", "bpftrace", "perf")


def foreign_load_processes(own_roots: Iterable[int]) -> list[str]:
    """pgbench, bpftrace and perf processes that are not the benchmark's own."""
    own = process_tree(own_roots)
    found = []
    for pid in _ppids():
        if pid not in own and comm(pid) in TRACER_COMMS:
            found.append(f"{comm(pid)}[{pid}]")
    return sorted(found)


# -- measured child processes ----------------------------------------------------------------


@dataclass
class Finished:
    returncode: int
    wall_s: float
    cpu_s: float  # of the process and the children it waited for
    maxrss_kib: int  # the larger of the process's peak and its waited-for children's


def wait_measured(child: subprocess.Popen[Any], started: float) -> Finished:
    """Reap child with wait4: exit status, wall time since `started`, CPU and peak RSS."""
    _, status, usage = os.wait4(child.pid, 0)
    ended = time.time()
    child.returncode = os.waitstatus_to_exitcode(status)
    return Finished(
        returncode=child.returncode,
        wall_s=ended - started,
        cpu_s=usage.ru_utime + usage.ru_stime,
        maxrss_kib=usage.ru_maxrss,
    )


def run_measured(
    argv: Sequence[str], stdout: IO[Any] | int | None = subprocess.DEVNULL
) -> Finished:
    started = time.time()
    child = subprocess.Popen(  # a session of its own, as from a DBA's shell
        argv, stdout=stdout, stderr=subprocess.PIPE, cwd=RUN_DIR, start_new_session=True
    )
    assert child.stderr is not None
    err = child.stderr.read()
    done = wait_measured(child, started)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {err.decode()[-500:]}")
    return done


def self_maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB_PER_MIB


# -- the machine -----------------------------------------------------------------------------


def _first_line(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return ""
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else ""


def find_inferno() -> str | None:
    found = shutil.which("inferno-flamegraph")
    if found:
        return found
    cargo_bin = Path.home() / ".cargo" / "bin" / "inferno-flamegraph"
    return str(cargo_bin) if os.access(cargo_bin, os.X_OK) else None


def inferno_version() -> str:
    """inferno's version from `cargo install --list` (inferno-flamegraph has no --version)."""
    try:
        done = subprocess.run(
            ["cargo", "install", "--list"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return "installed"
    m = re.search(r"^inferno (v[\d.]+)", done.stdout, re.M)
    return f"inferno {m.group(1)}" if m else "installed"


def perf_works() -> tuple[bool, str]:
    """`perf stat -e instructions true` runs: perf is installed for this kernel."""
    perf = shutil.which("perf")
    if perf is None:
        return False, "perf is not installed (Debian: apt-get install linux-perf)"
    try:
        done = subprocess.run(
            [perf, "stat", "-e", "instructions", "true"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"perf failed: {exc}"
    if done.returncode != 0:
        return False, f"perf stat failed: {done.stderr.strip()[-200:]}"
    return True, _first_line([perf, "--version"])


def machine_info(postgres_bin: Path) -> dict[str, str]:
    mem_kib = 0
    model = ""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    os_name = ""
    if Path("/etc/os-release").exists():
        m = re.search(r'^PRETTY_NAME="?([^"\n]*)', Path("/etc/os-release").read_text(), re.M)
        os_name = m.group(1) if m else ""
    return {
        "os": os_name,
        "kernel": platform.release(),
        "cpus": f"{NCPU} ({model})" if model else str(NCPU),
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "postgresql": _first_line([str(postgres_bin), "--version"]),
        "bpftrace": _first_line(["bpftrace", "--version"]),
        "python": platform.python_version(),
        "perf": _first_line(["perf", "--version"]) if shutil.which("perf") else "not installed",
        "inferno": inferno_version() if find_inferno() else "not installed",
    }
