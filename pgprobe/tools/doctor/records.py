"""What `pgprobe doctor` finds: one Check per line, which tools a failure stops, the verdict.

Pure: the checks themselves are in machine.py and server.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    "backend state address": (),  # waits runs; idle in transaction is then "unknown"
    "waits compiled": (),  # waits runs bpf/waits.bt instead
    "sampler compiled": (),  # flame and hot run bpf/profile.bt instead
    "slru compiled": (),  # clog-reads runs bpf/clog_reads_uprobe.bt instead
    "lwlocks compiled": (),  # lwlocks --source usdt runs bpf/lwlock_wait.bt instead
}
# The tools that no longer need bpftrace (the tracer checks) where these compiled objects
# all load: they then run from them (pgprobe.engines.compiled). lwlocks' default source is
# the time model's, clog-reads' the SLRU uprobe's; triage's parts are the three.
SPARED_BY = {
    "flame": ("sampler compiled",),
    "hot": ("sampler compiled",),
    "waits": ("waits compiled",),
    "lwlocks": ("waits compiled",),
    "clog-reads": ("slru compiled",),
    "triage": ("waits compiled", "sampler compiled", "slru compiled"),
}
# The checks bpftrace makes (not tried without it); a compiled object's own attach says
# at each capture whether its kind of probe works.
TRACER_CHECKS = ("bpftrace", "tracepoints", "perf sampling", "uprobes")
# A tool that still runs, with a part left out, when another tool cannot run.
IN_PART = {
    "waits compiled": {
        "waits": "from bpf/waits.bt: about twice the cost per context switch",
        "lwlocks": "from bpf/waits.bt: LWLock sleeps, without the runqueue time after them "
        "or their mode",
    },
    "sampler compiled": {
        "flame": "from bpf/profile.bt: a bpftrace process (~100 MiB) and its stack map",
        "hot": "from bpf/profile.bt: a bpftrace process (~100 MiB) and its stack map",
    },
    "slru compiled": {
        "clog-reads": "from bpf/clog_reads_uprobe.bt: a bpftrace process (~100 MiB)",
    },
    "lwlocks compiled": {
        "lwlocks": "--source usdt from bpf/lwlock_wait.bt: a bpftrace process (~100 MiB)",
    },
    "bpftrace": {  # what only the scripts do, where the rest runs from the objects
        "waits": "without --stacks",
        "clog-reads": "without --stacks, --trace or --source syscalls",
    },
    "usdt probes": {
        "lwlocks": "without --source usdt (exact counts per wait)",
        "triage": "without its LWLock table",
    },
}


@dataclass
class Check:
    check: str
    status: str  # ok, warn, fail, info
    detail: str
    fix: str = ""
    affects: list[str] = field(default_factory=list)


def spare(checks: list[Check]) -> None:
    """The tools whose compiled object works here taken off the tracer checks' affects."""
    working = {c.check for c in checks if c.status == "ok"}
    spared = {tool for tool, needed in SPARED_BY.items() if set(needed) <= working}
    for c in checks:
        if c.check in TRACER_CHECKS:
            c.affects = [tool for tool in c.affects if tool not in spared]


def assess(checks: list[Check]) -> tuple[list[str], dict[str, str]]:
    """(tools that cannot run, {tool that runs in part: what is left out})."""
    blocked = sorted({tool for c in checks if c.status == "fail" for tool in c.affects})
    missing = {c.check for c in checks if c.status in ("fail", "warn")}
    partial = {
        t: why
        for check, tools in IN_PART.items()
        if check in missing
        for t, why in tools.items()
        if t not in blocked
    }
    return blocked, partial


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
