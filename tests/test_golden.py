"""Recorded inputs -> JSON outputs, byte for byte: the contract a refactor must keep.

Every recorded fixture (tests/fixtures/: triage documents, a bpftrace run, the
DTrace outputs) is pushed through the code that turns it into what users see as
JSON: findings, lwlocks rows, clog-reads rows, folded stacks. The results are
stored in tests/golden/*.json. A change that moves code around must leave them
identical; a change that means to alter output regenerates them on purpose:

    PGPROBE_REGEN_GOLDEN=1 .venv/bin/pytest tests/test_golden.py

and the diff of tests/golden/ is then part of the review.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import load_triage

from pgprobe import findings, proc
from pgprobe.discover import Cluster, Targets
from pgprobe.engines.base import Event, MapSpec, RunInfo, Snapshot
from pgprobe.engines.bpftrace import _OutputParser
from pgprobe.engines.dtrace import DtraceOutput
from pgprobe.symbolize import Symbolizer
from pgprobe.tools import clog_reads, flame, hot, lwlocks, profiling

GOLDEN = Path(__file__).parent / "golden"
FIXTURES = Path(__file__).parent / "fixtures"
REGEN = os.environ.get("PGPROBE_REGEN_GOLDEN") == "1"

PROFILE_SPECS = (
    MapSpec("samples", ()),
    MapSpec("stacks", ("int", "stack")),
    MapSpec("kstacks", ("int", "stack", "stack")),
)


def _targets() -> Targets:
    cluster = Cluster(
        postmaster_pid=1, binary="/x", version_num=150018, version="15.18", data_directory=None
    )
    return Targets(cluster, [], whole_cluster=True)


def _snapshots(path: Path, specs: tuple[MapSpec, ...], dtrace: bool) -> list[Snapshot]:
    info = RunInfo()
    named = {s.name: s for s in specs}
    parser: Any = (
        DtraceOutput(named, info)
        if dtrace
        else _OutputParser({f"@{name}": spec for name, spec in named.items()}, info)
    )
    events: list[Event] = []
    for raw in path.read_bytes().splitlines():
        events.extend(parser.feed(raw.decode() if dtrace else raw))
    events.extend(parser.finish())
    return [e for e in events if isinstance(e, Snapshot)]


def _lwlock_rows(path: Path, dtrace: bool) -> list[Any]:
    out = []
    for snap in _snapshots(path, tuple(lwlocks.MAPS), dtrace):
        for by_pid in (False, True):
            rows = lwlocks.rows(lwlocks.records(snap), _targets(), by_pid=by_pid)
            out.append({"label": snap.label, "by_pid": by_pid, "rows": [r.as_json() for r in rows]})
    return out


def _clog_rows(path: Path) -> list[Any]:
    out = []
    for snap in _snapshots(path, tuple(clog_reads.MAPS), dtrace=True):
        recs = clog_reads.records(snap)
        out.append(
            {
                "label": snap.label,
                "by": {
                    by: [r.as_json() for r in clog_reads.group_rows(recs, by)]
                    for by in ("file", "pid", "slru")
                },
                "open_errors": [e.as_json() for e in clog_reads.open_errors(snap, lambda p: True)],
            }
        )
    return out


def _profile(path: Path) -> list[Any]:
    """flame's JSON rows and hot's rows (per function and per module) of each snapshot."""
    out = []
    for snap in _snapshots(path, PROFILE_SPECS, dtrace=True):
        profile = profiling.name_stacks(
            _targets(), RunInfo(), snap, Symbolizer(kallsyms=False), hz=997, kernel=True
        )
        out.append(
            {
                "label": snap.label,
                "flame_rows": flame.json_rows(profile),
                "hot": [r.as_json() for r in hot.hot_rows(profile.stacks, by_module=False)],
                "hot_by_module": [r.as_json() for r in hot.hot_rows(profile.stacks, True)],
                "warnings": profile.warnings(),
            }
        )
    return out


def _triage(name: str) -> dict[str, Any]:
    doc = load_triage(name)
    found = findings.evaluate(doc)
    return {
        "findings": [f.as_json() for f in found],
        "text": findings.render_text(found),
    }


CASES: dict[str, Callable[[], Any]] = {
    "triage_pgbench": lambda: _triage("pgbench"),
    "triage_slru": lambda: _triage("slru"),
    "triage_idle": lambda: _triage("idle"),
    "triage_timemodel": lambda: _triage("timemodel"),
    "lwlocks_bpftrace_by_pid_interval": lambda: _lwlock_rows(
        FIXTURES / "bpftrace" / "lwlock_wait_by_pid_interval.jsonl", dtrace=False
    ),
    "lwlocks_dtrace": lambda: _lwlock_rows(FIXTURES / "dtrace" / "lwlock_wait.out", dtrace=True),
    "lwlocks_dtrace_by_pid_interval": lambda: _lwlock_rows(
        FIXTURES / "dtrace" / "lwlock_wait_by_pid_interval.out", dtrace=True
    ),
    "clog_reads_dtrace_stacks": lambda: _clog_rows(FIXTURES / "dtrace" / "clog_reads_stacks.out"),
    "profile_dtrace_hotuser": lambda: _profile(FIXTURES / "dtrace" / "profile_hotuser.out"),
    "profile_dtrace_kstacks": lambda: _profile(FIXTURES / "dtrace" / "profile_kstacks.out"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The recorded pids are not processes of this machine: a live process that happens to
    # have one of them must not lend it its /proc name (Targets.describe falls back to /proc).
    monkeypatch.setattr(proc, "read_info", lambda pid: None)
    text = json.dumps(CASES[name](), indent=1, sort_keys=True) + "\n"
    path = GOLDEN / f"{name}.json"
    if REGEN:  # only when asked: a run never writes the truth it is then checked against
        path.write_text(text, encoding="utf-8")
    elif not path.exists():
        regen = f"PGPROBE_REGEN_GOLDEN=1 .venv/bin/pytest tests/test_golden.py -k {name}"
        pytest.fail(f"{path} is missing: write it on purpose with {regen}")
    assert text == path.read_text(encoding="utf-8"), f"{name}: output differs from {path}"
