"""docs/benchmarks.md and the budgets.

Long because every table of docs/benchmarks.md is written here, beside the budgets.

The bench writes its results between two marker lines of docs/benchmarks.md and
leaves the rest of the file (the hand-written method and analysis) alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bench import common, stats
from bench.overhead import Summary, WorkloadResult
from bench.probe_cost import ProbeCostResult
from bench.render import RenderResult, Timed
from bench.symbolize import SymbolizeResult

BEGIN = "<!-- bench:begin: written by scripts/bench, edits between these lines are lost -->"
END = "<!-- bench:end -->"

ATTACH_BUDGET_S = 1.0
FINISH_BUDGET_S = 1.5
RENDER_BUDGET_S = 0.5
RSS_BUDGET_MIB = 150.0


@dataclass
class Budget:
    what: str
    limit: str
    measured: str
    met: bool
    # "met" / "missed", or "undecided" when the ratio's 95 % interval straddles the budget
    verdict: str = ""

    def __post_init__(self) -> None:
        self.verdict = self.verdict or ("met" if self.met else "missed")


@dataclass
class Run:
    """Everything one run of the bench found."""

    started: str  # ISO date and time, UTC
    mode: str  # "full" or "quick"
    elapsed_min: float
    machine: dict[str, str]
    loadavg_before: tuple[float, float, float]
    quiet: str  # what the wait for a quiet machine gave
    pairs: int
    seconds: int
    workloads: list[WorkloadResult] = field(default_factory=list)
    summaries: list[Summary] = field(default_factory=list)
    render: RenderResult | None = None
    symbolize: SymbolizeResult | None = None
    probe_cost: ProbeCostResult | None = None
    notes: list[str] = field(default_factory=list)
    untraced_tps: dict[str, float] = field(default_factory=dict)
    source: str = ""  # which code was measured


def _f(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else format(value, fmt) + unit


def _range(values: Iterable[float], fmt: str) -> str:
    got = list(values)
    if not got:
        return "-"
    med = common.median(got)
    assert med is not None
    if len(got) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} [{format(min(got), fmt)}–{format(max(got), fmt)}]"


def budgets(run: Run) -> list[Budget]:
    out: list[Budget] = []
    for s in run.summaries:
        if s.config.budget is None or s.ratio is None:
            continue
        iv = s.interval
        if iv is None:  # one pair: no interval, judged on the value alone
            out.append(
                Budget(
                    f"{s.config.label}, {s.workload.key}: TPS ratio (1 pair)",
                    f">= {s.config.budget:.2f}",
                    _range(s.ratios, ".3f"),
                    s.ratio >= s.config.budget,
                )
            )
            continue
        verdict = iv.verdict(s.config.budget)
        out.append(
            Budget(
                f"{s.config.label}, {s.workload.key}: TPS ratio (geometric mean, 95 % CI)",
                f">= {s.config.budget:.2f}",
                iv.text(),
                verdict != "missed",
                verdict,
            )
        )
    for s in run.summaries:
        if s.config.kind != "pgprobe" or not s.runs:
            continue
        name = f"{s.config.label}, {s.workload.key}"
        attach = s.med("start_to_attach_s")
        if attach is not None:
            out.append(
                Budget(
                    f"{name}: start to probes attached (median)",
                    f"<= {ATTACH_BUDGET_S:.1f} s",
                    f"{attach:.2f} s",
                    attach <= ATTACH_BUDGET_S,
                )
            )
        finish = s.med("finish_s")
        if finish is not None:
            out.append(
                Budget(
                    f"{name}: Ctrl-C to output written (median)",
                    f"<= {FINISH_BUDGET_S:.1f} s",
                    f"{finish:.2f} s",
                    finish <= FINISH_BUDGET_S,
                )
            )
        rss = s.peak("rss_mib")
        if rss is not None:
            out.append(
                Budget(
                    f"{name}: pgprobe peak RSS (max)",
                    f"<= {RSS_BUDGET_MIB:.0f} MiB",
                    f"{rss:.0f} MiB",
                    rss <= RSS_BUDGET_MIB,
                )
            )
    r = run.render
    if r is not None and r.command.wall is not None:
        out.append(
            Budget(
                "render 50k stacks: `pgprobe flame --from` wall (median)",
                f"<= {RENDER_BUDGET_S:.1f} s",
                f"{r.command.wall:.3f} s",
                r.command.wall <= RENDER_BUDGET_S,
            )
        )
        peak = r.command.peak_rss
        assert peak is not None
        out.append(
            Budget(
                "render 50k stacks: peak RSS (max)",
                f"<= {RSS_BUDGET_MIB:.0f} MiB",
                f"{peak:.0f} MiB",
                peak <= RSS_BUDGET_MIB,
            )
        )
    return out


def overhead_table(run: Run) -> list[str]:
    lines = [
        "| tool | workload | TPS ratio median [min–max] | geometric mean [95 % CI] "
        "| resolves ± | pairs for ± 2 % | pairs | events/s | attach s | finish s | RSS MiB |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in run.summaries:
        if not s.runs:
            continue
        iv = s.interval
        needed = stats.pairs_needed(s.ratios, 2.0)
        lines.append(
            f"| {s.config.label} | {s.workload.label} | {_range(s.ratios, '.3f')} "
            f"| {iv.text() if iv else '-'} | {_f(iv.half_width_pct if iv else None, '.1f', ' %')} "
            f"| {_f(needed, ',d')} "
            f"| {len(s.ratios)} | {_f(s.med('events_per_s'), ',.0f')} "
            f"| {_f(s.med('start_to_attach_s'), '.2f')} | {_f(s.med('finish_s'), '.2f')} "
            f"| {_f(s.peak('rss_mib'), '.0f')} |"
        )
    return lines


def cost_table(run: Run) -> list[str]:
    lines = [
        "| tool | workload | CPU/transaction traced/untraced median [min–max] "
        "| probe fires/s | switches/s | BPF ns/fire | extra CPU µs/fire "
        "| tool CPU % | pgprobe start s | bpftrace attach s | bpftrace RSS MiB | lost "
        "| seconds dropped |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in run.summaries:
        if not s.runs:
            continue
        switches = common.median(r.window.switches_per_s for r in s.runs if r.window)
        lost = sum(r.lost for r in s.runs)
        lines.append(
            f"| {s.config.label} | {s.workload.key} | {_range(s.cpu_ratios, '.3f')} "
            f"| {_f(s.med('fires_per_s'), ',.0f')} | {_f(switches, ',.0f')} "
            f"| {_f(s.med('bpf_ns_per_fire'), ',.0f')} | {_f(s.extra_cpu_us_per_fire, '.2f')} "
            f"| {_f(s.med('tool_cpu_pct'), '.1f')} | {_f(s.med('spawn_s'), '.2f')} "
            f"| {_f(s.med('attach_s'), '.2f')} "
            f"| {_f(s.peak('tracer_rss_mib'), '.0f')} | {lost:,} "
            f"| {sum(r.dropped_intervals for r in s.runs)} |"
        )
    return lines


def probe_cost_section(run: Run) -> list[str]:
    """The mechanism's cost per fire, and each tool's modelled cost from it."""
    pc = run.probe_cost
    if pc is None:
        return []
    lines = [
        "### Cost per probe fire",
        "",
        "Measured directly (bench/probe_cost.py): thread CPU time per iteration of a small C "
        "program, traced minus untraced, medians of interleaved rounds. CPU time, so other "
        "load on the machine does not count in it.",
        "",
        "| mechanism | probe | ns per fire |",
        "| --- | --- | ---: |",
    ]
    for m in pc.mechanisms:
        lines.append(f"| {m.name} | `{m.probe}` | {_f(m.ns_per_fire, ',.0f')} |")
    lines += ["", *[f"- {n}" for n in pc.notes]] if pc.notes else []
    lines += [
        "",
        "Modelled cost of each tool: probe fires/s × (BPF ns per fire, measured with "
        "kernel.bpf_stats_enabled during its traced windows) as a share of the CPU time the "
        "untraced workload used. This leaves out the trap or tracepoint dispatch, which the "
        "table above gives per mechanism; it resolves far below the TPS ratio's noise.",
        "",
        "| tool | workload | probe fires/s | BPF ns/fire | BPF CPU ms/s "
        "| share of the workload's CPU |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for s in run.summaries:
        fires, ns = s.med("fires_per_s"), s.med("bpf_ns_per_fire")
        if fires is None or ns is None or s.busy_cpus is None or not s.busy_cpus:
            continue
        ms = fires * ns / 1e6
        lines.append(
            f"| {s.config.label} | {s.workload.key} | {fires:,.0f} | {ns:,.0f} | {ms:.2f} "
            f"| {ms / (s.busy_cpus * 1000) * 100:.2f} % |"
        )
    return lines + [""]


def _timed_row(name: str, t: Timed) -> str:
    return (
        f"| {name} | {_range(t.walls, '.3f')} | {_f(common.median(t.cpu), '.3f')} "
        f"| {_f(t.peak_rss, '.1f')} |"
    )


def render_section(run: Run) -> list[str]:
    r = run.render
    lines: list[str] = []
    if r is None:
        return lines
    if not r.stacks:
        return [f"- {n}" for n in r.notes]
    lines += [
        f"Input: {r.input}: {r.stacks:,} unique stacks, {r.samples:,} samples, "
        f"{r.input_mib:.1f} MiB; {len(r.command.walls)} runs each.",
        "",
        "| renderer | wall s median [min–max] | CPU s (median) | peak RSS MiB |",
        "| --- | ---: | ---: | ---: |",
        _timed_row("`pgprobe flame --from FILE -o out.svg` (whole process)", r.command),
        f"| `render_svg(Path)` in process, first call / median of all calls "
        f"| {_f(r.inprocess_first_s, '.3f')} / {_f(r.inprocess_median_s, '.3f')} | "
        f"| {_f(r.inprocess_rss_mib, '.1f')} |",
    ]
    if r.inferno is not None:
        lines.append(_timed_row(f"inferno-flamegraph ({r.inferno_note}, anchor)", r.inferno))
    else:
        lines.append(f"| inferno-flamegraph: {r.inferno_note} | - | - | - |")
    lines += ["", f"SVG written by pgprobe: {r.svg_mib:.2f} MiB."]
    return lines


def symbolize_section(run: Run) -> list[str]:
    s = run.symbolize
    if s is None:
        return []
    if s.note:
        return [f"- {s.note}"]
    per_frame_cold = s.cold_s / s.frames * 1e9
    return [
        f"{s.stacks:,} raw stacks of 30 frames ({s.frames:,} frames, {s.distinct:,} distinct "
        f"addresses in {s.modules} of a live backend), one fresh process:",
        "",
        "| pass | seconds | stacks/s | ns/frame |",
        "| --- | ---: | ---: | ---: |",
        f"| first stack (parses the ELF files) | {s.first_s:.3f} | | |",
        f"| all stacks, fresh Symbolizer (first included) | {s.cold_s:.3f} "
        f"| {s.stacks / s.cold_s:,.0f} | {per_frame_cold:,.0f} |",
        f"| all stacks again (addresses cached) | {s.warm_s:.3f} "
        f"| {s.stacks / s.warm_s:,.0f} | {s.warm_s / s.frames * 1e9:,.0f} |",
        "",
        f"Peak RSS {s.rss_mib:.1f} MiB; {s.named_pct:.1f} % of the frames named "
        "(the rest are `postgres+0x...` function starts from .eh_frame: Debian's server "
        "binary keeps only .dynsym).",
    ]


def load_section(run: Run) -> list[str]:
    lines = [
        f"- Before the run: load average {run.loadavg_before[0]:.2f} / "
        f"{run.loadavg_before[1]:.2f} / {run.loadavg_before[2]:.2f} (1 / 5 / 15 min). "
        f"{run.quiet}",
    ]
    for w in run.workloads:
        kinds: dict[str, int] = {}
        for proc in w.foreign_processes:
            kinds[proc.split("[")[0]] = kinds.get(proc.split("[")[0], 0) + 1
        others = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
        lines.append(
            f"- {w.workload.label}: {w.elapsed_s / 60:.1f} min; other processes used "
            f"{_f(w.foreign_cpu_pct, '.1f', ' %')} of the machine's CPU time (all CPU time "
            "less the cluster's, pgbench's and the tools'); other sessions' pgbench/bpftrace/perf "
            f"processes seen between windows: {others}."
        )
    return lines


def generated(run: Run) -> str:
    m = run.machine
    lines = [
        BEGIN,
        "## Results of the last run",
        "",
        f"Run {run.started} UTC, `scripts/bench{' --quick' if run.mode == 'quick' else ''}`, "
        f"{run.elapsed_min:.1f} min: {run.pairs} pairs per tool and workload, windows of "
        f"{run.seconds} s. Code: {run.source}.",
        "",
        f"Machine: {m.get('os')}, kernel {m.get('kernel')}, {m.get('cpus')} CPUs, "
        f"{m.get('memory')}; {m.get('postgresql')}; {m.get('bpftrace')}; Python "
        f"{m.get('python')}; {m.get('perf')}; {m.get('inferno')}.",
        "",
        "Load:",
        "",
        *load_section(run),
        "",
        "### Overhead on the traced server",
        "",
        *overhead_table(run),
        "",
    ]
    for key, tps in run.untraced_tps.items():
        lines.append(f"- Untraced throughput, {key}: {tps:,.0f} tps (median window).")
    busy = [f"{w.workload.key} {common.median(x.busy_cpus for x in w.untraced):.2f}"
            for w in run.workloads if w.untraced]  # fmt: skip
    if busy:
        lines.append(
            f"- CPUs busy machine-wide in the untraced windows (of {common.NCPU}): "
            + ", ".join(busy)
            + "."
        )
    lines += [
        "",
        "### Probe cost",
        "",
        *cost_table(run),
        "",
        *probe_cost_section(run),
        "### Render",
        "",
        *render_section(run),
        "",
        "### Symbolize",
        "",
        *symbolize_section(run),
        "",
        "### Budgets",
        "",
        "| budget | limit | measured | |",
        "| --- | --- | --- | --- |",
    ]
    for b in budgets(run):
        shown = {"met": "met", "missed": "MISSED", "undecided": "undecided (CI straddles)"}
        lines.append(f"| {b.what} | {b.limit} | {b.measured} | {shown[b.verdict]} |")
    if run.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in run.notes]
    failed = [f for w in run.workloads for f in w.failed]
    if failed:
        lines += ["", "Failed traced windows:", ""]
        lines += [f"- {f.config}: {f.error.strip()[:300]}" for f in failed]
    lines.append(END)
    return "\n".join(lines) + "\n"


DEFAULT_HEAD = """# Benchmarks

What pgprobe costs the server it traces, how fast it starts and finishes, and how fast it
renders. `scripts/bench` measures it and rewrites the section between the markers below;
method and analysis are in the rest of this page.

"""


def write(path: Path, run: Run) -> None:
    text = path.read_text() if path.exists() else DEFAULT_HEAD + BEGIN + "\n" + END + "\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + generated(run).rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + generated(run)
    path.write_text(text)
