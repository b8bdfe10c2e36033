"""`pgprobe doctor`: will tracing work on this box? One line per check, with the fix.

Long because it has one short function per check; the next split is said below.

Kernel features are tried, not guessed: each probe type is attached for real by a
tiny bpftrace program (in parallel, about a second in all). Exit 0 when every
pgprobe tool can run; otherwise non-zero, naming the tools affected.

(A little over 400 lines: one short function per check, and the checks grew with
waits, probe-site conflicts and per-build verdicts; the next step is the tool
shape of issue 12, the checks by area in a tools/doctor/ package.)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pgprobe import discover, proc, usdt
from pgprobe.engines import bpftrace
from pgprobe.errors import PgprobeError
from pgprobe.render import table
from pgprobe.tools import common
from pgprobe.unwind import fpcheck
from pgprobe.waitevents import address

NAME = "doctor"
EXIT_NOT_READY = 1

# What each tool needs; a failed check lists the tools it stops.
TRACING = ("lwlocks", "clog-reads", "flame", "hot", "triage", "waits")
NEEDS = {
    "root": TRACING,
    "bpftrace": TRACING,
    "uprobes": ("lwlocks", "triage"),
    "usdt": (),
    "tracepoints": ("clog-reads", "triage", "waits"),
    "btf": TRACING,  # the scripts find a cluster's processes through curtask->real_parent
    "perf sampling": ("flame", "hot", "triage"),
    "server binary": TRACING,
    "usdt probes": (),
    "postgresql version": ("lwlocks", "triage"),
    "connection": ("triage",),
    "wait event address": ("waits",),
}
# A tool that still runs, with a part left out, when another tool cannot run.
IN_PART = {
    "usdt probes": {
        "lwlocks": "LWLock sleeps from the scheduler, not waits",
        "triage": "without its LWLock table",
    }
}
MIN_BPFTRACE = (0, 12)
CAP_PERFMON, CAP_BPF = 38, 39


@dataclass
class Check:
    check: str
    status: str  # ok, warn, fail, info
    detail: str
    fix: str = ""
    affects: list[str] = field(default_factory=list)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="check that tracing works here, with the fix for what does not",
        description="Check privileges, bpftrace, kernel features (tried for real), the "
        "server binary (USDT probes, frame pointers, symbols), the PostgreSQL version and "
        "the connection. Exit 0 when every tool can run.",
    )
    common.add_connection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    checks = diagnose(common.conn_options(ns))
    blocked = sorted({tool for c in checks if c.status == "fail" for tool in c.affects})
    missing = {c.check for c in checks if c.status in ("fail", "warn")}
    partial = {
        t: why
        for check, tools in IN_PART.items()
        if check in missing
        for t, why in tools.items()
        if t not in blocked
    }
    if ns.json:
        meta = {"ready": not blocked, "blocked_tools": blocked, "partial_tools": sorted(partial)}
        print(json.dumps({"tool": NAME, "meta": meta, "rows": [asdict(c) for c in checks]}))
    else:
        render(checks, blocked, partial)
    return EXIT_NOT_READY if blocked else 0


def verdict(blocked: list[str], partial: dict[str, str]) -> str:
    """One line: what runs here, what runs in part, what cannot run."""
    if not blocked and not partial:
        return "ready: every pgprobe tool can run here"
    runs = [t for t in TRACING if t not in blocked and t not in partial]
    if not runs and not partial:
        return f"not ready: these tools cannot run here: {', '.join(blocked)}"
    said = [f"runs here: {', '.join(runs)}"] if runs else []
    said += [f"{tool} {why}" for tool, why in partial.items()]
    cannot = f"; cannot run: {', '.join(blocked)}" if blocked else ""
    return f"ready in part: {'; '.join(said)}{cannot}"


def render(checks: list[Check], blocked: list[str], partial: dict[str, str]) -> None:
    columns = [
        table.Column("status", "STATUS"),
        table.Column("check", "CHECK"),
        table.Column("detail", "DETAIL"),
        table.Column("fix", "FIX"),
    ]
    rows = [
        {"status": c.status.upper(), "check": c.check, "detail": c.detail, "fix": c.fix}
        for c in checks
    ]
    table.render("pgprobe doctor", columns, rows)
    print(verdict(blocked, partial))


def diagnose(opts: discover.ConnOptions) -> list[Check]:
    checks = [check_root(), *check_bpftrace(), check_btf(), check_tracefs()]
    cluster, conn_check = find_cluster(opts)
    binary = cluster.binary if cluster else default_binary()
    root_ok = checks[0].status == "ok"
    tracer_ok = root_ok and checks[1].status == "ok"
    checks += try_probe_types(binary, tracer_ok)
    checks += check_binary(binary)
    checks.append(check_version(cluster, binary))
    checks.append(check_wait_event_address(cluster))
    checks.append(conn_check)
    for c in checks:
        if c.status == "fail" and not c.affects:
            c.affects = list(NEEDS.get(c.check, ()))
    return checks


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


# -- the server ---------------------------------------------------------------------------------


def find_cluster(opts: discover.ConnOptions) -> tuple[discover.Cluster | None, Check]:
    try:
        conn = discover.connect(opts)
    except PgprobeError as exc:
        return None, Check(
            "connection", "fail", exc.message,
            "give -h/-p/-U as for psql; tools still run with --pid without a connection",
        )  # fmt: skip
    with conn:
        privileged = _can_read_all_stats(conn)
        try:
            cluster = discover.from_connection(conn)
        except PgprobeError as exc:
            return None, Check("connection", "fail", exc.message)
    detail = f"connected; postmaster {cluster.postmaster_pid}, {cluster.data_directory}"
    if privileged:
        return cluster, Check("connection", "ok", detail + "; may read every backend's query")
    return cluster, Check(
        "connection", "warn", detail + "; other users' query text is hidden",
        "connect as a superuser or a member of pg_read_all_stats",
    )  # fmt: skip


def _can_read_all_stats(conn: Any) -> bool:
    with conn.cursor() as cur:
        cur.execute(
            "SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')"
            " FROM pg_roles WHERE rolname = current_user"
        )
        row = cur.fetchone()
    return bool(row and row[0])


def default_binary() -> str | None:
    """Without a connection: a running postmaster's binary, else the newest installed."""
    for entry in sorted(Path("/proc").iterdir(), key=lambda p: p.name):
        if not entry.name.isdigit():
            continue
        info = proc.read_info(int(entry.name))
        if info and proc.is_postgres(info) and info.exe:
            parent = proc.read_info(info.ppid)
            if parent is None or not proc.is_postgres(parent):
                return info.exe.removesuffix(" (deleted)")
    installed = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return installed[-1] if installed else None


