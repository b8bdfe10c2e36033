"""`pgprobe lwlocks` against a real cluster under pgbench, with real bpftrace."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers import bpftrace_child, perf_event_fds, run_pgprobe

from pgprobe.errors import EXIT_ENV
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

REAL_TRANCHES = {"WALWrite", "LockManager", "BufferContent", "WALInsert", "ProcArray", "XactSLRU"}


@pytest.fixture(scope="module")
def load(cluster: PgCluster, tracing: None) -> Iterator[PgCluster]:
    """pgbench -c 8 (TPC-B-like on scale 2): WALWrite and LockManager waits within seconds."""
    bench = cluster.pgbench("-c", "8", "-j", "2", "-T", "900")
    time.sleep(1.5)  # let the clients connect before tracing starts
    assert bench.poll() is None, bench.communicate()[0]
    yield cluster
    bench.terminate()
    bench.communicate(timeout=30)


class ActivitySampler(threading.Thread):
    """pg_stat_activity every 20 ms: LWLock wait events seen, the independent view."""

    def __init__(self, cluster: PgCluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.seen: Counter[str] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        with self.cluster.connect() as conn, conn.cursor() as cur:
            while not self.stop.is_set():
                cur.execute(
                    "SELECT wait_event FROM pg_stat_activity "
                    "WHERE wait_event_type = 'LWLock' AND pid <> pg_backend_pid()"
                )
                self.seen.update(str(r[0]) for r in cur.fetchall())
                time.sleep(0.02)


def bench_pids(cluster: PgCluster) -> list[int]:
    rows = cluster.sql("SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench'")
    return sorted(int(str(r[0])) for r in rows)


def lwlocks_json(cluster: PgCluster, *extra: str) -> dict[str, Any]:
    done = run_pgprobe(["lwlocks", *cluster.conn_args, "--json", *extra])
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def assert_coherent(row: dict[str, Any]) -> None:
    assert row["waits"] > 0
    assert 0 <= row["p50_us"] <= row["p95_us"] <= row["p99_us"] <= row["max_us"], row
    assert row["avg_us"] <= row["max_us"] + 0.001, row
    # total = waits x avg, to the rounding of avg
    assert abs(row["total_us"] - row["waits"] * row["avg_us"]) <= row["waits"] * 0.001 + 0.01


def test_lwlocks_whole_cluster_under_pgbench(load: PgCluster) -> None:
    sampler = ActivitySampler(load)
    sampler.start()
    doc = lwlocks_json(load, "-d", "5")
    sampler.stop.set()
    sampler.join()

    assert doc["tool"] == "lwlocks"
    meta = doc["meta"]
    assert meta["engine"] == "bpftrace"
    assert meta["postmaster_pid"] == load.postmaster_pid
    assert meta["postgres_version_num"] >= 130000
    assert 4.5 <= meta["duration_s"] <= 7
    assert meta["lost_events"] == 0 and meta["failed_map_updates"] == 0
    rows = doc["rows"]
    assert rows, "pgbench -c 8 gives LWLock waits within seconds"
    assert {r["tranche"] for r in rows} & REAL_TRANCHES
    for row in rows:
        assert_coherent(row)
        assert row["mode"] in ("Exclusive", "Shared", "WaitUntilFree")
    totals = [r["total_us"] for r in rows]
    assert totals == sorted(totals, reverse=True)
    assert abs(sum(r["share_pct"] for r in rows) - 100) < 0.5
    # The independent view: pg_stat_activity sampled the top tranche as a wait event.
    top = rows[0]["tranche"]
    assert sampler.seen, "pg_stat_activity saw no LWLock waits at all"
    assert top in sampler.seen, (top, sampler.seen)


def test_lwlocks_by_pid_names_the_pgbench_backends(load: PgCluster) -> None:
    doc = lwlocks_json(load, "-d", "3", "--by", "pid")
    rows = doc["rows"]
    assert rows
    client_rows = [r for r in rows if r["backend_type"] == "client backend"]
    assert client_rows
    assert {r["pid"] for r in client_rows} <= set(bench_pids(load)) | set(doc["meta"]["pids"])
    assert all(r["application_name"] == "pgbench" for r in client_rows)
    for row in rows:
        assert_coherent(row)


def test_lwlocks_single_pid_counts_only_that_backend(load: PgCluster) -> None:
    pid = bench_pids(load)[0]
    whole = lwlocks_json(load, "-d", "3", "--pid", str(pid), "--by", "pid")
    assert whole["meta"]["pids"] == [pid]
    assert {r["pid"] for r in whole["rows"]} <= {pid}
    assert whole["rows"], "a pgbench backend waits on LWLocks within seconds"


def test_lwlocks_several_pids_filter_in_python(load: PgCluster) -> None:
    pids = bench_pids(load)[:2]
    pid_args = [arg for pid in pids for arg in ("--pid", str(pid))]
    doc = lwlocks_json(load, "-d", "3", *pid_args, "--by", "pid")
    assert {r["pid"] for r in doc["rows"]} <= set(pids)
    assert doc["rows"]


def test_lwlocks_filter_by_application(load: PgCluster) -> None:
    doc = lwlocks_json(load, "-d", "2", "--application", "pgbench")
    assert doc["meta"]["pids"] == bench_pids(load)
    assert doc["meta"]["target"] == "pids"


def test_lwlocks_interval_prints_a_table_per_interval(load: PgCluster) -> None:
    done = run_pgprobe(["lwlocks", *load.conn_args, "-d", "4", "--interval", "1", "--json"])
    assert done.returncode == 0, done.stderr
    docs = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    # 4 one-second intervals, and what the last moments left at exit
    assert 4 <= len(docs) <= 6, len(docs)
    assert docs[-1]["meta"]["final"] is True
    assert all(d["meta"]["interval"] == 1 for d in docs)
    assert sum(1 for d in docs if d["rows"]) >= 3


def test_lwlocks_plain_table_when_piped(load: PgCluster) -> None:
    done = run_pgprobe(["lwlocks", *load.conn_args, "-d", "2"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("LWLock waits: whole cluster")
    assert lines[1].split()[:3] == ["TRANCHE", "MODE", "WAITS"]
    assert len(lines) >= 3
    assert "\x1b[" not in done.stdout  # no colour codes in a pipe


def test_lwlocks_pid_without_connection_uses_proc(load: PgCluster) -> None:
    pid = bench_pids(load)[0]
    # Nothing listens on this port: discovery falls back to /proc for --pid.
    done = run_pgprobe(["lwlocks", "-h", "/nonexistent", "-p", "1", "--pid", str(pid), "-d", "2",
                        "--json"])  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["meta"]["postmaster_pid"] == load.postmaster_pid
    assert doc["meta"]["postgres_version_num"] >= 130000
    assert doc["rows"]


def wait_attached(child: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until pgprobe's bpftrace holds its perf events (a fixed sleep is too short when the
    machine is loaded: SIGINT then lands before the probes attach)."""
    wanted = (os.cpu_count() or 1) + 1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and child.poll() is None:
        pid = bpftrace_child(child.pid)
        if pid is not None and perf_event_fds(pid) >= wanted:
            return
        time.sleep(0.05)


