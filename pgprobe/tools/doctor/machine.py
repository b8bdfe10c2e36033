"""`pgprobe doctor`'s checks of this machine: privileges, the tracer, kernel features.

Kernel features are tried, not guessed: each probe type is attached for real by a tiny
bpftrace program (in parallel, about a second in all).
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pgprobe import usdt
from pgprobe.engines import bpftrace, libbpf
from pgprobe.engines import compiled as engine
from pgprobe.errors import PgprobeError
from pgprobe.tools.clog_reads import compiled as slru_compiled
from pgprobe.tools.doctor.records import Check
from pgprobe.tools.lwlocks import compiled as lwlock_compiled
from pgprobe.tools.profiling import compiled as profile_compiled
from pgprobe.tools.waits import compiled as waits_compiled

MIN_BPFTRACE = (0, 12)
CAP_PERFMON, CAP_BPF = 38, 39


# -- privileges and tracer --------------------------------------------------------------------


def check_root() -> Check:
    if os.geteuid() == 0:
        return Check("root", "ok", "running as root")
    caps = _effective_caps()
    if caps & (1 << CAP_BPF) and caps & (1 << CAP_PERFMON):
        return Check("root", "ok", "not root, but CAP_BPF and CAP_PERFMON are effective")
    return Check("root", "fail", "not root, and no CAP_BPF + CAP_PERFMON", "run with sudo")


def _effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_bpftrace() -> list[Check]:
    try:
        path = bpftrace.find_bpftrace()
    except PgprobeError:
        return [Check("bpftrace", "fail", "bpftrace not found on PATH", "apt-get install bpftrace")]
    version = bpftrace.bpftrace_version(path)
    numbers = tuple(int(x) for x in version.lstrip("v").split(".")[:2] if x.isdigit())
    if numbers and numbers < MIN_BPFTRACE:
        return [
            Check(
                "bpftrace",
                "fail",
                f"{path} {version} is too old (0.12+ needed)",
                "install a newer bpftrace",
            )  # fmt: skip
        ]
    return [Check("bpftrace", "ok", f"{path} {version}")]


def check_btf() -> Check:
    if Path("/sys/kernel/btf/vmlinux").exists():
        return Check("btf", "ok", "/sys/kernel/btf/vmlinux present")
    return Check(
        "btf", "fail", "the kernel has no BTF (/sys/kernel/btf/vmlinux)",
        "use a kernel built with CONFIG_DEBUG_INFO_BTF=y (all current distributions)",
    )  # fmt: skip


def check_compiled_waits() -> Check:
    """Whether waits (and triage's time model, serve, lwlocks' fallback) runs its compiled
    form here: the object built, and this kernel's verifier takes it (a real load)."""
    return _check_object("waits compiled", waits_compiled.OBJECT,
                         "waits runs bpf/waits.bt, about twice the cost per switch",
                         off=waits_compiled.QUERY_PROGRAMS)  # fmt: skip


def check_compiled_sampler() -> Check:
    """Whether flame, hot (and triage's CPU part, top's CPU functions) sample from their
    compiled object here, or start bpftrace for bpf/profile.bt."""
    return _check_object("sampler compiled", profile_compiled.OBJECT,
                         "flame and hot run bpf/profile.bt in bpftrace (~100 MiB)",
                         sampled={profile_compiled.PROGRAM: 1})  # fmt: skip


def check_compiled_slru() -> Check:
    """Whether clog-reads (and triage, serve) counts SLRU reads from its compiled object here
    (loaded for real; its uprobe attaches to the server binary at each capture)."""
    return _check_object("slru compiled", slru_compiled.OBJECT,
                         "clog-reads runs bpf/clog_reads_uprobe.bt in bpftrace (~100 MiB)",
                         attach=False)  # fmt: skip


def check_compiled_lwlocks() -> Check:
    """Whether lwlocks --source usdt (and triage on 13) times the waits from its compiled
    object here (loaded for real; its USDT probes attach to the server binary at each
    capture)."""
    return _check_object("lwlocks compiled", lwlock_compiled.OBJECT,
                         "lwlocks --source usdt runs bpf/lwlock_wait.bt in bpftrace (~100 MiB)",
                         attach=False)  # fmt: skip


