"""`pgprobe clog-reads` from its default source, the uprobe on pgstat_count_slru_page_read.

Real clusters, real bpftrace (and perf for --unwind dwarf): the same workload
as tests/test_clog_reads.py (the syscall source's tests), whose fixtures and
helpers this file shares. Every build: reads per pid and SLRU equal the
blks_read deltas of pg_stat_slru over the same window; --stacks name
SimpleLruReadPage and its callers, with frame pointers (Debian's 15) and by
DWARF unwinding (a build without them), their reads equal to the delta too.
--by query: the reads are the lookup statement's, under the id pg_stat_statements shows
(the workload's cluster loads it), as many as the delta; --query-id keeps one statement's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from helpers import run_pgprobe
from slru_workload import SUBTRANS, XACT
from test_clog_reads import APPLICATION, HEX_FRAME, Workload, start, stop, workload

from pgprobe.engines.base import Snapshot
from pgprobe.errors import EXIT_USAGE
from pgprobe.pgbuilds import PgBuild
from pgprobe.pgstats import slru_order
from pgprobe.tools import bystatement
from pgprobe.tools.clog_reads import view
from pgprobe.tools.clog_reads.probe import UPROBE_FIRE_NS, index_mask, selected_slrus
from pgprobe.tools.clog_reads.records import (
    add_texts,
    query_reads,
    statement_records,
    statement_rows,
)

__all__ = ["workload"]  # the shared fixture, imported for pytest


def uprobe(workload: Workload, *args: str) -> Any:
    return start(workload, "--source", "uprobe", *args)


def per_slru(rows: list[dict[str, Any]], pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in rows:
        if row["pid"] == pid:
            out[row["slru"]] = out.get(row["slru"], 0) + row["reads"]
    return out


# Both forms of the uprobe against the same truth: bpf/clog_reads.bpf.c compiled (the
# default once scripts/build-bpf built it) and bpf/clog_reads_uprobe.bt.
@pytest.mark.integration
@pytest.mark.parametrize("engine", ["compiled", "bpftrace"])
def test_uprobe_reads_equal_pg_stat_slru(
    workload: Workload, tested_on: Callable[[str, str], None], engine: str
) -> None:
    """The default source, by the server's own pg_stat_slru order (renamed rows on 17+)."""
    form = ["--engine", "bpftrace"] if engine == "bpftrace" else []
    probe = uprobe(workload, "--slru", "pg_xact,pg_subtrans", "--json", *form)
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
    assert meta["engine"] == ("libbpf" if engine == "compiled" else "bpftrace")
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


# -- --by query and --query-id ---------------------------------------------------------------

LOOKUP = "SELECT x::text::bigint, pg_xact_status"  # provoke_xact_reads' statement
XMAX = "SELECT pg_snapshot_xmax"  # current_xid()'s, on the same connection: no reads


def statement_id(workload: Workload, text: str) -> int:
    """The statement's query id as pg_stat_statements shows it."""
    rows = workload.cluster.sql("SELECT DISTINCT queryid FROM pg_stat_statements "
                                f"WHERE query LIKE '{text}%' AND toplevel")  # fmt: skip
    assert len(rows) == 1, rows
    return int(str(rows[0][0]))


@pytest.mark.integration
def test_by_query_the_reads_are_the_lookup_statements(workload: Workload) -> None:
    """One session's statement reads pg_xact, another session sits idle: every read is that
    statement's, under its pg_stat_statements id, as many as blks_read's delta; --query-id
    of another statement (run in the same session, between the reads) keeps none."""
    with psycopg.connect(workload.cluster.conninfo, autocommit=True) as idle:
        idle.execute("SELECT 1")
        probe = uprobe(workload, "--by", "query", "--json")
        delta = workload.run(subtrans=False)
        out, err = stop(probe)
    doc = json.loads(out)
    lookup = statement_id(workload, LOOKUP)
    print(f"rows {doc['rows']}, pg_stat_slru delta {delta[XACT]}")
    assert delta[XACT][1] >= 24, delta
    assert [(r["kind"], r["query_id"], r["slru"], r["reads"], r["pids"]) for r in doc["rows"]] == [
        ("statement", lookup, "pg_xact", delta[XACT][1], [workload.pid])
    ]  # fmt: skip
    assert doc["rows"][0]["query"].startswith(LOOKUP)
    meta = doc["meta"]
    assert meta["reads"] == meta["slru_stats"]["pg_xact"]["blks_read"] == delta[XACT][1]
    assert (meta["by"], meta["query_id"], meta["query_ids_note"]) == ("query", None, None)
    assert "no query ids" not in err

    other = statement_id(workload, XMAX)
    probe = uprobe(workload, "--query-id", str(other), "--json")
    delta = workload.run(subtrans=False)
    out, _ = stop(probe)
    doc = json.loads(out)
    assert delta[XACT][1] >= 24 and doc["rows"] == [] and doc["meta"]["reads"] == 0, doc
    assert doc["meta"]["slru_stats"]["pg_xact"]["blks_read"] == delta[XACT][1]  # the totals: all


