"""The bench's results and report (bench/results.py, bench/report.py) on a synthetic run:
budgets judged on intervals and on the cost per fire, the lwlocks guard decision, and the
marker regions of docs/benchmarks.md and docs/overhead.md. Pure: no cluster, no tracer, no
timing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import configs, overhead, report, results
from bench.probe_cost import Mechanism, ProbeCostResult, SwitchCost


def window(tps: float) -> overhead.Window:
    return overhead.Window(0.0, 1.0, tps, 7.0, 7, busy_cpus=2.0, switches_per_s=80_000)


def tool_run(key: str, tps: float, fires: float, ns: float, kind: str) -> overhead.ToolRun:
    run = overhead.ToolRun(key, window=window(tps), start_to_attach_s=0.6, finish_s=0.8)
    run.rss_mib, run.fires_per_s, run.bpf_ns_per_fire, run.tool_cpu_pct = 50.0, fires, ns, 0.2
    run.programs = [{"name": "probe", "kind": kind, "fires_per_s": fires, "bpf_ns_per_fire": ns}]
    return run


def workload_result(
    workload: configs.Workload, rows: list[tuple[str, list[float], float, float, str]]
) -> overhead.WorkloadResult:
    """rows: (config key, traced TPS per pair against 1000 untraced, fires/s, ns, kind)."""
    result = overhead.WorkloadResult(workload, 7)
    base = window(1000.0)
    result.untraced = [base]
    for key, traced, fires, ns, kind in rows:
        for cycle, tps in enumerate(traced):
            run = tool_run(key, tps, fires, ns, kind)
            result.pairs.append(overhead.Pair(key, cycle, base, run, base))
    return result


def synthetic_doc() -> dict[str, Any]:
    c = configs.CONFIGS
    select = workload_result(
        configs.SELECT,
        [
            # no probe fires, ratio noisy around 1: the interval straddles 0.99, the cost decides
            ("clog-reads", [1000, 975, 1010, 995, 1020], 0.0, 0.0, "kprobe/uprobe"),
            # clearly fine
            ("waits", [1000, 1001, 999, 1000], 140_000.0, 250.0, "tracepoint"),
        ],
    )
    contention = workload_result(
        configs.CONTENTION,
        [
            ("lwlocks", [900, 905, 895, 900], 20_000.0, 700.0, "kprobe/uprobe"),
        ],
    )
    summaries = overhead.summarize(select, [c["clog-reads"], c["waits"]])
    summaries += overhead.summarize(contention, [c["lwlocks"]])
    pc = ProbeCostResult(
        [
            Mechanism("uprobe (trap + count)", "uprobe:x", [100.0], [16_100.0]),
            Mechanism("syscall tracepoint (filter + count)", "tracepoint:x", [100.0], [200.0]),
        ],
        switches=[
            SwitchCost(
                "floor",
                "floor: empty sched_switch",
                [1000.0, 1010.0],
                [1030.0, 1050.0],
                [32.0, 31.0],
                {"sched_switch": [32.0, 31.0]},
            ),
            SwitchCost(
                "waits-ours",
                "waits.bt, both its own",
                [1000.0, 1010.0, 990.0],
                [1300.0, 1290.0, 1400.0],
                [450.0, 460.0, 440.0],
                {"sched_switch": [250.0], "sched_wakeup": [200.0], "1": [500.0]},
            ),
        ],  # fmt: skip
    )
    meta = {
        "started": "2026-11-23 06:25",
        "mode": "full",
        "command": "scripts/bench --full",
        "loadavg_before": (0.1, 0.2, 0.3),
        "quiet": "quiet",
        "source": "commit abc",
        "machine": {"cpus": "2"},
        "seconds": 7,
        "notes": [],
        "elapsed_min": 33.0,
    }
    answer = {"status": "missing", "note": "time to answer: not measured", "budgets": []}
    return results.document(meta, [select, contention], summaries, pc, None, None, answer, None)


def budget(doc: dict[str, Any], start: str) -> dict[str, str]:
    found = [b for b in doc["budgets"] if b["what"].startswith(start)]
    assert len(found) == 1, [b["what"] for b in doc["budgets"]]
    return found[0]


def test_budgets_by_interval_and_by_cost_per_fire() -> None:
    doc = synthetic_doc()
    clog = budget(doc, "clog-reads (default source), select: TPS ratio")
    assert clog["verdict"] == "met" and clog["decided_by"].startswith("cost per fire")
    waits = budget(doc, "waits (sched_switch), select: TPS ratio")
    assert waits["verdict"] == "met" and waits["decided_by"] == "TPS interval"
    row = doc["workloads"][0]["rows"][1]
    # 140,000 fires/s x (250 BPF + 100 tracepoint ns) + 0.2 % of a CPU, of 2 busy CPUs
    assert row["cost"]["total_ms_per_s"] == 140_000 * 350 / 1e6 + 2.0
    assert abs(row["cost"]["share_of_workload_cpu"] - 51.0 / 2000) < 1e-5


def test_a_cost_that_cannot_be_modelled_leaves_an_undecided_interval_undecided() -> None:
    row = {
        "budget": 0.98,
        "ratios": [0.97, 1.0, 0.99],
        "label": "flame",
        "issue": "15",
        "interval": {"mean": 0.985, "low": 0.95, "high": 1.02, "n": 3, "half_width_pct": 3.5},
        "cost": {"implied_ratio": 0.999, "unmodelled_kinds": ["perf sampling in the kernel"]},
    }
    b = results.ratio_budget(row, "tpcb")
    assert b is not None and b["verdict"] == "undecided"


def test_the_lwlocks_guard_is_decided_from_the_contention_workload() -> None:
    g = synthetic_doc()["lwlocks_guard"]
    assert g["decided"]
    # 20,000 fires/s x (700 + 16,000 ns) = 334 ms/s (+ 2 ms/s tool) of 2,000: well over 2 %
    assert g["needed"] is True
    assert g["ns_per_fire_all_in"] == 16_700
    assert g["cpus_at_100k_waits_per_s"] == round(200_000 * 16_700 / 1e9, 3)


def test_the_document_survives_json_and_renders(tmp_path: Path) -> None:
    doc = synthetic_doc()
    path = tmp_path / "benchmarks.json"
    results.save(path, doc)
    again = results.load(path)
    text = report.generated(again)
    assert text.startswith(report.BEGIN) and text.rstrip().endswith(report.END)
    assert "waits (sched_switch)" in text and "Guard needed" in text
    assert "time to answer: not measured" in text
    json.dumps(again)


def test_benchmarks_md_keeps_the_hand_written_text_and_the_soak_section(tmp_path: Path) -> None:
    doc = synthetic_doc()
    soak = "<!-- soak:start -->\n## Soak\nten minutes, flat\n<!-- soak:end -->\n"
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# B\n\nintro\n\n{report.BEGIN}\nold\n{report.END}\n\n{soak}\n## Method\n")
    report.write_benchmarks(page, doc)
    text = page.read_text()
    assert "old" not in text and "intro" in text and "## Method" in text
    assert text.count(soak) == 1
    # a soak section that ended up inside the generated region survives too
    page.write_text(f"# B\n{report.BEGIN}\nold\n{soak}{report.END}\n")
    report.write_benchmarks(page, doc)
    assert page.read_text().count(soak) == 1 and "old" not in page.read_text()


def test_overhead_table_between_its_markers_only(tmp_path: Path) -> None:
    doc = synthetic_doc()
    readme = tmp_path / "overhead.md"
    readme.write_text("# pgprobe\n")
    assert report.write_overhead_page(readme, doc) is False
    assert readme.read_text() == "# pgprobe\n"
    markers = f"{report.OVERHEAD_BEGIN}\nold\n{report.OVERHEAD_END}"
    readme.write_text(f"## Overhead\nbefore\n{markers}\nafter\n")
    assert report.write_overhead_page(readme, doc) is True
    text = readme.read_text()
    assert "old" not in text and "before" in text and "after" in text
    assert "| waits (sched_switch) | select |" in text
    assert report.write_overhead_page(readme, doc) is True  # idempotent: markers still there
    assert text == readme.read_text()


def test_programs_of_one_name_add_up_within_a_window() -> None:
    """A USDT probe attaches one program per location: their fires add up, then the
    median over windows; a 1 Hz interval timer does not stop the cost model."""
    result = workload_result(configs.CONTENTION, [("lwlocks", [900, 910], 0.0, 0.0, "x")])
    for pair in result.pairs:
        pair.run.programs = [
            {"name": "lwlock__wait__s", "kind": "kprobe/uprobe", "fires_per_s": 1000.0,
             "bpf_ns_per_fire": 500.0},
            {"name": "lwlock__wait__s", "kind": "kprobe/uprobe", "fires_per_s": 3000.0,
             "bpf_ns_per_fire": 700.0},
            {"name": "lwlock__wait__s", "kind": "kprobe/uprobe", "fires_per_s": 0.0,
             "bpf_ns_per_fire": None},
            {"name": "1", "kind": "perf_event", "fires_per_s": 2.0, "bpf_ns_per_fire": 300.0},
        ]  # fmt: skip
    (summary,) = overhead.summarize(result, [configs.CONFIGS["lwlocks"]])
    row = results.summary_row(summary)
    uprobe = next(p for p in row["programs"] if p["kind"] == "kprobe/uprobe")
    assert uprobe["fires_per_s"] == 4000.0 and uprobe["bpf_ns_per_fire"] == 650.0
    results.modelled_cost(row, {"kprobe/uprobe": 16_000.0}, busy_cpus=2.0)
    assert row["cost"]["unmodelled_kinds"] == []


def test_ns_per_context_switch_floor_filter_waits() -> None:
    """probe_cost's context-switch variants: traced minus the same round's untraced,
    median over rounds; rendered as the "floor, filter, waits.bt" table."""
    pc = synthetic_doc()["probe_cost"]
    floor, waits = pc["switches"]
    assert floor["ns_per_switch"] == 35.0  # median of +30 and +40
    assert waits["ns_per_switch"] == 300.0  # +300, +280, +410
    assert waits["bpf_ns_per_switch"] == 450.0
    text = "\n".join(report.switch_section(pc))
    assert "ns per context switch: floor, filter, waits.bt" in text
    assert "| waits.bt, both its own | 300 | 450 | sched_switch 250, sched_wakeup 200 |" in text
