"""What the overhead runs measure: workloads, ways of tracing, and which of them run where.

A configuration is one way of tracing (a pgprobe command with its options, or the perf
anchor) with the budget an issue set for it (minimum TPS ratio, with / without). A
configuration can need an option that another branch adds (`clog-reads --source
syscalls`): it then lists the variants to look for in `pgprobe TOOL --help`, and is
skipped, with a note, when none is there.

The full profile (`scripts/bench --full`) is the table PROFILE below: per workload, the
configurations and how many interleaved pairs each gets. Pairs go where budgets are tight
(>= 0.99: the most), fewer where they are looser (>= 0.98), few where a row is only a
comparison or a cost-per-fire measurement.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import common


@dataclass(frozen=True)
class Workload:
    key: str
    label: str
    args: tuple[str, ...]


TPCB = Workload("tpcb", "TPC-B-like: pgbench -c 8 -j 2", ("-c", "8", "-j", "2"))
SELECT = Workload("select", "select-only: pgbench -S -c 8 -j 2", ("-S", "-c", "8", "-j", "2"))
# bench.toggle --workload many: a mix of DISTINCT statements of distinct query ids, one at
# random per transaction (the worst case for the query dimension's per-task slots)
DISTINCT = 300
MANY = Workload("many", f"{DISTINCT} distinct statements: pgbench -c 8 -j 2, one at random",
                ("-c", "8", "-j", "2"))  # fmt: skip


def many_statements(root: Path) -> tuple[str, ...]:
    """pgbench -f arguments for a script that runs one of DISTINCT statements of distinct
    query ids at random (the select-only lookup with 1-20 columns and 0-14 more conditions:
    shapes, not constants, make an id; one script of \\if branches, as pgbench takes at most
    128 scripts), in the cluster's directory (pgbench runs as its owner)."""
    lines = ["\\set aid random(1, 100000 * :scale)", f"\\set k random(0, {DISTINCT - 1})"]
    for i in range(DISTINCT):
        columns = ", ".join(["abalance"] * (i % 20 + 1))
        more = " AND bid > 0" * (i // 20)
        lines.append(f"\\{'if' if i == 0 else 'elif'} :k = {i}")
        lines.append(f"SELECT {columns} FROM pgbench_accounts WHERE aid = :aid{more};")
    lines.append("\\endif")
    script = root / "many.sql"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o644)
    return ("-f", str(script))


# Heavy LWLock contention (issue 16 item 3): 32 clients on 2 CPUs updating the 2 branch rows
# of scale 2: WALWrite, WALInsert, BufferContent and LockManager waits by the ten thousand a
# second, with backends preempted while they hold LWLocks.
CONTENTION = Workload(
    "contention",
    "heavy LWLock contention: pgbench -c 32 -j 2 (TPC-B-like)",
    ("-c", "32", "-j", "2"),
)
WORKLOADS = (SELECT, TPCB, CONTENTION)


@dataclass(frozen=True)
class Config:
    """One way of tracing: a pgprobe command, or the perf anchor."""

    key: str
    label: str
    kind: str  # "pgprobe", "perf", or "bpftrace" (args: a script run bare, bench/bare.py)
    tool: str = ""  # the pgprobe command
    args: tuple[str, ...] = ()
    budget: float | None = None  # minimum TPS ratio (traced / untraced)
    # Alternatives for options another branch adds: the first whose regex matches
    # `pgprobe TOOL --help` is used (its args appended); none: the configuration is skipped.
    variants: tuple[tuple[str, tuple[str, ...]], ...] = ()
    issue: str = ""  # where the budget comes from

    def with_args(self, extra: tuple[str, ...]) -> Config:
        return Config(
            self.key,
            self.label,
            self.kind,
            self.tool,
            self.args + extra,
            self.budget,
            (),
            self.issue,
        )


PERF_CONFIG = Config("perf-99", "perf record -F 99 -g (anchor)", "perf")

