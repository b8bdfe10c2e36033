"""docs/benchmarks.md and docs/overhead.md's Overhead table, from a run's JSON (bench/results.py).

    .venv/bin/python -m bench.report [docs/benchmarks.json]   # re-render both from a run

Long because every table of docs/benchmarks.md is written here, one function each.

Only the text between the marker lines is rewritten: in docs/benchmarks.md between
BEGIN and END (the hand-written method and analysis around them, and the soak section
between `<!-- soak:start -->` and `<!-- soak:end -->`, stay as they are, wherever they
are); in docs/overhead.md between OVERHEAD_BEGIN and OVERHEAD_END.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench import common, results

BEGIN = "<!-- bench:begin: written by scripts/bench, edits between these lines are lost -->"
END = "<!-- bench:end -->"
OVERHEAD_BEGIN = "<!-- overhead-table:begin: written by scripts/bench from docs/benchmarks.json -->"
OVERHEAD_END = "<!-- overhead-table:end -->"
SOAK = re.compile(r"<!-- soak:start -->.*?<!-- soak:end -->\n?", re.S)
SHOWN = {"met": "met", "missed": "**MISSED**", "undecided": "undecided"}

Doc = dict[str, Any]


def _f(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else format(value, fmt) + unit


def _range(values: Iterable[float], fmt: str) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    med = common.median(got)
    assert med is not None
    if len(got) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} [{format(min(got), fmt)}–{format(max(got), fmt)}]"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.2f} %"


def _iv(iv: dict[str, Any] | None) -> str:
    return "-" if iv is None else f"{iv['mean']:.3f} [{iv['low']:.3f}–{iv['high']:.3f}]"


def header(doc: Doc) -> list[str]:
    m = doc["machine"]
    load = doc["loadavg_before"]
    lines = [
        "## Results of the last run",
        "",
        f"Run {doc['started']} UTC, `{doc['command']}`, {doc['elapsed_min']:.1f} min; windows "
        f"of {doc['seconds']} s. Code: {doc['source']}. Every figure below comes from "
        "[benchmarks.json](benchmarks.json) (`python -m bench.report` re-renders it).",
        "",
        f"Machine: {m.get('os')}, kernel {m.get('kernel')}, {m.get('cpus')} CPUs, "
        f"{m.get('memory')}; {m.get('postgresql')}; {m.get('bpftrace')}; Python "
        f"{m.get('python')}; {m.get('perf')}.",
        "",
        f"- Before the run: load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}. "
        f"{doc['quiet']}",
    ]
    for w in doc["workloads"]:
        others = ", ".join(w["foreign_processes"]) or "none"
        lines.append(
            f"- {w['label']}: {w['elapsed_s'] / 60:.1f} min, untraced "
            f"{_f(w['untraced_tps'], ',.0f')} tps, {_f(w['busy_cpus'], '.2f')} CPUs busy, "
            f"{_f(w['switches_per_s'], ',.0f')} "
            f"context switches/s; other processes {_f(w['foreign_cpu_pct'], '.1f', ' %')} of "
            f"the CPU time; other pgbench/bpftrace/perf seen: {others}."
            + (
                f" The time box ended it after {w['cut_at_cycle']} cycles."
                if w["cut_at_cycle"]
                else ""
            )
        )
    return lines


def budget_table(doc: Doc) -> list[str]:
    lines = [
        "### Budgets",
        "",
        "TPS ratios: met when the whole 95 % interval is at or above the budget, missed when "
        "it is all below; where it straddles the budget, the measured cost per probe fire "
        "decides when every probe's mechanism was measured (column *decided by*).",
        "",
        "| budget | limit | measured | verdict | decided by |",
        "| --- | --- | --- | --- | --- |",
    ]
    for b in doc["budgets"]:
        lines.append(
            f"| {b['what']} | {b['limit']} | {b['measured']} | {SHOWN[b['verdict']]} "
            f"| {b['decided_by']} |"
        )
    return lines


def overhead_table(doc: Doc) -> list[str]:
    lines = [
        "### TPS ratio, with the tool / without (interleaved pairs)",
        "",
        "| tool | workload | geometric mean [95 % CI] | resolves ± | pairs | pairs for ± 2 % "
        "| median [min–max] | CPU/tx ratio | events/s | attach s | finish s | RSS MiB |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for w in doc["workloads"]:
        for r in w["rows"]:
            iv = r["interval"]
            med = r["median"]
            lines.append(
                f"| {r['label']} | {w['key']} | {_iv(iv)} "
                f"| {_f(iv['half_width_pct'] if iv else None, '.1f', ' %')} | {len(r['ratios'])} "
                f"| {_f(r['pairs_needed_2pct'], ',d')} | {_range(r['ratios'], '.3f')} "
                f"| {_range(r['cpu_ratios'], '.3f')} | {_f(med.get('events_per_s'), ',.0f')} "
                f"| {_f(med.get('start_to_attach_s'), '.2f')} | {_f(med.get('finish_s'), '.2f')} "
                f"| {_f(r['peak_rss_mib'], '.0f')} |"
            )
    return lines


def cost_table(doc: Doc) -> list[str]:
    mech = results.mechanism_ns(doc.get("probe_cost"))
    lines = [
        "### Cost per probe fire",
        "",
        "Per BPF program, medians of the traced windows: fires/s and BPF ns per fire from "
        "kernel BPF statistics; the mechanism (uprobe trap, tracepoint dispatch) from "
        "bench/probe_cost.py below. CPU ms/s = fires/s × (BPF + mechanism ns) + pgprobe's "
        "and its tracers' own CPU; share = of the CPU the untraced workload used.",
        "",
        "| tool | workload | program (kind) | fires/s | BPF ns/fire | mechanism ns/fire "
        "| context switches/s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for w in doc["workloads"]:
        for r in w["rows"]:
            for p in r["programs"]:
                lines.append(
                    f"| {r['label']} | {w['key']} | `{p['name']}` ({p['kind']}) "
                    f"| {_f(p['fires_per_s'], ',.0f')} | {_f(p['bpf_ns_per_fire'], ',.0f')} "
                    f"| {_f(mech.get(p['kind']), ',.0f')} | {_f(r['switches_per_s'], ',.0f')} |"
                )
    lines += [
        "",
        "| tool | workload | BPF ms/s | mechanism ms/s | pgprobe + tracers ms/s | total ms/s "
        "| share of workload CPU | ratio it implies |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in doc["workloads"]:
        for r in w["rows"]:
            c = r.get("cost")
            if not c:
                continue
            share = c["share_of_workload_cpu"]
            note = (
                f" (not modelled: {', '.join(c['unmodelled_kinds'])})"
                if c["unmodelled_kinds"]
                else ""
            )
            lines.append(
                f"| {r['label']} | {w['key']} | {c['bpf_ms_per_s']:.2f} "
                f"| {c['mechanism_ms_per_s']:.2f} | {c['tool_ms_per_s']:.2f} "
                f"| {c['total_ms_per_s']:.2f} | {_pct(share)} "
                f"| {_f(c['implied_ratio'], '.4f')}{note} |"
            )
    return lines


def probe_cost_section(doc: Doc) -> list[str]:
    pc = doc.get("probe_cost")
    if not pc:
        return []
    lines = [
        "### The mechanisms, per fire",
        "",
        "Thread CPU time per iteration of a small C program (bench/probe_cost.c), traced minus "
        "untraced, medians of interleaved rounds: CPU time, so other load does not count.",
        "",
        "| mechanism | probe | ns per fire |",
        "| --- | --- | ---: |",
    ]
    lines += [
        f"| {m['name']} | `{m['probe']}` | {_f(m['ns_per_fire'], ',.0f')} |"
        for m in pc["mechanisms"]
    ]
    return lines + switch_section(pc) + [f"- {n}" for n in pc["notes"]]


def switch_section(pc: Doc) -> list[str]:
    """ns per context switch: the floor, the filter, waits.bt (issue 14)."""
    switches = pc.get("switches") or []
    if not switches:
        return []
    lines = [
        "",
        "### ns per context switch: floor, filter, waits.bt",
        "",
        "Two processes pinned to one CPU ping-pong over pipes (bench/probe_cost.c `switch`, "
        "one wakeup per switch): CPU time per switch traced minus untraced, median of "
        "interleaved rounds; BPF ns from kernel BPF statistics (per switch of the ping-pong: "
        "an upper bound, the programs also ran for the rest of the machine; per fire: exact).",
        "",
        "| variant | ns per context switch | BPF ns per switch | BPF ns per fire |",
        "| --- | ---: | ---: | --- |",
    ]
    for c in switches:
        fires = ", ".join(
            f"{name} {_f(ns, ',.0f')}"
            for name, ns in c["bpf_ns_per_fire"].items()
            if name.startswith("sched_switch") or name.startswith("sched_wakeup")
        )
        lines.append(
            f"| {c['label']} | {_f(c['ns_per_switch'], ',.0f')} "
            f"| {_f(c['bpf_ns_per_switch'], ',.0f')} | {fires or '-'} |"
        )
    return lines


def dwarf_section(doc: Doc) -> list[str]:
    lines = ["### flame --unwind dwarf: bytes per sample and time to finish", ""]
    found = False
    for w in doc["workloads"]:
        for r in w["rows"]:
            if r["meta"].get("unwind") == "dwarf" or "bytes_per_sample" in r["meta"]:
                m = r["meta"]
                found = True
                lines.append(
                    f"- {r['label']}, {w['key']} (medians of {len(r['ratios'])} windows): "
                    f"{_f(m.get('bytes_per_sample'), ',.0f')} bytes of perf.data per sample, "
                    f"perf stopped in {_f(m.get('perf_stop_s'), '.2f')} s, unwinding took "
                    f"{_f(m.get('unwind_cpu_s'), '.2f')} CPU s, finish "
                    f"{_f(r['median'].get('finish_s'), '.2f')} s."
                )
        for run in w["long_runs"]:
            found = True
            m = run["meta"]
            lines.append(
                f"- {run['config']}, {w['key']}, one {run['seconds'] or '?'} s capture of the "
                f"whole cluster: finish {_f(run['finish_s'], '.2f')} s (Ctrl-C to output written), "
                f"{_f(m.get('samples_taken', m.get('samples')), ',.0f')} samples, "
                f"{_f(m.get('bytes_per_sample'), ',.0f')} bytes per sample, perf stop "
                f"{_f(m.get('perf_stop_s'), '.2f')} s, unwinding "
                f"{_f(m.get('unwind_cpu_s'), '.2f')} CPU s."
                + ("" if run["ok"] else f" FAILED: {run['error']}")
            )
    return lines if found else []


def guard_section(doc: Doc) -> list[str]:
    g = doc.get("lwlocks_guard")
    if not g:
        return []
    lines = ["### lwlocks under heavy contention: is a `--max-events-per-sec` guard needed?", ""]
    if not g["decided"]:
        return lines + [f"Not decided: {g['why']}."]
    share = g["share_of_workload_cpu"]
    lines.append(
        f"{g['fires_per_s']:,.0f} probe fires/s at about {g['ns_per_fire_all_in']:,} ns each "
        f"(BPF + uprobe trap): {share * 100:.2f} % of the workload's CPU; TPS ratio "
        f"{_iv(g['tps_interval'])}. At 100,000 waits/s (200,000 fires/s) that would be "
        f"{g['cpus_at_100k_waits_per_s']:.2f} CPUs. Rule: {g['rule']}. "
        f"**Guard {'needed' if g['needed'] else 'not needed'}** by that rule."
    )
    return lines


def _slowest_phases(runs: list[dict[str, Any]], top: int = 3) -> str:
    """The phases (pgprobe's PGPROBE_TIMINGS marks) that took the most wall time."""
    walls: dict[str, list[float]] = {}
    for r in runs:
        for p in r.get("phases", []):
            walls.setdefault(str(p["phase"]), []).append(float(p["wall_s"]))
    medians = {k: common.median(v) or 0.0 for k, v in walls.items()}
    slowest = sorted(medians.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{k} {v:.2f}" for k, v in slowest) or "-"


def answer_section(doc: Doc) -> list[str]:
    a = doc.get("answer") or {}
    lines = ["### Time to answer (`-d 1`, whole command, bench/answer.py)", ""]
    if a.get("status") != "measured":
        return lines + [f"Not measured: {a.get('note') or a.get('status')}."]
    lines += [
        "| tool | backends | wall s median [min–max] | CPU s median | runs failed "
        "| slowest phases (median wall s) |",
        "| --- | --- | --- | ---: | ---: | --- |",
    ]
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in a["results"]:
        groups.setdefault((r["tool"], r.get("idle", 0), r.get("active", 0)), []).append(r)
    for (tool, idle, active), runs in groups.items():
        lines.append(
            f"| {tool} | {idle} idle + {active} active "
            f"| {_range((r['wall_s'] for r in runs), '.2f')} "
            f"| {_f(common.median(r['cpu_s'] for r in runs), '.2f')} "
            f"| {sum(1 for r in runs if r.get('exit') != 0)} | {_slowest_phases(runs)} |"
        )
    return lines + ([f"- {a['note']}"] if a.get("note") else [])


def serve_section(doc: Doc) -> list[str]:
    s = doc.get("serve") or {}
    lines = ["### `pgprobe serve` at its default rates", ""]
    if s.get("status") != "measured":
        return lines + [f"Not measured: {s.get('note') or s.get('status')}."]
    lines += [f"From {s['note']}:", "", "| figure | value |", "| --- | --- |"]
    for key, value in s["result"].items():
        lines.append(f"| {key} | {value} |")
    return lines


def render_section(doc: Doc) -> list[str]:
    r = doc.get("render")
    if not r:
        return []
    if not r["stacks"]:
        return ["### Render", ""] + [f"- {n}" for n in r["notes"]]
    c = r["command"]
    return [
        "### Render",
        "",
        f"{r['input']}: {r['stacks']:,} unique stacks, {r['samples']:,} samples; "
        f"{len(c['walls'])} runs. `pgprobe flame --from FILE -o out.svg`: wall "
        f"{_range(c['walls'], '.3f')} s, peak RSS {_f(c['peak_rss'], '.1f')} MiB; in process "
        f"{_f(r['inprocess_median_s'], '.3f')} s; SVG {r['svg_mib']:.2f} MiB.",
    ]


def symbolize_section(doc: Doc) -> list[str]:
    s = doc.get("symbolize")
    if not s:
        return []
    if s["note"]:
        return ["### Symbolize", "", f"- {s['note']}"]
    return [
        "### Symbolize",
        "",
        f"{s['stacks']:,} raw stacks of {s['frames'] // max(1, s['stacks'])} frames: first stack "
        f"{s['first_s']:.3f} s, all {s['cold_s']:.3f} s cold, {s['warm_s']:.3f} s warm; peak RSS "
        f"{s['rss_mib']:.1f} MiB; {s['named_pct']:.1f} % of frames named.",
    ]


def generated(doc: Doc) -> str:
    parts = [
        header(doc),
        budget_table(doc),
        overhead_table(doc),
        cost_table(doc),
        probe_cost_section(doc),
        dwarf_section(doc),
        guard_section(doc),
        answer_section(doc),
        serve_section(doc),
        render_section(doc),
        symbolize_section(doc),
    ]
    lines = [BEGIN]
    for part in parts:
        if part:
            lines += part + [""]
    if doc["notes"]:
        lines += ["Notes:", ""] + [f"- {n}" for n in doc["notes"]] + [""]
    failed = [(w["key"], f) for w in doc["workloads"] for f in w["failed"]]
    if failed:
        lines += ["Failed traced windows:", ""]
        lines += [f"- {key}, {f['config']}: {f['error']}" for key, f in failed] + [""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def overhead_page_table(doc: Doc) -> str:
    """docs/overhead.md's Overhead table: one row per tool and workload, with its verdict."""
    verdicts = {b["what"]: b for b in doc["budgets"]}
    lines = [
        OVERHEAD_BEGIN,
        f"Measured {doc['started']} UTC by `{doc['command']}` ({doc['machine'].get('cpus')} "
        "CPUs, both saturated by pgbench); details in [benchmarks.md](benchmarks.md).",
        "",
        "| tool | workload | TPS ratio [95 % CI] | budget | verdict | probe fires/s "
        "| CPU it costs (share of the server's) |",
        "| --- | --- | --- | --- | --- | ---: | ---: |",
    ]
    for w in doc["workloads"]:
        for r in w["rows"]:
            b = next(
                (
                    v
                    for k, v in verdicts.items()
                    if k.startswith(f"{r['label']}, {w['key']}: TPS ratio")
                ),
                None,
            )
            c = r.get("cost") or {}
            share = c.get("share_of_workload_cpu")
            budget = f">= {r['budget']:.2f}" if r["budget"] else "-"
            lines.append(
                f"| {r['label']} | {w['key']} | {_iv(r['interval'])} "
                f"| {budget} "
                f"| {SHOWN[b['verdict']] if b else '-'} "
                f"| {_f(r['median'].get('fires_per_s'), ',.0f')} "
                f"| {_pct(share)} |"
            )
    lines.append(OVERHEAD_END)
    return "\n".join(lines) + "\n"


def replace_between(text: str, begin: str, end: str, new: str) -> str:
    """text with the block from `begin` to `end` (inclusive) replaced by `new`, or `new`
    appended when the markers are missing."""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(end, 1)[1]
        return head + new.rstrip("\n") + tail
    return text.rstrip("\n") + "\n\n" + new


DEFAULT_HEAD = "# Benchmarks\n\n"


def write_benchmarks(path: Path, doc: Doc) -> None:
    text = path.read_text() if path.exists() else DEFAULT_HEAD + BEGIN + "\n" + END + "\n"
    old_region = text.split(BEGIN, 1)[1].split(END, 1)[0] if BEGIN in text and END in text else ""
    kept = SOAK.findall(old_region)  # a soak section inside the generated region survives
    text = replace_between(text, BEGIN, END, generated(doc))
    if kept:
        text = text.replace(END, END + "\n\n" + "".join(kept).rstrip("\n"), 1)
    path.write_text(text)


def write_overhead_page(path: Path, doc: Doc) -> bool:
    """Update docs/overhead.md's Overhead table; False (and nothing written) without markers."""
    text = path.read_text()
    if OVERHEAD_BEGIN.split(":")[0] not in text or OVERHEAD_END not in text:
        return False
    begin = text[text.index(OVERHEAD_BEGIN.split(":")[0]) :].split("\n", 1)[0]
    path.write_text(replace_between(text, begin, OVERHEAD_END, overhead_page_table(doc)))
    return True


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__)
    parser.add_argument(
        "json", nargs="?", type=Path, default=common.REPO / "docs" / "benchmarks.json"
    )
    parser.add_argument("--docs", type=Path, default=common.REPO / "docs" / "benchmarks.md")
    parser.add_argument("--overhead-page", type=Path, default=common.REPO / "docs" / "overhead.md")
    args = parser.parse_args()
    doc = results.load(args.json)
    write_benchmarks(args.docs, doc)
    print(f"wrote {args.docs}")
    if write_overhead_page(args.overhead_page, doc):
        print(f"wrote the Overhead table of {args.overhead_page}")
    else:
        print(f"{args.overhead_page}: no overhead-table markers, left alone")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
