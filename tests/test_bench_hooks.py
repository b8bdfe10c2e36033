"""The bench's hooks to other modules (bench/hooks.py): how their results become budgets,
and that a measure() gets only the arguments it accepts. Pure: no cluster, no timing."""

from __future__ import annotations

from typing import Any

import pytest

from bench import hooks


def test_answer_budgets_per_backend_count_and_tool() -> None:
    runs = [
        {"tool": "flame", "idle": 5, "active": 0, "exit": 0, "wall_s": w} for w in (1.2, 1.4, 1.3)
    ] + [
        {"tool": "flame", "idle": 1000, "active": 32, "exit": 0, "wall_s": 2.6},
        {"tool": "flame", "idle": 1000, "active": 32, "exit": 1, "wall_s": 2.0},
    ]
    got = {b["what"]: b for b in hooks.answer_budgets(runs)}
    five = got["`pgprobe flame -d 1` wall, 5 idle + 0 active backends (issue 16)"]
    assert five["verdict"] == "met" and five["measured"].startswith("1.30 s")
    many = got["`pgprobe flame -d 1` wall, 1000 idle + 32 active backends (issue 16)"]
    assert many["verdict"] == "missed" and "1 run(s) failed" in many["measured"]


def test_serve_budgets_from_ratios_and_cpu() -> None:
    got = hooks.serve_budgets({"ratios": [1.0, 0.995, 1.005, 1.0], "cpu_pct_one_cpu": 0.4})
    assert [b["verdict"] for b in got] == ["met", "met"]
    assert hooks.serve_budgets({"rss_mib": 50}) == []


def test_serve_measure_gets_only_the_arguments_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def measure(pairs: int, quick: bool) -> dict[str, Any]:
        seen.update(pairs=pairs, quick=quick)
        return {"ratios": [0.99, 1.0], "cpu_pct_one_cpu": 2.0}

    monkeypatch.setattr(hooks, "_serve_function", lambda: (measure, "bench.serve_overhead"))
    got = hooks.run_serve(cluster=None, pairs=4, seconds=8, quick=False)  # type: ignore[arg-type]
    assert seen == {"pairs": 4, "quick": False}
    assert got["status"] == "measured" and got["budgets"][1]["verdict"] == "missed"


def test_a_missing_or_failing_serve_measure_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hooks, "_serve_function", lambda: None)
    got = hooks.run_serve(cluster=None, pairs=4, seconds=8, quick=False)  # type: ignore[arg-type]
    assert got["status"] == "missing" and "measure()" in got["note"]

    def broken() -> dict[str, Any]:
        raise RuntimeError("no agent")

    monkeypatch.setattr(hooks, "_serve_function", lambda: (broken, "bench.serve_soak"))
    got = hooks.run_serve(cluster=None, pairs=4, seconds=8, quick=False)  # type: ignore[arg-type]
    assert got["status"] == "failed" and "no agent" in got["note"]