def check_binary(binary: str | None) -> list[Check]:
    if binary is None or not Path(binary).exists():
        return [Check("server binary", "fail", "no PostgreSQL server binary found",
                      "start the server, or connect with -h/-p/-U")]  # fmt: skip
    checks = [Check("server binary", "ok", binary)]
    names = usdt.probe_names(binary)
    if (usdt.PROVIDER, "lwlock__wait__start") in names:
        checks.append(Check("usdt probes", "ok", f"{len(names)} USDT probes (--enable-dtrace)"))
    else:
        checks.append(
            Check("usdt probes", "warn", "built without --enable-dtrace (no lwlock__wait__start)",
                  "install a build with probes (Debian, Ubuntu and PGDG packages have them)")
        )  # fmt: skip
    checks.append(_foreign_uprobes_check(binary, names))
    checks.append(_frame_pointer_check(binary))
    checks.append(_symbols_check(binary))
    return checks


def _foreign_uprobes_check(binary: str, names: frozenset[tuple[str, str]]) -> Check:
    """Uprobes of other tools on the server's USDT sites (uprobe_events): they block ours."""
    ours = tuple(sorted(name for provider, name in names if provider == usdt.PROVIDER))
    found = usdt.foreign_uprobes(binary, ours)
    if not found:
        return Check("other uprobes", "ok", "none on the server's USDT probe sites")
    fixes = sorted({f.describe().rpartition("remove it: ")[2] for f in found})
    return Check(
        "other uprobes",
        "warn",
        f"{len(found)} other uprobes on the server's USDT sites: "
        + "; ".join(f"{f.event} on {f.site.name} at 0x{f.site.offset:x}" for f in found)
        + " (while in use, the kernel refuses pgprobe's probes there: events are missed)",
        "; ".join(fixes),
    )