def test_ctrl_c_prints_what_was_collected(load: PgCluster) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "lwlocks", *load.conn_args, "-d", "60", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_attached(child)
    time.sleep(2)  # some waits to collect
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    doc = json.loads(out)
    assert doc["meta"]["interrupted"] is True
    assert doc["meta"]["duration_s"] < 10
    assert doc["rows"]


def test_sigterm_also_prints_what_was_collected(load: PgCluster) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "lwlocks", *load.conn_args, "-d", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(4)
    child.terminate()
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert "interrupted" in out.splitlines()[0]
    assert "TRANCHE" in out


def test_lwlocks_on_each_build(
    pg_build: PgBuild,
    build_cluster: PgCluster,
    tracing: None,
    tested_on: Callable[[str, str], None],
) -> None:
    """With USDT probes: a capture (the checks against pg_stat_activity run on the ONCE
    build above). Without: one short line naming what is missing and what still works."""
    done = run_pgprobe(["lwlocks", *build_cluster.conn_args, "-d", "1", "--json"])
    if pg_build.has_usdt:
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["tool"] == "lwlocks"
        tested_on("lwlocks", "yes")
        return
    assert done.returncode == EXIT_ENV and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert f"lwlocks needs USDT probes: {pg_build.postgres} has none" in line
    assert "(built without --enable-dtrace)" in line
    assert "still works: waits, clog-reads, flame, hot, triage without its LWLock table" in line
    assert line.count(str(pg_build.postgres)) == 1 and len(line) < 160 + len(str(pg_build.postgres))
    tested_on("lwlocks", "refused: no USDT probes")
