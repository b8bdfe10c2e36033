"""Faults during a capture: a tracer killed, the server stopped, a probe site taken.

Each is real: kill -9 of the bpftrace pgprobe started, pg_ctl stop of a
throwaway cluster mid-capture, perf probe on the server's USDT sites. Whatever
was collected is kept, and what happened is said in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import CHECKOUT, bpf_link_fds, need, perf_event_fds

from pgprobe import proc
from pgprobe.errors import EXIT_TRACER
from pgprobe.sandbox import PgCluster, as_postgres

pytestmark = pytest.mark.integration


def start_pgprobe(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgprobe", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=CHECKOUT,
    )


def tracers(pgprobe_pid: int, script: str = "") -> list[int]:
    """The bpftrace processes pgprobe started (running `script`, if given)."""
    out = []
    for pid in proc.children(pgprobe_pid):
        info = proc.read_info(pid)
        if info is not None and info.comm == "bpftrace" and script in info.cmdline:
            out.append(pid)
    return out


def wait_attached(pgprobe_pid: int, script: str = "", count: int = 1, timeout: float = 180) -> None:
    """Until `count` of pgprobe's bpftrace processes hold their perf events (probes in), or,
    for one tracer of any script, pgprobe holds a compiled object's links."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not script and count == 1 and bpf_link_fds(pgprobe_pid) > 0:
            time.sleep(1.5)
            return
        found = tracers(pgprobe_pid, script)
        if len(found) >= count and all(perf_event_fds(p) > 0 for p in found):
            time.sleep(1.5)  # attach finishes, the window opens
            return
        time.sleep(0.2)
    found = {p: perf_event_fds(p) for p in tracers(pgprobe_pid, script)}
    raise AssertionError(f"bpftrace did not attach in time: {found}")


@pytest.fixture
def busy(tracing: None) -> Iterator[PgCluster]:
    """A throwaway cluster under pgbench -c 4 (the tests stop or kill things in it)."""
    with PgCluster(name="pgprobe-faults") as pg:
        assert pg.pgbench("-i", "-q", "-s", "1").wait(timeout=300) == 0
        load = pg.pgbench("-c", "4", "-j", "1", "-T", "300")
        try:
            yield pg
        finally:
            load.terminate()
            load.communicate(timeout=60)


# -- a tracer killed -------------------------------------------------------------------------


def test_tracer_killed_with_nothing_kept(busy: PgCluster) -> None:
    """kill -9 of bpftrace 2 s into `lwlocks -d 20`: which, how, when; exit 6."""
    run = start_pgprobe(["lwlocks", "--source", "usdt", "--max-events-per-sec", "0",
                         "--engine", "bpftrace", *busy.conn_args, "-d", "20"])  # fmt: skip
    wait_attached(run.pid)
    os.kill(tracers(run.pid)[0], signal.SIGKILL)
    out, err = run.communicate(timeout=60)
    assert run.returncode == EXIT_TRACER, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "bpftrace was killed by signal 9 (SIGKILL)" in lines[0]
    assert "s after its probes attached, before the end of the capture" in lines[0]
    assert "nothing was collected" in lines[0]
    assert out == ""


def test_tracer_killed_after_intervals_keeps_them_marked_partial(busy: PgCluster) -> None:
    """With --interval 1, the summaries printed before the kill are kept; the last is partial."""
    run = start_pgprobe(
        [
            "lwlocks",
            "--source",
            "usdt",
            "--max-events-per-sec",
            "0",
            "--engine",
            "bpftrace",
            *busy.conn_args,
            "-d",
            "30",
            "--interval",
            "1",
            "--json",
        ]
    )
    wait_attached(run.pid)
    time.sleep(2.5)
    os.kill(tracers(run.pid)[0], signal.SIGKILL)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) >= 2
    assert not any(d["meta"]["partial"] for d in docs[:-1])
    last = docs[-1]["meta"]
    assert last["partial"] and last["final"]
    assert "killed by signal 9 (SIGKILL)" in last["tracer_ended_early"]
    assert "pgprobe: warning: bpftrace was killed by signal 9 (SIGKILL)" in err
    assert "marked partial" in err


