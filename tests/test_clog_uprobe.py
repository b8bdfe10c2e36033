"""`pgprobe clog-reads` from its default source, the uprobe on pgstat_count_slru_page_read.

Real clusters, real bpftrace (and perf for --unwind dwarf): the same workload
as tests/test_clog_reads.py (the syscall source's tests), whose fixtures and
helpers this file shares. Every build: reads per pid and SLRU equal the
blks_read deltas of pg_stat_slru over the same window; --stacks name
SimpleLruReadPage and its callers, with frame pointers (Debian's 15) and by
DWARF unwinding (a build without them), their reads equal to the delta too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from slru_workload import SUBTRANS, XACT
from test_clog_reads import APPLICATION, HEX_FRAME, Workload, start, stop, workload

from pgprobe.pgbuilds import PgBuild
from pgprobe.pgstats import slru_order
from pgprobe.tools.clog_reads import view
from pgprobe.tools.clog_reads.probe import UPROBE_FIRE_NS, index_mask, selected_slrus

__all__ = ["workload"]  # the shared fixture, imported for pytest


def uprobe(workload: Workload, *args: str) -> Any:
    return start(workload, "--source", "uprobe", *args)


def per_slru(rows: list[dict[str, Any]], pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in rows:
        if row["pid"] == pid:
            out[row["slru"]] = out.get(row["slru"], 0) + row["reads"]
    return out


@pytest.mark.integration
def test_uprobe_reads_equal_pg_stat_slru(
    workload: Workload, tested_on: Callable[[str, str], None]
) -> None:
    """The default source, by the server's own pg_stat_slru order (renamed rows on 17+)."""
    probe = uprobe(workload, "--slru", "pg_xact,pg_subtrans", "--json")
    delta = workload.run()
    out, err = stop(probe)
    doc = json.loads(out)
    meta, rows = doc["meta"], doc["rows"]
    got = per_slru(rows, workload.pid)
    print(f"probe {got}, pg_stat_slru delta {delta}, meta fires {meta['uprobe_fires']}")
    assert meta["source"] == "uprobe"
    assert delta[XACT][1] >= 24 and delta[SUBTRANS][1] >= 50, delta
    assert got == {"pg_xact": delta[XACT][1], "pg_subtrans": delta[SUBTRANS][1]}
    assert meta["slru_stats"]["pg_xact"]["blks_read"] == delta[XACT][1]
    assert meta["slru_stats"]["pg_subtrans"]["blks_read"] == delta[SUBTRANS][1]
    assert {r["pid"] for r in rows} == {workload.pid}
    for row in rows:
        assert set(row) == {"pid", "backend_type", "application_name", "slru", "reads"}
        assert (row["backend_type"], row["application_name"]) == ("client backend", APPLICATION)
    # Fires: every read of every SLRU in the window (the filter does not save the trap).
    assert meta["uprobe_fires"] >= delta[XACT][1] + delta[SUBTRANS][1]
    assert meta["lost_events"] == 0
    tested_on("clog-reads", "exact vs pg_stat_slru (uprobe)")


@pytest.mark.integration
def test_the_slru_filter_uses_the_servers_row_order(workload: Workload) -> None:
    """pg_xact only: pg_subtrans's reads in the same window are not counted."""
    order = slru_order(workload.cluster.conninfo)
    assert order is not None and "pg_xact" in order and "pg_subtrans" in order
    assert index_mask(order, ["pg_xact"]) == 1 << order.index("pg_xact")
    probe = uprobe(workload, "--json")  # default: pg_xact
    delta = workload.run()
    out, _ = stop(probe)
    assert per_slru(json.loads(out)["rows"], workload.pid) == {"pg_xact": delta[XACT][1]}


@pytest.mark.integration
def test_uprobe_table_has_no_latency_columns(workload: Workload) -> None:
    probe = uprobe(workload, "--pid", str(workload.pid), "--slru", "all")
    delta = workload.run()
    out, _ = stop(probe)
    print(out)
    lines = out.splitlines()
    assert lines[1].split() == ["PID", "BACKEND", "TYPE", "APPLICATION", "SLRU", "READS"]
    rows = {ln.split()[4]: ln.split()[5] for ln in lines[2:4]}
    assert rows == {"pg_xact": f"{delta[XACT][1]:,}", "pg_subtrans": f"{delta[SUBTRANS][1]:,}"}


def _stacks_case(workload: Workload, unwind: str) -> None:
    """--unwind auto picks unwind from the server binary's frame pointers."""
    probe = uprobe(workload, "--pid", str(workload.pid), "--stacks", "--json")
    delta = workload.run()  # pg_subtrans reads too: not asked for, not in the stacks
    out, err = stop(probe)
    doc = json.loads(out)
    stacks = doc["meta"]["stacks"]
    assert doc["meta"]["unwind"] == unwind
    assert sum(s["reads"] for s in stacks) == delta[XACT][1] == doc["meta"]["reads"], err
    top = stacks[0]
    print(f"{unwind}: {top['reads']} reads\n  " + "\n  ".join(top["frames"]))
    frames = top["frames"]
    assert frames[0] == "pgstat_count_slru_page_read", frames
    assert "SimpleLruReadPage" in frames and "TransactionIdGetStatus" in frames, frames
    assert frames.index("SimpleLruReadPage") < frames.index("TransactionIdGetStatus")
    assert "pg_xact_status" in frames
    assert not any(HEX_FRAME.match(f) for f in frames), frames
    assert not any("SubTrans" in f for s in stacks for f in s["frames"])


@pytest.mark.integration
def test_stacks_on_each_build(workload: Workload, pg_build: PgBuild) -> None:
    """Frame-pointer stacks where the build keeps frame pointers (Debian's 15), DWARF
    stacks where it does not (14, 16-18): what --unwind auto picks on each."""
    _stacks_case(workload, "fp" if pg_build.frame_pointers else "dwarf")


def test_cost_line_only_when_material() -> None:
    assert view.cost_line(100, 10.0, UPROBE_FIRE_NS, "uprobe") == ""  # 0.016 % of a CPU
    assert view.cost_line(10**6, 10.0, UPROBE_FIRE_NS, "syscalls") == ""
    line = view.cost_line(250_000, 10.0, UPROBE_FIRE_NS, "uprobe", "/usr/bin/postgres")
    assert "25,000/s" in line and "40% of a CPU" in line and "--source syscalls" in line
    assert "/usr/bin/postgres" in line


def test_index_mask_and_commit_log_names() -> None:
    order = ["pg_commit_ts", "pg_multixact/members", "pg_multixact/offsets", "pg_notify",
             "pg_serial", "pg_subtrans", "pg_xact", "other"]  # fmt: skip
    assert index_mask(order, selected_slrus([], 17)) == 1 << 6
    assert index_mask(order, ["pg_subtrans", "pg_xact"]) == (1 << 5) | (1 << 6)
    assert index_mask(order, ["pg_clog"]) == 1 << 6
    assert index_mask(order[::-1], ["pg_xact"]) == 1 << 1  # the server's order, not a guess