def _check_object(
    name: str,
    object_name: str,
    fallback: str,
    off: frozenset[str] = frozenset(),
    sampled: dict[str, int] | None = None,
    attach: bool = True,
) -> Check:
    """An object loaded (the verifier takes it) and attached for real (its programs filter on
    a postmaster of pid 0: they count nothing), then closed; off: programs left out; attach
    False: loaded only (a uprobe's or a USDT probe's place is the server binary, known at
    the capture)."""
    path = engine.object_path(object_name)
    if path is None:
        return Check(name, "warn", f"{engine.not_built(object_name)}: {fallback}",
                     engine.how_to_build())  # fmt: skip
    if why := libbpf.unavailable():
        return Check(name, "warn", f"{why}: {fallback}")
    try:
        with libbpf.BpfObject(path, {}, off, sampled=sampled) as obj:
            if attach:
                obj.attach()
    except libbpf.LibbpfError as exc:
        return Check(name, "warn", f"this kernel refuses it ({exc}): {fallback}",
                     "Linux 5.13 or later with BTF")  # fmt: skip
    done = "loads and attaches" if attach else "loads"
    return Check(name, "ok", f"{path} {done} (libbpf {libbpf.version()})")


def check_tracefs() -> Check:
    if (bpftrace.TRACEFS / "uprobe_events").exists():
        return Check("tracefs", "ok", f"mounted at {bpftrace.TRACEFS}")
    if os.geteuid() == 0:
        warnings = bpftrace.ensure_tracefs()
        if not warnings:
            return Check(
                "tracefs", "ok", f"was not mounted; pgprobe mounted it at {bpftrace.TRACEFS}"
            )
    return Check(
        "tracefs", "warn", "not mounted (pgprobe mounts it when run as root)",
        f"mount -t tracefs nodev {bpftrace.TRACEFS}",
    )  # fmt: skip


# -- kernel features, tried --------------------------------------------------------------------


def probe_programs(binary: str | None) -> dict[str, tuple[str, str]]:
    """{check: (bpftrace program, fix)}: each attaches one probe type and exits at once."""
    programs = {
        "tracepoints": ("tracepoint:syscalls:sys_enter_openat { }",
                        "a kernel with CONFIG_FTRACE_SYSCALLS; tracefs mounted"),
        "perf sampling": ("profile:hz:49 { }", "a kernel with perf events (CONFIG_PERF_EVENTS)"),
        "kprobes": ("kprobe:do_nanosleep { }", "not needed by pgprobe"),
    }  # fmt: skip
    if binary and Path(binary).exists():
        programs["uprobes"] = (f"uprobe:{binary}:PostgresMain {{ }}", "CONFIG_UPROBES=y")
        if (usdt.PROVIDER, "lwlock__wait__start") in usdt.probe_names(binary):
            programs["usdt"] = (
                f"usdt:{binary}:postgresql:lwlock__wait__start {{ }}",
                "CONFIG_UPROBES=y (USDT probes are uprobes)",
            )
    return programs


def try_probe_types(binary: str | None, tracer_ok: bool) -> list[Check]:
    programs = probe_programs(binary)
    if not tracer_ok:
        return [
            Check(
                name, "info" if name == "kprobes" else "fail", "not tried: needs root and bpftrace"
            )
            for name in programs
        ]
    tracer = bpftrace.find_bpftrace()
    with ThreadPoolExecutor(max_workers=len(programs)) as pool:
        attached = pool.map(lambda p: _attach(tracer, p[0]), programs.values())
        results = dict(zip(programs, attached, strict=True))
    checks = []
    for name, (ok, detail) in results.items():
        fix = programs[name][1]
        if name == "kprobes":
            status = "info"
            detail = "available" if ok else f"unavailable ({detail}); pgprobe does not use them"
            fix = ""
        else:
            status = "ok" if ok else "fail"
            detail = "attached" if ok else detail
        checks.append(Check(name, status, detail, "" if ok else fix))
    return checks


def _attach(tracer: str, program: str) -> tuple[bool, str]:
    script = f"{program} interval:ms:100 {{ exit(); }}"
    try:
        done = subprocess.run(
            [tracer, "-e", script], capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False, "bpftrace did not finish within 60 s"
    problems = [
        ln for ln in done.stderr.splitlines()
        if ln.strip() and not any(b in ln for b in bpftrace.BENIGN_STDERR)
    ]  # fmt: skip
    if done.returncode == 0:
        return True, ""
    return False, bpftrace.explain(problems)
