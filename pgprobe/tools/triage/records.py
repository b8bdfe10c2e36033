"""Triage's time-model section, from what `pgprobe waits`' probe measured: pure, no I/O.

The section (``doc["waits"]``) holds two time models over the window, each as the rows
`pgprobe waits --json` prints (pgprobe.tools.waits.records.Row.as_json):

- ``rows``: the client backends (what pg_stat_activity's sampling, the findings and the
  report's headline speak of: the time of the sessions), and the processes born and gone
  within the window that nothing named (``meta.unnamed_pids``: most are short client
  connections); pgprobe's own sessions (``meta.pgprobe_pids``) are left out;
- ``cluster_rows``: every process of the cluster (background processes too).

``meta`` adds ``window_s`` (the probe's own window, from its first to its last event),
``client_pids`` and, for the client backends, ``active_us`` (on CPU + runqueue + wait
events), ``idle_us`` (idle wait events: ClientRead, Activity:*) and ``unknown_us``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pgprobe.discover import APPLICATION_NAME
from pgprobe.tools.waits import records as waits_records

CLIENT = "client backend"
# What pgprobe.tools.waits.targets.describe calls a process that exited before a
# pg_stat_activity read named it (born and gone inside the window).
UNNAMED = "(exited)"
ACTIVE = ("on CPU", "runqueue", "wait")


def totals_us(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Active, idle and unknown microseconds of a time model's JSON rows."""
    out = {"active_us": 0.0, "idle_us": 0.0, "unknown_us": 0.0}
    for row in rows:
        category, total = row.get("category"), float(row.get("total_us") or 0.0)
        if category in ACTIVE:
            out["active_us"] += total
        elif category == "idle":
            out["idle_us"] += total
        elif category in ("unknown", "not accounted"):
            out["unknown_us"] += total
    return {k: round(v, 3) for k, v in out.items()}


def time_model_section(
    procs: list[waits_records.ProcessTime],
    major: int,
    describe: waits_records.Describe,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """doc["waits"]: the client backends' time model, and the whole cluster's."""
    # A process born and gone within the window was never named: most are client backends
    # (short connections), so they are counted as such, and listed (an autovacuum or
    # parallel worker that came and went is among them).
    # pgprobe's own sessions (the pg_stat_activity sampler) are left to the cluster's model.
    ours = [p.pid for p in procs if describe(p.pid) == (CLIENT, APPLICATION_NAME)]
    clients = [p for p in procs if describe(p.pid)[0] in (CLIENT, UNNAMED) and p.pid not in ours]
    unnamed = [p.pid for p in clients if describe(p.pid)[0] == UNNAMED]
    rows = [r.as_json() for r in waits_records.rows(clients, major, False, describe)]
    cluster = [r.as_json() for r in waits_records.rows(procs, major, False, describe)]
    return {
        "meta": {
            **meta,
            "client_pids": sorted(p.pid for p in clients),
            "unnamed_pids": sorted(unnamed),
            "pgprobe_pids": sorted(ours),
            "client_seconds": round(sum(p.wall_ns for p in clients) / 1e9, 6),
            **totals_us(rows),
        },
        "rows": rows if clients else [],
        "cluster_rows": cluster if procs else [],
    }