@pytest.mark.integration
@pytest.mark.once
def test_query_id_from_system_calls(workload: Workload) -> None:
    """The syscall script reads the statement too: --query-id keeps that statement's reads,
    per backend and SLRU, none of pg_subtrans's scans (other statements)."""
    lookup = statement_id(workload, LOOKUP)
    probe = start(workload, "--query-id", str(lookup), "--slru", "pg_xact,pg_subtrans", "--json")
    delta = workload.run()
    out, _ = stop(probe)
    doc = json.loads(out)
    assert delta[SUBTRANS][1] >= 50, delta
    assert doc["meta"]["source"] == "syscalls"
    assert doc["rows"] == [{"pid": workload.pid, "backend_type": "client backend",
                            "application_name": APPLICATION, "slru": "pg_xact",
                            "reads": delta[XACT][1]}]  # fmt: skip


@pytest.mark.integration
@pytest.mark.once
def test_by_query_table(workload: Workload) -> None:
    probe = uprobe(workload, "--by", "query", "--slru", "pg_xact,pg_subtrans")
    delta = workload.run()
    out, _ = stop(probe)
    print(out)
    lines = out.splitlines()
    assert lines[0].startswith("SLRU reads of pg_xact, pg_subtrans by statement: whole cluster")
    assert lines[1].split() == ["QUERYID", "SLRU", "READS", "BACKENDS", "QUERY"]
    lookup = str(statement_id(workload, LOOKUP))
    row = next(ln.split() for ln in lines[2:] if ln.split()[:2] == [lookup, "pg_xact"])
    assert row[2:4] == [f"{delta[XACT][1]:,}", "1"]
    assert " ".join(row[4:]).startswith("SELECT x::text")  # cut to the terminal's width
    scans = [ln.split() for ln in lines[2:] if ln.split()[1:2] == ["pg_subtrans"]]
    assert len(scans) == 1 and "count(*)" in " ".join(scans[0]), scans  # the holder's table
    assert scans[0][2] == f"{delta[SUBTRANS][1]:,}"
    assert any(ln.startswith("Totals per SLRU") for ln in lines)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--by", "query", "--trace"], "--by query and --trace cannot be combined"),
        (["--query-id", "7", "--stacks"], "--query-id and --stacks cannot be combined"),
        (["--by", "query", "--engine", "dtrace"], "--by query needs bpftrace"),
        (["--no-text"], "--no-text goes with --by query or --query-id"),
        (["--by", "rows"], "invalid choice: 'rows'"),
    ],
)
def test_by_query_refusals_are_one_line(args: list[str], needle: str) -> None:
    done = run_pgprobe(["clog-reads", *args])
    assert done.returncode == EXIT_USAGE, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert done.stdout == ""


def test_statement_rows_follow_the_state_then_the_id() -> None:
    """(pid, SLRU, st_state, st_query_id) keys as the scripts count them (15: 2 active,
    3 idle in transaction, 1 idle), named as bystatement names them."""
    snap = Snapshot(maps={"qreads": {
        (7, "pg_xact", 2, -5): 10, (8, "pg_xact", 2, (1 << 64) - 5): 3,  # one id, either sign
        (7, "pg_xact", 3, -5): 1, (9, "pg_xact", 2, 0): 2, (9, "pg_xact", 1, -5): 4,
        (10, "pg_subtrans/0001", 0, 0): 6,
    }})  # fmt: skip
    reads = query_reads(snap, files=False)
    rows = statement_rows(reads, 15)
    got = [(r.part.kind, r.part.query_id, r.slru, r.reads, sorted(r.pids)) for r in rows]
    assert got == [
        ("statement", -5, "pg_xact", 13, [7, 8]),
        ("outside statements", None, "pg_subtrans/0001", 6, [10]),
        ("outside statements", None, "pg_xact", 4, [9]),  # idle: a stale id is no statement's
        ("no query id", None, "pg_xact", 2, [9]),
        ("idle in transaction", -5, "pg_xact", 1, [7]),
    ]
    assert query_reads(snap, files=True)[-1].slru == "pg_subtrans"
    assert [r.reads for r in statement_rows(reads, 15, query_id=-5)] == [13, 1]
    per_pid = statement_records(reads, 15, -5)
    assert sorted((r.pid, r.file, r.reads, r.timed) for r in per_pid) == [
        (7, "pg_xact", 11, False), (8, "pg_xact", 3, False)]  # fmt: skip
    texts = bystatement.Texts(None, by_id={-5: "UPDATE t\n   SET x = $1 WHERE  id = $2"})
    add_texts(rows, texts.by_id)
    cells = [view.statement_cells(r, texts, 60) for r in rows]
    assert [(c["query_id"], c["reads"], c["backends"], c["query"]) for c in cells] == [
        ("-5", "13", "2", "UPDATE t SET x = $1 WHERE id = $2"),
        ("", "6", "1", "(outside statements)"),
        ("", "4", "1", "(outside statements)"),
        ("", "2", "1", "(active, no query id)"),
        ("-5", "1", "1", "idle in transaction after query -5: UPDATE t SET x = $1 WHE…"),
    ]
    assert rows[0].as_json() == {"kind": "statement", "query_id": -5, "slru": "pg_xact",
                                 "reads": 13, "pids": [7, 8],
                                 "query": "UPDATE t\n   SET x = $1 WHERE  id = $2"}  # fmt: skip
