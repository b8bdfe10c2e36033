"""`pgprobe triage` on a loaded cluster with a provoked SLRU problem: the report is real.

Kept in one module (~400 lines): its tests share one loaded cluster and one triage run per
build (the `thrashing` and `triage_run` fixtures), which split files would start again."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import slru_workload
from helpers import (
    WAITS_BPF_LINKS,
    bpf_link_fds,
    cluster_for,
    perf_event_fds,
    run_pgprobe,
    start_pgprobe,
    stop_early,
)
from test_waits import schedstat

from pgprobe import pgversions, proc
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def thrashing(
    pg_build: PgBuild, tracing: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PgCluster]:
    """Few pg_xact buffers; pgbench -c 4 (TPC-B-like) and 4 clients looking up old xids.

    On each build (the report's HTML and the terminal summary: once): the SQL
    sections read each version's views, and the findings must still be right.
    """
    settings = {**slru_workload.CLUSTER_SETTINGS, "max_connections": "60"}
    with cluster_for(pg_build, settings, name="pgprobe-triage") as pg:
        init = pg.pgbench("-i", "-q", "-s", "1")
        assert init.wait(timeout=300) == 0
        with pg.connect() as conn:
            n = slru_workload.xact_burn_size(conn) * 2
        first, last = slru_workload.burn_xids(pg.conninfo, n)
        script = tmp_path_factory.mktemp("triage") / "lookups.sql"
        script.write_text(slru_workload.xact_lookup_pgbench_script(first, last))
        loads = [
            pg.pgbench("-c", "4", "-j", "1", "-T", "600"),
            pg.pgbench("-n", "-c", "4", "-j", "1", "-T", "600", "-f", str(script)),
        ]
        time.sleep(1.5)
        assert all(load.poll() is None for load in loads)
        yield pg
        for load in loads:
            load.terminate()
            load.communicate(timeout=30)


class _Sections(HTMLParser):
    """Collects section ids, iframes and inline SVGs of the report (and fails on nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.iframes: list[dict[str, str | None]] = []
        self.svgs = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section" and found.get("id"):
            self.sections.append(str(found["id"]))
        elif tag == "iframe":
            self.iframes.append(found)
        elif tag == "svg":
            self.svgs += 1


@pytest.fixture(scope="module")
def triage_run(thrashing: PgCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    report = tmp_path_factory.mktemp("report") / "report.html"
    done = run_pgprobe(
        ["triage", *thrashing.conn_args, "-d", "6", "-o", str(report), "--json"], timeout=240
    )
    assert done.returncode == 0, done.stderr
    return {"doc": json.loads(done.stdout), "html": report.read_text(), "stderr": done.stderr}


def test_every_section_has_real_data(
    pg_build: PgBuild, triage_run: dict[str, Any], tested_on: Callable[[str, str], None]
) -> None:
    doc = triage_run["doc"]
    meta = doc["meta"]
    assert 5.5 <= meta["duration_s"] <= 9
    # The LWLock table is the time model's LWLock sleeps, each with the runqueue time after
    # it (lwlocks' default source: no LWLock probes, on every build): its seconds are the
    # time model's LWLock rows of the same capture, to the rounding of the rows.
    assert sorted(meta["parts"]) == ["clog_reads", "profile", "waits"]
    lw = doc["lwlocks"]
    assert lw["meta"]["source"] == "sched_switch", lw["meta"]
    assert lw["meta"]["measures"] == "sleep and runqueue after", lw["meta"]
    assert lw["rows"], "pgbench gives LWLock waits"
    model = [r for r in doc["waits"]["cluster_rows"] if r["wait_event_type"] == "LWLock"]
    by_tranche = {r["wait_event"]: r["total_us"] + (r.get("woken_after_us") or 0) for r in model}
    for row in lw["rows"]:
        assert row["mode"] == "unknown" and row["tranche"] in by_tranche, (row, by_tranche)
    table_us = sum(r["total_us"] for r in lw["rows"])
    assert table_us == pytest.approx(sum(by_tranche.values()), rel=0.001, abs=5), (
        lw["rows"], model)  # fmt: skip
    assert doc["hot"]["rows"] and doc["flame"]["samples"] > 0
    # The CPU part: --unwind auto walks by DWARF here (no frame pointers in the server, or in
    # Debian's libraries), and the stacks are whole: every process of the cluster was forked
    # by the postmaster, under main.
    assert doc["hot"]["meta"]["unwind"] == "dwarf", doc["hot"]["meta"].get("unwind_reason")
    roots = {"main", "PostmasterMain"}
    folded = doc["flame"]["folded"].items()
    whole = sum(n for s, n in folded if roots & {f.rsplit("`", 1)[-1] for f in s.split(";")})
    assert whole >= 0.9 * doc["flame"]["samples"], doc["hot"]["meta"]["truncated_reasons"]
    if pg_build.stripped:  # the capture finding names the stripped files and their packages
        stripped = doc["hot"]["meta"]["stripped_frames_pct"]
        assert stripped and next(iter(stripped)) == "postgres", stripped
        # (made when the capture has 200 CPU samples or more: not always in 6 s here)
        quality = [f for f in doc["findings"] if f["id"] == "capture.unresolved"]
        assert all("static functions of stripped files" in f["title"] for f in quality), quality
    # the time model of the client backends: the 8 pgbench clients, active nearly all along
    model = doc["waits"]["meta"]
    assert len(model["client_pids"]) >= 8 and model["active_us"] > 0, model
    assert {r["category"] for r in doc["waits"]["rows"]} >= {"on CPU", "runqueue", "wait"}
    assert sum(doc["flame"]["folded"].values()) == doc["flame"]["samples"]
    xact = [r for r in doc["clog_reads"]["rows"] if r["slru"] == "pg_xact"]
    assert xact, (doc["clog_reads"]["meta"], doc["stats"]["slru"], doc["meta"]["warnings"])
    # clog-reads' default source, the uprobe, counts reads per (pid, SLRU): no bytes.
    assert all(r["reads"] > 0 and "bytes" not in r for r in xact)
    assert len(doc["activity"]["samples"]) >= 5
    assert doc["activity"]["wait_profile"]
    assert doc["stats"]["database"]["xact_commit"] > 0
    # stats.slru is pg_stat_slru over the SLRU capture's own window (read as its probes
    # start and stop counting), the rows clog_reads has beside its reads
    assert meta["slru_stats_window_s"] is not None, meta["warnings"]
    assert doc["clog_reads"]["meta"]["slru_stats"] == doc["stats"]["slru"]
    stat_xact = {r["slru"]: r for r in doc["stats"]["slru"]}["pg_xact"]
    counted, traced_s = sum(r["reads"] for r in xact), doc["clog_reads"]["meta"]["duration_s"]
    print(f"pg_xact reads {counted}, blks_read {stat_xact['blks_read']} over {traced_s} s")
    # Not equal under a steady load: a backend publishes its counts at most once a second
    # (14: every 500 ms, to the collector), so each edge leaves up to a second of reads
    # unpublished, and the difference is that backlog's change. Bound: 2 s at the mean
    # rate (measured: within 0.9 s). Exact on a quiet window: test_slru_reads_exact.
    assert abs(counted - stat_xact["blks_read"]) <= 2 * counted / traced_s, (counted, stat_xact)
    # Each version's views: pg_stat_checkpointer 17+, pg_stat_io 16+ (18: io workers).
    version = meta["postgres_version_num"]
    stats = doc["stats"]
    assert (stats["checkpointer"] is not None) == pgversions.has_pg_stat_checkpointer(version)
    assert (stats["io"] is not None) == pgversions.has_pg_stat_io(version)
    if stats["io"] is not None:
        assert stats["io"]["client backend"] > 0  # 128kB of shared_buffers: backends evict
        assert ("io worker" in stats["io"]) == pgversions.has_io_workers(version)
    # 128kB of shared_buffers under pgbench: backends write their own dirty buffers, which
    # the finding reads from pg_stat_bgwriter before 17 and from pg_stat_io after.
    ids = [f["id"] for f in doc["findings"]]
    assert "stats.backend-writes" in ids, ids
    # A normal end (the window's, not Ctrl-C): neither the document nor a part, which
    # triage stops at the window's end, says interrupted; nor does the report.
    assert meta["interrupted"] is False
    for name in ("waits", "lwlocks", "clog_reads", "hot"):
        if isinstance(doc.get(name), dict):
            assert doc[name]["meta"]["interrupted"] is False, name
    capture = triage_run["html"].split('<section id="capture"', 1)[1]
    assert "interrupted" not in capture
    tested_on("triage", "yes")


def test_the_provoked_slru_problem_is_the_finding(triage_run: dict[str, Any]) -> None:
    findings = triage_run["doc"]["findings"]
    slru = [f for f in findings if f["id"] == "slru.pg_xact"]
    assert slru, [f["id"] for f in findings]
    assert slru[0]["severity"] in ("high", "medium")
    assert "pg_xact reads" in slru[0]["title"]


@pytest.mark.once
def test_report_is_one_self_contained_html_file(triage_run: dict[str, Any]) -> None:
    html = triage_run["html"]
    parser = _Sections()
    parser.feed(html)
    parser.close()
    for section in (
        "overview",
        "findings",
        "timemodel",
        "flame",
        "lwlocks",
        "slru",
        "waits",
        "cpu",
        "sql",
        "capture",
    ):
        assert section in parser.sections, (section, parser.sections)
    # where the DB time went (the picture), then the findings
    assert parser.sections[:2] == ["overview", "findings"]
    assert 'class="seg"' in html and 'aria-label="DB time by wait class"' in html
    (flame,) = [f for f in parser.iframes if f.get("id") == "flamegraph"]
    assert "<svg" in str(flame.get("srcdoc"))  # the interactive flame graph, inline
    assert parser.svgs >= 1  # the wait-event timeline
    doc = triage_run["doc"]
    assert doc["lwlocks"]["rows"][0]["tranche"] in html
    assert "pg_xact/" in html
    assert 'src="http' not in html and 'href="http' not in html


@pytest.mark.once
def test_terminal_summary_and_default_report_name(thrashing: PgCluster, tmp_path: Path) -> None:
    done = run_pgprobe(["triage", *thrashing.conn_args, "-d", "3"], timeout=240)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("pgprobe triage: ")
    assert "pg_xact reads" in out
    assert "\ntime model (exact): " in out and "\n  DB time by class: " in out
    report = Path(out.strip().splitlines()[-1].removeprefix("report: "))
    try:
        assert report.name.startswith("pgprobe-triage-") and report.suffix == ".html"
        assert report.stat().st_size > 10_000
    finally:
        report.unlink(missing_ok=True)


# -- the time model against an independent truth ---------------------------------------------

ROW_LOCK_S = 3.0
SLEEP_S = 2.0


def _kill_if_running(run: subprocess.Popen[str]) -> None:
    """A triage left running by a failed test: killed, its pipes drained."""
    if run.poll() is None:
        run.kill()
        run.communicate()


def _document(run: subprocess.Popen[str], out: str, err: str, tmp_path: Path) -> Any:
    """triage's --json document, kept beside the test's files for a failure's reader."""
    assert run.returncode == 0, err
    (tmp_path / "triage.json").write_text(out)
    return json.loads(out)


def _wait_window_open(pgprobe: subprocess.Popen[str]) -> None:
    """Until triage's window is open: it starts the time model once the other parts are in,
    and opens the window when that one is in too.

    The compiled object (bpf/waits.bpf.c) attaches in pgprobe, all its links at once.
    bpftrace (bpf/waits.bt) opens one perf event per CPU buffer at start, then one per
    tracepoint as it attaches: in when that count has passed the CPUs' and stayed put for
    a second.
    """
    deadline = time.monotonic() + 180
    seen, stable_since = 0, time.monotonic()
    while time.monotonic() < deadline:
        if pgprobe.poll() is not None:
            pytest.fail(f"pgprobe ended before attaching: {pgprobe.communicate()[1]}")
        if bpf_link_fds(pgprobe.pid) >= WAITS_BPF_LINKS:
            time.sleep(0.5)  # pgprobe opens the window right after it attached them
            return
        tracer = next((p for p in proc.children(pgprobe.pid) if _runs_waits_bt(p)), None)
        count = perf_event_fds(tracer) if tracer is not None else 0
        if count != seen:
            seen, stable_since = count, time.monotonic()
        if seen > (os.cpu_count() or 1) and time.monotonic() - stable_since >= 1.0:
            time.sleep(0.5)  # pgprobe sees it attached within 0.1 s and opens the window
            return
        time.sleep(0.1)
    pytest.fail("triage's time model did not attach within 180 s")


def _runs_waits_bt(pid: int) -> bool:
    info = proc.read_info(pid)
    return info is not None and info.comm == "bpftrace" and "waits.bt" in info.cmdline


@pytest.fixture
def quiet(pg_build: PgBuild) -> Iterator[PgCluster]:
    with cluster_for(pg_build, name="pgprobe-triage-truth") as pg:
        pg.sql("CREATE TABLE hot (id int PRIMARY KEY, v int); INSERT INTO hot VALUES (1, 0)")
        yield pg


def test_time_model_against_a_row_lock_and_pg_sleep(quiet: PgCluster, tmp_path: Path) -> None:
    """A backend blocked N s on a row lock and one in pg_sleep(2), inside triage's window:
    the time model's Lock:transactionid is the blocked statement's duration (its client's
    clock) less the backend's CPU and runqueue time meanwhile (its /proc/PID/schedstat)
    within 2 %, and Timeout:PgSleep is 2 s within 2 %; triage is stopped (Ctrl-C) once
    both are over."""
    report = tmp_path / "r.html"
    argv = ["triage", *quiet.conn_args, "-d", "14", "-o", str(report), "--json", "--unwind", "fp"]
    run = start_pgprobe(argv)
    try:
        _wait_window_open(run)
        blocked: dict[str, float] = {}
        with quiet.connect() as holder, quiet.connect() as sleeper:
            holder.execute("BEGIN")
            holder.execute("UPDATE hot SET v = v + 1 WHERE id = 1")
            xid = int(holder.execute("SELECT txid_current()").fetchone()[0]) & 0xFFFFFFFF
            holder_pid = int(holder.execute("SELECT pg_backend_pid()").fetchone()[0])

            def wait_for_the_row() -> None:
                with quiet.connect() as waiter:
                    pid = int(waiter.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
                    before, started = schedstat(pid), time.monotonic()
                    waiter.execute("UPDATE hot SET v = v + 1 WHERE id = 1")
                    wall, after = time.monotonic() - started, schedstat(pid)
                    # off CPU and not runnable: the backend's own CPU and runqueue time
                    # (the wait for a CPU once the lock is granted) are not the lock's
                    blocked["s"] = wall - (after[0] - before[0] + after[1] - before[1]) / 1e9

            waiter = threading.Thread(target=wait_for_the_row)
            waiter.start()
            sleeper.execute(f"SELECT pg_sleep({SLEEP_S})")
            time.sleep(ROW_LOCK_S - SLEEP_S)
            holder.execute("COMMIT")
            waiter.join(timeout=30)
        out, err = stop_early(run, timeout=300)
    finally:
        _kill_if_running(run)
    doc = _document(run, out, err, tmp_path)
    assert "waits" in doc["meta"]["parts"], doc["meta"]["warnings"]
    rows = {(r["wait_event_type"], r["wait_event"]): r for r in doc["waits"]["rows"]}
    seen = [(r["wait_event"], r["total_us"]) for r in doc["waits"]["cluster_rows"]]
    assert {("Lock", "transactionid"), ("Timeout", "PgSleep")} <= set(rows), (seen, err)
    lock = rows[("Lock", "transactionid")]["total_us"] / 1e6
    slept = rows[("Timeout", "PgSleep")]["total_us"] / 1e6
    print(f"Lock:transactionid {lock:.4f} s (client: {blocked['s']:.4f} s), PgSleep {slept:.4f} s")
    assert abs(lock - blocked["s"]) <= 0.02 * blocked["s"], (lock, blocked, err)
    assert abs(slept - SLEEP_S) <= 0.02 * SLEEP_S, (slept, err)
    # the finding speaks of the same exact seconds
    found = [f for f in doc["findings"] if f["id"] == "wait.row-locks"]
    assert found and f"{lock:.2f} s" in found[0]["title"] + found[0]["evidence"], found
    # ... and names the statement (no pg_stat_statements here: keyed by its text), whose
    # row holds the same seconds, as pg_sleep's holds its 2 s
    assert "of it is `UPDATE hot SET v = v + 1 WHERE id = 1`" in found[0]["title"], found
    by_text = {r["query"]: r for r in doc["waits"]["statements"]["rows"] if r["kind"] == "text"}
    update, sleep = by_text["UPDATE hot SET v = v + 1 WHERE id = 1"], by_text[
        f"SELECT pg_sleep({SLEEP_S})"]  # fmt: skip
    waited = {w["wait_event"]: w["total_us"] / 1e6 for w in update["waits"]}
    assert abs(waited["transactionid"] - blocked["s"]) <= 0.02 * blocked["s"], update
    slept_there = {w["wait_event"]: w["total_us"] / 1e6 for w in sleep["waits"]}
    assert abs(slept_there["PgSleep"] - SLEEP_S) <= 0.02 * SLEEP_S, sleep
    # ... and the lock: the holder's transaction, its seconds those of the time model
    on_xact = [r for r in doc["waits"]["locks"]["rows"] if r["lock"] == f"transaction {xid}"]
    assert len(on_xact) == 1 and on_xact[0]["mode"] == "ShareLock", doc["waits"]["locks"]
    assert abs(on_xact[0]["total_us"] / 1e6 - lock) <= 1e-6, on_xact
    assert (f"of it on transaction {xid} (ShareLock wanted, 1 session) behind pid {holder_pid} "
            "(idle in transaction") in found[0]["title"], found  # fmt: skip
    trees = doc["waits"]["locks"]["blocking"]["trees"]
    assert [t["root"]["pid"] for t in trees] == [holder_pid], trees
    html = report.read_text()
    assert '<section id="locks">' in html and f"transaction {xid}" in html
    assert f"pid {holder_pid}" in html and "Blocking trees" in html
    assert '<section id="timemodel">' in html and "Lock:transactionid" in html
    assert '<section id="statements">' in html and "UPDATE hot SET" in html


@pytest.fixture
def slru_quiet(pg_build: PgBuild) -> Iterator[PgCluster]:
    with cluster_for(pg_build, slru_workload.CLUSTER_SETTINGS, name="pgprobe-triage-slru") as pg:
        yield pg


def test_slru_reads_exact(slru_quiet: PgCluster, tmp_path: Path) -> None:
    """pg_xact reads provoked inside triage's window on a quiet cluster: its count of them
    equals its own pg_stat_slru delta, and the workload's.

    Exact because nothing is left unpublished at either edge: the workload's backend
    publishes its counts before and after its reads (slru_stats()), and nothing else reads.
    """
    pg = slru_quiet
    report = tmp_path / "r.html"
    argv = ["triage", *pg.conn_args, "-d", "60", "-o", str(report), "--json", "--unwind", "fp"]
    with pg.connect() as conn:
        first, last = slru_workload.burn_xids(pg.conninfo, slru_workload.xact_burn_size(conn))
        slru_workload.slru_stats(conn)  # the backend's counts so far, published
        run = start_pgprobe(argv)
        try:
            _wait_window_open(run)
            before = slru_workload.slru_stats(conn)
            slru_workload.provoke_xact_reads(conn, first, last)
            after = slru_workload.slru_stats(conn)
            out, err = stop_early(run, timeout=300)
        finally:
            _kill_if_running(run)
    doc = _document(run, out, err, tmp_path)
    reads = slru_workload.slru_delta(before, after)[slru_workload.XACT][1]
    assert "clog_reads" in doc["meta"]["parts"], doc["meta"]["warnings"]
    assert doc["meta"]["slru_stats_window_s"] is not None, doc["meta"]["warnings"]
    counted = sum(r["reads"] for r in doc["clog_reads"]["rows"] if r["slru"] == "pg_xact")
    stat = {r["slru"]: r for r in doc["stats"]["slru"]}["pg_xact"]["blks_read"]
    print(f"pg_xact reads {counted}, blks_read {stat}, the workload's {reads}")
    assert reads >= 24  # every lookup misses (slru_workload.provoke_xact_reads)
    assert counted == stat == reads