def test_triage_goes_on_without_a_killed_part(busy: PgCluster, tmp_path: Path) -> None:
    """One of triage's captures killed: the report is written, says which part and why."""
    report = tmp_path / "r.html"
    # --unwind fp and --engine bpftrace: all three parts are bpftrace processes (auto would
    # sample with perf here, and run the time model from its compiled object, in pgprobe)
    argv = ["triage", *busy.conn_args, "-d", "8", "-o", str(report), "--json"]
    run = start_pgprobe([*argv, "--unwind", "fp", "--engine", "bpftrace"])
    wait_attached(run.pid, count=3)
    (slru_tracer,) = tracers(run.pid, "clog_reads_uprobe.bt")
    os.kill(slru_tracer, signal.SIGKILL)
    out, err = run.communicate(timeout=240)
    assert run.returncode == 0, err
    doc = json.loads(out)
    assert doc["clog_reads"] is None
    assert doc["hot"] is not None and doc["lwlocks"] is not None  # the time model's table
    assert sorted(doc["meta"]["parts"]) == ["profile", "waits"]
    why = [w for w in doc["meta"]["warnings"] if w.startswith("clog_reads produced nothing")]
    assert why and "bpftrace was killed by signal 9 (SIGKILL)" in why[0], doc["meta"]["warnings"]
    missing = [f for f in doc["findings"] if f["id"] == "capture.missing.clog_reads"]
    assert missing and "killed by signal 9" in missing[0]["evidence"]
    assert "killed by signal 9" in report.read_text()


# -- the server going away -------------------------------------------------------------------


def pg_ctl_stop(pg: PgCluster) -> None:
    subprocess.run(
        as_postgres([str(pg.bindir / "pg_ctl"), "-D", str(pg.data), "-m", "fast", "-w", "stop"]),
        check=True,
        capture_output=True,
        timeout=120,
    )


def test_tools_print_what_the_probes_collected_when_the_server_stops(busy: PgCluster) -> None:
    """pg_ctl stop 2 s into lwlocks and clog-reads: both print their tables, exit 0."""
    lw = start_pgprobe(
        [
            "lwlocks",
            "--source",
            "usdt",
            "--max-events-per-sec",
            "0",
            *busy.conn_args,
            "-d",
            "8",
            "--by",
            "pid",
            "--json",
        ]
    )
    clog = start_pgprobe(["clog-reads", *busy.conn_args, "-d", "8", "--json"])
    wait_attached(lw.pid)
    wait_attached(clog.pid)
    pg_ctl_stop(busy)
    lw_out, lw_err = lw.communicate(timeout=120)
    clog_out, clog_err = clog.communicate(timeout=120)
    assert lw.returncode == 0, lw_err
    assert "Traceback" not in lw_err + clog_err
    assert json.loads(lw_out)["rows"], "pgbench waited on LWLocks before the stop"
    assert clog.returncode == 0, clog_err
    meta = json.loads(clog_out)["meta"]
    assert meta["slru_stats"] is None
    assert "cannot read pg_stat_slru" in meta["slru_stats_unavailable"]
    assert "pgprobe: warning: cannot read pg_stat_slru" in clog_err


def test_triage_report_is_cut_where_the_server_went_away(busy: PgCluster, tmp_path: Path) -> None:
    """pg_ctl stop 3 s into triage -d 8: the report is written, SQL cut there, a finding."""
    report = tmp_path / "r.html"
    # --unwind fp and --engine bpftrace: all three parts are bpftrace processes (auto would
    # sample with perf here, and run the time model from its compiled object, in pgprobe)
    argv = ["triage", *busy.conn_args, "-d", "8", "-o", str(report), "--json"]
    run = start_pgprobe([*argv, "--unwind", "fp", "--engine", "bpftrace"])
    wait_attached(run.pid, count=3)
    time.sleep(2)
    pg_ctl_stop(busy)
    stopped = time.monotonic()
    out, err = run.communicate(timeout=240)
    assert run.returncode == 0, err
    doc = json.loads(out)
    gone = doc["meta"]["server_went_away"]
    assert gone["what"] == "the server stopped", gone
    assert 0 < gone["sql_window_s"] < doc["meta"]["duration_s"]
    assert doc["stats"] is not None, "the deltas up to the last good reading are kept"
    assert doc["activity"]["samples"] and "cut_at_s" in doc["activity"]
    assert doc["lwlocks"]["rows"] and doc["hot"]["rows"], "the probes went on"
    assert doc["waits"]["cluster_rows"], "the time model went on too"
    found = [f for f in doc["findings"] if f["id"] == "capture.server_gone"]
    assert found and found[0]["title"].startswith("The server stopped during the capture, at ")
    assert f"at {gone['at']}" in report.read_text()
    assert time.monotonic() - stopped < 120


