"""One run of the bench as a JSON document (docs/benchmarks.json), budgets judged in it.

Long because the document and the budgets judged on it are one contract with
bench/report.py: the summaries, the cost model, every budget and the lwlocks guard.

Everything docs/benchmarks.md and docs/overhead.md's Overhead table show comes from this
document (bench/report.py renders it), so a run can be re-rendered or re-read later.

A budget on a TPS ratio is judged on the 95 % interval of the geometric mean of the pair
ratios: met (all of it at or above the budget), missed (all below) or undecided. Where
the interval is undecided, the cost measured per probe fire decides it when it can: the
programs' fires/s x (BPF ns per fire from kernel BPF statistics + the mechanism's ns per
fire from bench/probe_cost.py: the uprobe trap, the tracepoint dispatch), plus the CPU of
pgprobe and its tracers, as a share of the CPU the untraced workload used. On a saturated
server each CPU-second taken is throughput lost, so 1 - share is the ratio the cost
implies.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from bench import common, stats
from bench.overhead import Summary, WorkloadResult
from bench.probe_cost import ProbeCostResult
from bench.render import RenderResult
from bench.symbolize import SymbolizeResult

VERSION = 1
ATTACH_BUDGET_S = 1.0  # issue 16: attach on a saturated 2-CPU server
FINISH_BUDGET_S = 1.5
DWARF_FINISH_BUDGET_S = 3.0  # issue 15: a 30 s whole-cluster capture
RSS_BUDGET_MIB = 150.0
RENDER_BUDGET_S = 0.5
# A perf_event program firing this rarely is one of bpftrace's interval timers (pgprobe's
# scripts use 1 s and 50 ms ones): its BPF time is counted; its interrupt, even at 10 us,
# would be under 0.03 % of two CPUs. A profile timer at 99 Hz x CPUs is not negligible that
# way, and its interrupt is not measured per fire: that row stays with its TPS interval.
TIMER_FIRES_NEGLIGIBLE = 50.0
NO_BUDGET_WORKLOADS = ("contention",)  # measured for the cost per fire, not judged
GUARD_SHARE = 0.02  # lwlocks: a guard is needed if its cost passes the looser TPS budget
GUARD_EXTRAPOLATE_WAITS = 100_000  # waits/s of a badly contended many-core server
SUMMARY_ATTRS = (
    "start_to_attach_s",
    "spawn_s",
    "attach_s",
    "finish_s",
    "events_per_s",
    "fires_per_s",
    "bpf_ns_per_fire",
    "tool_cpu_pct",
)


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _interval(iv: stats.Interval | None) -> dict[str, Any] | None:
    if iv is None:
        return None
    return {
        "mean": _r(iv.mean),
        "low": _r(iv.low),
        "high": _r(iv.high),
        "n": iv.n,
        "half_width_pct": _r(iv.half_width_pct, 2),
    }


def mechanism_ns(probe_cost: dict[str, Any] | None) -> dict[str, float]:
    """ns per fire of the mechanism, by BPF program kind (bench/bpfstats.PROG_TYPES)."""
    out: dict[str, float] = {}
    for m in (probe_cost or {}).get("mechanisms", []):
        ns = m.get("ns_per_fire")
        if ns is None:
            continue
        if m["name"].startswith("uprobe"):
            out["kprobe/uprobe"] = ns
        elif "tracepoint" in m["name"]:
            out["tracepoint"] = out["raw_tracepoint"] = ns
    return out


def _programs(s: Summary) -> list[dict[str, Any]]:
    """Per BPF program name: fires/s summed over the programs of that name in a window (a
    USDT probe or a wildcard attaches one program per location), then the median over the
    windows; BPF ns per fire the fires-weighted mean in a window, then the median."""
    per_run: dict[tuple[str, str], list[tuple[float, float | None]]] = {}
    for run in s.runs:
        mine: dict[tuple[str, str], tuple[float, float]] = {}
        for p in run.programs:
            fires = float(p["fires_per_s"] or 0.0)
            ns = float(p["bpf_ns_per_fire"] or 0.0)
            f0, t0 = mine.get((p["name"], p["kind"]), (0.0, 0.0))
            mine[(p["name"], p["kind"])] = (f0 + fires, t0 + fires * ns)
        for key, (fires, total) in mine.items():
            per_run.setdefault(key, []).append((fires, total / fires if fires else None))
    return [
        {
            "name": name,
            "kind": kind,
            "fires_per_s": _r(common.median(f for f, _ in got), 1),
            "bpf_ns_per_fire": _r(common.median(ns for _, ns in got), 1),
        }
        for (name, kind), got in per_run.items()
    ]


def modelled_cost(row: dict[str, Any], mech: dict[str, float], busy_cpus: float | None) -> None:
    """Add row["cost"]: CPU ms per second (BPF, mechanism, tool processes) and its share."""
    if not row["programs"] and row["median"].get("tool_cpu_pct") is None:
        return
    bpf_ms = mech_ms = 0.0
    unknown: list[str] = []
    for p in row["programs"]:
        fires, ns = p["fires_per_s"] or 0.0, p["bpf_ns_per_fire"] or 0.0
        bpf_ms += fires * ns / 1e6
        if p["kind"] in mech:
            mech_ms += fires * mech[p["kind"]] / 1e6
        elif fires > TIMER_FIRES_NEGLIGIBLE:
            unknown.append(p["kind"])
    if not row["programs"]:
        # no BPF program (perf record): the kernel's sampling and stack copies run in the
        # sampled tasks and are not measured per fire
        unknown.append("perf sampling in the kernel")
    tool_ms = 10 * (row["median"].get("tool_cpu_pct") or 0.0)  # % of one CPU -> ms/s
    total = bpf_ms + mech_ms + tool_ms
    share = total / (busy_cpus * 1000) if busy_cpus else None
    row["cost"] = {
        "bpf_ms_per_s": _r(bpf_ms, 3),
        "mechanism_ms_per_s": _r(mech_ms, 3),
        "tool_ms_per_s": _r(tool_ms, 3),
        "total_ms_per_s": _r(total, 3),
        "share_of_workload_cpu": _r(share, 5),
        "implied_ratio": _r(1 - share, 4) if share is not None else None,
        "unmodelled_kinds": sorted(set(unknown)),
    }


def summary_row(s: Summary) -> dict[str, Any]:
    switches = common.median(r.window.switches_per_s for r in s.runs if r.window)
    meta: dict[str, Any] = {}
    for key in {k for r in s.runs for k in r.meta}:
        values = [r.meta[key] for r in s.runs if key in r.meta]
        numbers = [float(v) for v in values if isinstance(v, (int, float))]
        meta[key] = _r(common.median(numbers), 3) if numbers else values[-1]
    return {
        "config": s.config.key,
        "label": s.config.label,
        "tool": s.config.tool,
        "args": list(s.config.args),
        "budget": s.config.budget,
        "issue": s.config.issue,
        "ratios": [_r(r) for r in s.ratios],
        "cpu_ratios": [_r(r) for r in s.cpu_ratios],
        "median_ratio": _r(s.ratio),
        "interval": _interval(s.interval),
        "pairs_needed_2pct": stats.pairs_needed(s.ratios, 2.0),
        "median": {a: _r(s.med(a), 4) for a in SUMMARY_ATTRS},
        "extra_cpu_us_per_fire": _r(s.extra_cpu_us_per_fire, 3),
        "switches_per_s": _r(switches, 0),
        "peak_rss_mib": _r(s.peak("rss_mib"), 1),
        "peak_tracer_rss_mib": _r(s.peak("tracer_rss_mib"), 1),
        "lost": sum(r.lost for r in s.runs),
        "dropped_intervals": sum(r.dropped_intervals for r in s.runs),
        "programs": _programs(s),
        "meta": meta,
        "warnings": sorted({w for r in s.runs for w in r.warnings})[:5],
    }


def workload_doc(w: WorkloadResult, summaries: list[Summary]) -> dict[str, Any]:
    return {
        "key": w.workload.key,
        "label": w.workload.label,
        "seconds": w.seconds,
        "elapsed_s": round(w.elapsed_s, 1),
        "foreign_cpu_pct": _r(w.foreign_cpu_pct, 2),
        "foreign_processes": sorted(w.foreign_processes),
        "untraced_tps": _r(common.median(x.tps for x in w.untraced), 1),
        "busy_cpus": _r(common.median(x.busy_cpus for x in w.untraced), 3),
        "switches_per_s": _r(common.median(x.switches_per_s for x in w.untraced), 0),
        "cut_at_cycle": w.cut_at_cycle,
        "rows": [summary_row(s) for s in summaries if s.workload.key == w.workload.key and s.runs],
        "long_runs": [
            {
                "config": r.config,
                "ok": r.ok,
                "error": r.error.strip()[:300],
                "finish_s": _r(r.finish_s, 3),
                "meta": r.meta,
                "seconds": r.window.seconds if r.window else None,
            }
            for r in w.long_runs
        ],
        "failed": [{"config": f.config, "error": f.error.strip()[:300]} for f in w.failed],
        "pairs": [
            {
                "config": p.config,
                "cycle": p.cycle,
                "ratio": _r(p.ratio),
                "before_tps": _r(p.before.tps, 1),
                "after_tps": _r(p.after.tps, 1),
                "traced_tps": _r(p.run.window.tps, 1) if p.run.window else None,
            }
            for p in w.pairs
        ],
    }


def render_doc(r: RenderResult | None) -> dict[str, Any] | None:
    if r is None:
        return None
    doc = dataclasses.asdict(r)
    doc["command"].update(wall=r.command.wall, peak_rss=r.command.peak_rss)
    if r.inferno is not None:
        doc["inferno"].update(wall=r.inferno.wall, peak_rss=r.inferno.peak_rss)
    return doc


def probe_cost_doc(pc: ProbeCostResult | None) -> dict[str, Any] | None:
    if pc is None:
        return None
    return {
        "mechanisms": [
            {
                "name": m.name,
                "probe": m.probe,
                "ns_per_fire": _r(m.ns_per_fire, 1),
                "untraced_ns": m.untraced_ns,
                "traced_ns": m.traced_ns,
            }
            for m in pc.mechanisms
        ],
        "switches": [
            {
                "key": c.key,
                "label": c.label,
                "ns_per_switch": _r(c.ns_per_switch, 1),
                "bpf_ns_per_switch": _r(common.median(c.bpf_ns), 1),
                "bpf_ns_per_fire": {
                    name: _r(common.median(v), 1) for name, v in sorted(c.per_program.items())
                },
                "untraced_ns": c.untraced_ns,
                "traced_ns": c.traced_ns,
            }
            for c in pc.switches
        ],
        "notes": pc.notes,
    }


def symbolize_doc(s: SymbolizeResult | None) -> dict[str, Any] | None:
    return None if s is None else dataclasses.asdict(s)


# -- budgets ---------------------------------------------------------------------------------


def _budget(what: str, limit: str, measured: str, verdict: str, by: str = "") -> dict[str, str]:
    return {
        "what": what,
        "limit": limit,
        "measured": measured,
        "verdict": verdict,
        "decided_by": by,
    }


def ratio_budget(row: dict[str, Any], workload: str) -> dict[str, str] | None:
    """A TPS-ratio budget: the interval's verdict, or the modelled cost's where undecided."""
    budget = row["budget"]
    if budget is None or not row["ratios"]:
        return None
    what = f"{row['label']}, {workload}: TPS ratio (issue {row['issue']})"
    limit = f">= {budget:.2f}"
    iv = row["interval"]
    cost = row.get("cost") or {}
    implied = cost.get("implied_ratio")
    model = ""
    if implied is not None and not cost.get("unmodelled_kinds"):
        model = f"; cost per fire implies {implied:.4f}"
    if iv is None:
        return _budget(
            what,
            limit,
            f"{row['ratios'][0]:.3f} (1 pair){model}",
            "undecided",
            "one pair: no interval",
        )
    measured = f"{iv['mean']:.3f} [{iv['low']:.3f}–{iv['high']:.3f}] ±{iv['half_width_pct']:.1f} %"
    interval = stats.Interval(iv["mean"], iv["low"], iv["high"], iv["n"])
    verdict = interval.verdict(budget)
    if verdict != "undecided":
        return _budget(what, limit, measured + model, verdict, "TPS interval")
    if model and implied is not None:
        # the interval allows the budget; the measured cost says which side it is on
        return _budget(
            what,
            limit,
            measured + model,
            "met" if implied >= budget else "missed",
            "cost per fire (TPS interval undecided)",
        )
    return _budget(what, limit, measured, "undecided", "TPS interval straddles the budget")


def _max_budget(what: str, limit: float, value: float | None, unit: str = " s") -> dict[str, str]:
    if value is None:
        return _budget(what, f"<= {limit:g}{unit}", "not measured", "undecided", "no data")
    verdict = "met" if value <= limit else "missed"
    return _budget(what, f"<= {limit:g}{unit}", f"{value:.2f}{unit}", verdict, "measured")


def budgets(doc: dict[str, Any]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for w in doc["workloads"]:
        for row in w["rows"]:
            b = ratio_budget(row, w["key"])
            if b is not None:
                out.append(b)
    for w in doc["workloads"]:
        if w["key"] == "contention":
            continue  # attach and finish budgets are for the usual saturated server
        for row in w["rows"]:
            if row["tool"] == "":
                continue
            name = f"{row['label']}, {w['key']}"
            attach = row["median"].get("start_to_attach_s")
            out.append(
                _max_budget(
                    f"{name}: start to probes attached, saturated server (median)",
                    ATTACH_BUDGET_S,
                    attach,
                )
            )
        for run in w["long_runs"]:
            out.append(
                _max_budget(
                    f"{run['config']}, {w['key']}: Ctrl-C to output written after a "
                    f"{run['seconds'] or '?'} s whole-cluster capture (issue 15)",
                    DWARF_FINISH_BUDGET_S,
                    run["finish_s"] if run["ok"] else None,
                )
            )
    rows = [r for w in doc["workloads"] for r in w["rows"] if r["tool"]]
    for key in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == key]
        finish = [r["median"]["finish_s"] for r in mine if r["median"].get("finish_s") is not None]
        rss = [r["peak_rss_mib"] for r in mine if r["peak_rss_mib"] is not None]
        label = mine[0]["label"]
        out.append(
            _max_budget(
                f"{label}: Ctrl-C to output written (worst workload median)",
                FINISH_BUDGET_S,
                max(finish) if finish else None,
            )
        )
        out.append(
            _max_budget(
                f"{label}: pgprobe peak RSS", RSS_BUDGET_MIB, max(rss) if rss else None, " MiB"
            )
        )
    out.extend(doc.get("answer", {}).get("budgets", []))
    out.extend(doc.get("serve", {}).get("budgets", []))
    render = doc.get("render")
    if render and render["command"].get("wall") is not None:
        out.append(
            _max_budget(
                "render 50k stacks: `pgprobe flame --from` wall (median)",
                RENDER_BUDGET_S,
                render["command"]["wall"],
            )
        )
    return out


def lwlocks_guard(doc: dict[str, Any]) -> dict[str, Any] | None:
    """Is a --max-events-per-sec guard needed for lwlocks? From the contention workload."""
    for w in doc["workloads"]:
        for row in w["rows"]:
            if row["config"] != "lwlocks" or w["key"] != "contention":
                continue
            fires = row["median"].get("fires_per_s")
            cost = row.get("cost") or {}
            share = cost.get("share_of_workload_cpu")
            if not fires or share is None:
                return {"decided": False, "why": "no probe fires measured under contention"}
            per_fire_ns = 1e6 * (cost["bpf_ms_per_s"] + cost["mechanism_ms_per_s"]) / fires
            iv = row["interval"]
            slow = iv is not None and iv["high"] < 1 - GUARD_SHARE
            needed = share > GUARD_SHARE or slow
            at_scale = 2 * GUARD_EXTRAPOLATE_WAITS * per_fire_ns / 1e9
            return {
                "decided": True,
                "needed": needed,
                "fires_per_s": fires,
                "ns_per_fire_all_in": round(per_fire_ns),
                "share_of_workload_cpu": share,
                "tps_interval": iv,
                "cpus_at_100k_waits_per_s": round(at_scale, 3),
                "rule": f"needed if the measured cost passes {GUARD_SHARE:.0%} of the "
                "workload's CPU (the looser TPS budget) or the TPS interval lies below "
                f"{1 - GUARD_SHARE:.2f}",
            }
    return None


def document(
    meta: dict[str, Any],
    workloads: list[WorkloadResult],
    summaries: list[Summary],
    probe_cost: ProbeCostResult | None,
    render: RenderResult | None,
    symbolize: SymbolizeResult | None,
    answer: dict[str, Any] | None,
    serve: dict[str, Any] | None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {"version": VERSION, **meta}
    doc["probe_cost"] = probe_cost_doc(probe_cost)
    mech = mechanism_ns(doc["probe_cost"])
    doc["workloads"] = [workload_doc(w, summaries) for w in workloads]
    for w in doc["workloads"]:
        for row in w["rows"]:
            modelled_cost(row, mech, w["busy_cpus"])
            if w["key"] in NO_BUDGET_WORKLOADS:
                row["budget"] = None  # the issues' budgets are for select-only and TPC-B
    doc["render"] = render_doc(render)
    doc["symbolize"] = symbolize_doc(symbolize)
    doc["answer"] = answer or {"status": "not run"}
    doc["serve"] = serve or {"status": "not run"}
    doc["lwlocks_guard"] = lwlocks_guard(doc)
    doc["budgets"] = budgets(doc)
    return doc


def save(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False, default=str) + "\n")


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    if doc.get("version") != VERSION:
        raise SystemExit(f"{path}: bench results version {doc.get('version')}, not {VERSION}")
    return doc