def _frame_pointer_check(binary: str) -> Check:
    share = frame_pointer_share(binary)
    if share is None:
        return Check("frame pointers", "warn", "could not inspect the binary")
    pct = f"{100 * share:.0f} % of exported functions start with push %rbp; mov %rsp,%rbp"
    if share >= fpcheck.HAS_FRAME_POINTERS:
        return Check("frame pointers", "ok", f"likely ({pct})")
    return Check(
        "frame pointers", "warn", f"probably omitted ({pct}): CPU stacks will be short",
        "a build with -fno-omit-frame-pointer gives whole stacks in flame graphs",
    )  # fmt: skip


def frame_pointer_share(binary: str) -> float | None:
    """Share of exported x86-64 functions whose prologue saves the frame pointer."""
    return fpcheck.frame_pointer_share(binary)


def _symbols_check(binary: str) -> Check:
    from pgprobe.symbolize import ElfImage

    try:
        with open(binary, "rb") as f:
            kind = ElfImage(f, binary, "/usr/lib/debug").symbols
    except OSError as exc:
        return Check("symbols", "warn", f"cannot read {binary}: {exc}")
    if kind == "symtab" or kind.startswith("debug file"):
        return Check("symbols", "ok", f"full symbols ({kind})")
    return Check(
        "symbols", "warn",
        "stripped (only .dynsym): static functions show as postgres+0x... in flame graphs",
        "install the server's debug symbols (e.g. postgresql-15-dbgsym from debian-debug)",
    )  # fmt: skip


def check_version(cluster: discover.Cluster | None, binary: str | None) -> Check:
    if cluster is not None:
        num, version = cluster.version_num, cluster.version
    elif binary is not None:
        try:
            num, version = discover.binary_version(binary)
        except PgprobeError as exc:
            return Check("postgresql version", "warn", exc.message)
    else:
        return Check("postgresql version", "fail", "no server found")
    if num and num < 130000:
        return Check("postgresql version", "fail", f"{version}: lwlocks needs 13 or later",
                     "upgrade; clog-reads and flame work on older servers")  # fmt: skip
    return Check("postgresql version", "ok", version)


def check_wait_event_address(cluster: discover.Cluster | None) -> Check:
    """What pgprobe waits reads: *my_wait_event_info, here from the postmaster's memory."""
    name = "wait event address"
    if cluster is None:
        return Check(name, "warn", "no running server to read it from")
    if cluster.version_num and cluster.version_num < address.MIN_MAJOR * 10000:
        return Check(name, "fail", f"{cluster.version}: waits needs {address.MIN_MAJOR} or later "
                     f"(no {address.SYMBOL})")  # fmt: skip
    pm = cluster.postmaster_pid
    try:
        where = address.find(pm, cluster.binary)
        pointer, value = address.read_current(pm, where)
    except PgprobeError as exc:
        return Check(name, "fail", exc.message)
    except OSError as exc:
        return Check(name, "fail", f"cannot read /proc/{pm}/mem: {exc.strerror}", "run as root")
    return Check(name, "ok", f"{address.SYMBOL} found at 0x{where.address:x}, "
                 f"read 0x{pointer:x} -> 0x{value:08x} (postmaster {pm})")  # fmt: skip