CONFIGS = {
    c.key: c
    for c in (
        Config(
            "clog-reads",
            "clog-reads (default source)",
            "pgprobe",
            "clog-reads",
            (),
            0.99,
            issue="16",
        ),
        Config(
            "clog-reads-syscalls",
            "clog-reads --source syscalls (comparison)",
            "pgprobe",
            "clog-reads",
            variants=(
                (r"--source\b[^\n]*\n?[^\n]*syscall", ("--source", "syscalls")),
                (r"--syscalls\b", ("--syscalls",)),
            ),
            issue="16",
        ),
        # triage starts its SLRU part as clog_reads.start(every SLRU, aggregate): the same
        # capture as `clog-reads --slru all`, which is how its cost is measured alone. It is
        # the clog-reads row's capture too: the same script (clog_reads_uprobe.bt), probes
        # and fires (its 50 ms and 1 s timers; no uprobe fire without SLRU misses), only
        # INDEX_MASK differs, and it is tested after a trap that never happens; triage adds
        # no pg_stat_activity sampling or other probe to this part. The two rows are two
        # measurements of one cost: their gap (0.979 and 0.932 on select-only in the run of
        # 33b8d69, Welch t = 2.1 over 10 pairs each) is the bench's own spread.
        Config(
            "triage-slru",
            "triage's SLRU part (clog-reads --slru all; the clog-reads capture again)",
            "pgprobe",
            "clog-reads",
            ("--slru", "all"),
            0.99,
            issue="16",
        ),
        Config("waits", "waits (sched_switch)", "pgprobe", "waits", (), 0.98, issue="14"),
        # The same time model from the bpftrace script, for comparison in the same run.
        Config(
            "waits-bt",
            "waits --engine bpftrace (bpf/waits.bt, comparison)",
            "pgprobe",
            "waits",
            ("--engine", "bpftrace"),
            issue="14",
        ),
        # What any design on sched_switch + sched_wakeup pays before doing anything: the
        # part of waits' cost that no change to waits.bt's programs can remove.
        Config(
            "sched-floor",
            "floor: empty sched_switch + sched_wakeup programs (bpftrace, comparison)",
            "bpftrace",
            args=("bench/sched_floor.bt",),
            issue="14",
        ),
        # A prototype of waits.bt's next design (switch-out only, on the kernel's counters),
        # for its cost: $1 and $2 (postmaster, address) are added by bench.bare.
        Config(
            "sched-switchout",
            "prototype: switch-out only on kernel counters (bpftrace, comparison)",
            "bpftrace",
            args=("bench/sched_switchout.bt", "POSTMASTER"),
            issue="14",
        ),
        Config(
            "flame-fp",
            "flame 99 Hz --unwind fp",
            "pgprobe",
            "flame",
            ("-F", "99", "--unwind", "fp"),
            0.98,
            issue="15",
        ),
        Config(
            "flame-dwarf",
            "flame 99 Hz --unwind dwarf",
            "pgprobe",
            "flame",
            ("-F", "99", "--unwind", "dwarf"),
            0.98,
            issue="15",
        ),
        Config(
            "lwlocks",
            "lwlocks (USDT)",
            "pgprobe",
            "lwlocks",
            # the USDT source asked for by name, its guard off (the row measures the cost
            # per fire over whole windows); a pgprobe without --source has only USDT
            variants=(
                (r"--max-events-per-sec", ("--source", "usdt", "--max-events-per-sec", "0")),
                (r"--source\b[^\n]*usdt", ("--source", "usdt")),
                (r"", ()),
            ),
            issue="16",
        ),
        Config("triage", "triage (all parts)", "pgprobe", "triage", ()),
        PERF_CONFIG,
    )
}

# Pairs per (workload, configuration) in the full profile, by what the row must decide.
PAIRS_TIGHT = 10  # budget >= 0.99
PAIRS_LOOSE = 7  # budget >= 0.98
PAIRS_COST = 4  # no budget: cost per fire and a ratio for reference
PAIRS_COMPARISON = 3

PROFILE: dict[str, tuple[tuple[str, int], ...]] = {
    "select": (
        ("clog-reads", PAIRS_TIGHT),
        ("triage-slru", PAIRS_TIGHT),
        ("clog-reads-syscalls", PAIRS_COMPARISON),
        ("waits", PAIRS_LOOSE),
        ("waits-bt", PAIRS_COMPARISON),
        ("sched-floor", PAIRS_COMPARISON),
        ("sched-switchout", PAIRS_COMPARISON),
        ("flame-fp", PAIRS_LOOSE),
        ("flame-dwarf", PAIRS_LOOSE),
    ),
    "tpcb": (
        ("waits", PAIRS_LOOSE),
        ("flame-fp", PAIRS_LOOSE),
        ("flame-dwarf", PAIRS_LOOSE),
    ),
    "contention": (
        ("lwlocks", PAIRS_COST),
        ("waits", 2),
    ),
}
# After the tpcb windows: one whole-cluster flame --unwind dwarf capture of this length, to
# time its finish (issue 15: <= 3 s for a 30 s capture).
LONG_CAPTURE = ("tpcb", "flame-dwarf", 30)


def _help(tool: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pgprobe", *([tool] if tool else []), "--help"],
        capture_output=True,
        text=True,
        cwd=common.RUN_DIR,
    )
    return done.stdout


def resolve(
    config: Config, helps: dict[str, str], commands: str
) -> tuple[Config | None, str | None]:
    """The configuration ready to run (its variant chosen), or None and why not."""
    if config.kind != "pgprobe":
        return config, None
    if not re.search(rf"^\s+{re.escape(config.tool)}\s", commands, re.M):
        return None, f"`{config.key}`: skipped, `pgprobe --help` does not list `{config.tool}`"
    if not config.variants:
        return config, None
    text = helps.get(config.tool, "")
    for pattern, extra in config.variants:
        if re.search(pattern, text):
            return config.with_args(extra), None
    return None, (
        f"`{config.key}`: skipped, `pgprobe {config.tool} --help` has none of the options it "
        f"needs ({', '.join(' '.join(v[1]) for v in config.variants)})"
    )


def choose(keys: list[str], with_perf: bool) -> tuple[dict[str, Config], list[str]]:
    """The configurations among `keys` that this checkout can run, and notes on the others."""
    commands = _help("")
    tools = {CONFIGS[k].tool for k in keys if k in CONFIGS and CONFIGS[k].variants}
    helps = {t: _help(t) for t in tools}
    chosen: dict[str, Config] = {}
    notes: list[str] = []
    for key in keys:
        if key == PERF_CONFIG.key:
            if not with_perf:
                continue
            ok, why = common.perf_works()
            if ok:
                chosen[key] = PERF_CONFIG
            else:
                notes.append(f"perf anchor: skipped, {why}")
            continue
        config, note = resolve(CONFIGS[key], helps, commands)
        if config is not None:
            chosen[key] = config
        if note:
            notes.append(note)
    return chosen, notes