# -- a probe site taken by another uprobe ----------------------------------------------------


@pytest.fixture
def perf_probe_on_done_sites(busy: PgCluster) -> Iterator[list[str]]:
    """perf probe on each lwlock__wait__done site (no semaphore), in use by perf stat."""
    from pgprobe import discover, usdt

    need(shutil.which("perf") is not None, "perf is not installed")
    binary = discover.from_pids([busy.postmaster_pid]).binary
    sites = [s for s in usdt.probe_sites(binary) if s.name == "lwlock__wait__done"]
    assert sites
    events = []
    try:
        for i, site in enumerate(sites):
            name = f"pgprobe_test_done{i}"
            subprocess.run(
                ["perf", "probe", "-q", "-x", binary, "-a", f"{name}=0x{site.offset:x}"],
                check=True,
                capture_output=True,
            )
            events.append(f"probe_postgres:{name}")
        stat = subprocess.Popen(
            ["perf", "stat", *[a for e in events for a in ("-e", e)], "-a", "sleep", "120"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1)
        try:
            yield events
        finally:
            stat.terminate()
            stat.wait(timeout=30)
    finally:
        for event in events:
            subprocess.run(["perf", "probe", "-q", "-d", event], capture_output=True)


@pytest.mark.parametrize("engine", ["libbpf", "bpftrace"])
def test_usdt_sites_taken_by_perf_probe_are_said_loudly(
    busy: PgCluster, perf_probe_on_done_sites: list[str], engine: str
) -> None:
    """Another uprobe without the semaphore on the done probe's sites: said before the
    capture; bcc (bpftrace) then loses the waits ending there, and says so. libbpf attaches a
    USDT probe at all its sites or none: where its object would run, the script runs instead,
    said in one line."""
    run = start_pgprobe(["lwlocks", "--source", "usdt", *busy.conn_args, "-d", "10",
                         "--max-events-per-sec", "0",
                         "--engine", "bpftrace" if engine == "bpftrace" else "auto"])  # fmt: skip
    event = perf_probe_on_done_sites[0].replace(":", "/")
    wait_attached(run.pid)
    (tracer,) = tracers(run.pid)
    out, err = run.communicate(timeout=180)
    assert run.returncode == 0, err
    # The perf uprobe PMU refused those sites, so bcc registered them through tracefs:
    # bpftrace, stopped after its answer, still removes them as it ends (SIGKILL would not).
    events = Path("/sys/kernel/tracing/uprobe_events")
    deadline = time.monotonic() + 60
    while f"_bcc_{tracer} " in events.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"_bcc_{tracer} " not in events.read_text()
    assert f"another uprobe ({event}) sits on USDT probe lwlock__wait__done" in err
    assert "perf probe -d probe_postgres:" in err
    assert "LWLock waits started and never ended in the probe" in err, (out, err)
    said = "another uprobe sits on a site of the LWLock probes: ran bpf/lwlock_wait.bt"
    assert (said in err) == (engine == "libbpf"), err


def test_doctor_lists_other_uprobes_on_the_sites(
    busy: PgCluster, perf_probe_on_done_sites: list[str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgprobe", "doctor", *busy.conn_args, "--json"],
        capture_output=True,
        text=True,
        cwd=CHECKOUT,
        timeout=180,
    )
    checks = {row["check"]: row for row in json.loads(done.stdout)["rows"]}
    assert checks["other uprobes"]["status"] == "warn"
    assert perf_probe_on_done_sites[0].replace(":", "/") in checks["other uprobes"]["detail"]
    assert "perf probe -d" in checks["other uprobes"]["fix"]


def test_no_other_uprobes_is_ok(cluster: PgCluster, tracing: None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgprobe", "doctor", *cluster.conn_args, "--json"],
        capture_output=True,
        text=True,
        cwd=CHECKOUT,
        timeout=180,
    )
    checks = {row["check"]: row for row in json.loads(done.stdout)["rows"]}
    assert checks["other uprobes"]["status"] == "ok", checks["other uprobes"]
