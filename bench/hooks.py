"""The parts of a run that other modules measure: time to answer and `pgprobe serve`.

HOOK (time to answer, issue 16 item 2): bench/answer.py (speed2) provides
    measure(cluster | None, tools, Backends(idle, active), repeat) -> list of dicts
with per run "tool", "exit", "wall_s", "cpu_s", "phases". Budgets: `-d 1` wall <= 1.5 s at
5 backends, <= 2.5 s at 1,000 idle + 32 active.

HOOK (serve overhead, issue 17 item 4): bench/serve_overhead.py or bench/serve_soak.py
(fleet2) provides `measure(...)` returning a dict. The bench passes the keyword arguments
the function accepts among `cluster` (the bench's PgCluster, pgbench tables at scale 2),
`pairs`, `seconds` and `quick`, and reads from the dict, when present:
    "ratios": [paired TPS ratios, with / without serve]          budget: interval >= 0.99
    "cpu_pct_one_cpu": pgprobe serve + its tracers, % of one CPU   budget: < 1 %
Everything else in the dict is shown as it is. A missing module or function is said in
the report (the run goes on); so is an exception.
"""

from __future__ import annotations

import importlib
import inspect
import statistics
import traceback
from typing import Any

from bench import stats
from pgprobe.sandbox import PgCluster

ANSWER_TOOLS = ("flame", "lwlocks", "waits", "clog-reads")
ANSWER_BUDGET_S = {5: 1.5, 1000: 2.5}
ANSWER_ACTIVE = {5: 0, 1000: 32}
SERVE_MODULES = ("bench.serve_overhead", "bench.serve_soak")
SERVE_RATIO_BUDGET = 0.99
SERVE_CPU_BUDGET_PCT = 1.0


def _missing(what: str, why: str) -> dict[str, Any]:
    return {"status": "missing", "note": f"{what}: not measured, {why}", "budgets": []}


def answer_budgets(results: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One budget per (backends, tool): the median wall of its runs."""
    out = []
    for idle, limit in ANSWER_BUDGET_S.items():
        for tool in dict.fromkeys(r["tool"] for r in results):
            runs = [r for r in results if r["tool"] == tool and r.get("idle") == idle]
            if not runs:
                continue
            wall = statistics.median(r["wall_s"] for r in runs)
            failed = [r for r in runs if r.get("exit") != 0]
            active = runs[0].get("active", 0)
            verdict = "met" if wall <= limit and not failed else "missed"
            measured = f"{wall:.2f} s (median of {len(runs)})"
            if failed:
                measured += f", {len(failed)} run(s) failed"
            out.append(
                {
                    "what": f"`pgprobe {tool} -d 1` wall, {idle} idle + {active} active backends "
                    "(issue 16)",
                    "limit": f"<= {limit:g} s",
                    "measured": measured,
                    "verdict": verdict,
                    "decided_by": "measured",
                }
            )
    return out


def run_answer(quick: bool) -> dict[str, Any]:
    try:
        answer = importlib.import_module("bench.answer")
    except ImportError as exc:
        return _missing("time to answer", f"bench/answer.py cannot be imported ({exc})")
    if not hasattr(answer, "measure") or not hasattr(answer, "Backends"):
        return _missing("time to answer", "bench/answer.py has no measure() / Backends")
    repeat = 1 if quick else 3
    tools = [t for t in ANSWER_TOOLS if t in getattr(answer, "TOOLS", ANSWER_TOOLS)]
    results: list[dict[str, Any]] = []
    notes = []
    for idle in ANSWER_BUDGET_S:
        idle_now = min(idle, 50) if quick else idle
        try:
            got = answer.measure(
                None, tools, answer.Backends(idle_now, ANSWER_ACTIVE[idle]), repeat
            )
        except Exception as exc:  # another module's failure is reported, the run goes on
            notes.append(f"{idle} backends: {type(exc).__name__}: {exc}")
            notes.append(traceback.format_exc(limit=3).strip().splitlines()[-1])
            continue
        for r in got:
            r["idle"] = idle if not quick else r.get("idle", idle_now)
        results.extend(got)
    status = "measured" if results else "failed"
    if quick:
        notes.append("quick: 50 idle backends stand in for 1,000, one run each")
    return {
        "status": status,
        "note": "; ".join(notes),
        "results": results,
        "budgets": answer_budgets(results) if not quick else [],
    }


def _serve_function() -> tuple[Any, str] | None:
    for name in SERVE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(module, "measure", None)):
            return module.measure, name
    return None


def serve_budgets(result: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    ratios = result.get("ratios")
    if isinstance(ratios, list) and ratios:
        iv = stats.ratio_interval(float(r) for r in ratios)
        if iv is None:
            measured, verdict = f"{float(ratios[0]):.3f} (1 pair)", "undecided"
        else:
            measured = f"{iv.text()} ±{iv.half_width_pct:.1f} %"
            verdict = iv.verdict(SERVE_RATIO_BUDGET)
        out.append(
            {
                "what": "`pgprobe serve` at default rates: TPS ratio (issue 17)",
                "limit": f">= {SERVE_RATIO_BUDGET}",
                "measured": measured,
                "verdict": verdict,
                "decided_by": "TPS interval",
            }
        )
    cpu = result.get("cpu_pct_one_cpu")
    if isinstance(cpu, (int, float)):
        out.append(
            {
                "what": "`pgprobe serve`: pgprobe + tracers CPU (issue 17)",
                "limit": f"< {SERVE_CPU_BUDGET_PCT:g} % of one CPU",
                "measured": f"{cpu:.2f} %",
                "verdict": "met" if cpu < SERVE_CPU_BUDGET_PCT else "missed",
                "decided_by": "measured",
            }
        )
    return out


def serve_overhead_json(doc: dict[str, Any]) -> dict[str, Any]:
    """ServeOverhead.as_json() with the keys serve_budgets() judges: the paired ratios and
    the CPU share of one CPU."""
    pairs = zip(doc.get("tps_with", []), doc.get("tps_without", []), strict=False)
    ratios = [w / wo for w, wo in pairs if wo]
    return {**doc, "ratios": ratios, "cpu_pct_one_cpu": doc.get("cpu_pct_of_one_cpu")}


def run_serve(cluster: PgCluster, pairs: int, seconds: int, quick: bool) -> dict[str, Any]:
    found = _serve_function()
    if found is None:
        return _missing(
            "`pgprobe serve` overhead",
            "neither bench/serve_overhead.py nor bench/serve_soak.py has measure() yet",
        )
    measure, module = found
    offered = {"cluster": cluster, "pairs": pairs, "seconds": seconds, "quick": quick}
    params = inspect.signature(measure).parameters
    kwargs = {k: v for k, v in offered.items() if k in params}
    try:
        result = measure(**kwargs)
    except Exception as exc:  # another module's failure is reported, the run goes on
        return {
            "status": "failed",
            "note": f"{module}.measure: {type(exc).__name__}: {exc}",
            "budgets": [],
        }
    if hasattr(result, "as_json"):  # bench/serve_overhead.py's ServeOverhead
        result = serve_overhead_json(result.as_json())
    if not isinstance(result, dict):
        result = {"result": result}
    shown = {k: v for k, v in result.items() if k not in ("cluster",)}
    return {
        "status": "measured",
        "note": f"{module}.measure({', '.join(kwargs)})",
        "result": shown,
        "budgets": serve_budgets(result),
    }
