"""`pgprobe serve` scraped by a real Prometheus server, against a loaded throwaway cluster.

Long because it holds every serve test, the real Prometheus one among them.

Prometheus is Debian's package (scripts/setup installs it), started here on a
loopback port with a temporary config (scrape every second) and storage dir.
The load: pgbench -c 8 (LWLock waits: WALWrite, LockManager, BufferContent ...)
and one backend looking up the status of xids spread over more pg_xact pages
than the server has buffers (every lookup reads a page: slru_workload). The
test asks Prometheus' HTTP API for rate() of the counters, then restarts
PostgreSQL and asks again: the same series go on, counting.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import CHECKOUT, need, run_pgprobe
from slru_workload import (
    CLUSTER_SETTINGS,
    XACT,
    burn_xids,
    provoke_xact_reads,
    slru_delta,
    slru_stats,
    xact_burn_size,
)
from test_flame import assert_close, backend, cpu_seconds, run_query  # noqa: F401 (fixture)

from pgprobe.engines.base import Log2Hist, Snapshot, Stats
from pgprobe.sandbox import PgCluster, as_postgres, free_port, pg_bindir
from pgprobe.tools.serve import metrics, records

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
WINDOW_S = 2


def _have_postgres() -> bool:
    try:
        return (pg_bindir() / "initdb").exists()
    except (OSError, RuntimeError, ValueError):
        return False


# -- without a server ------------------------------------------------------------------------


def test_windows_add_up_and_histograms_are_cumulative() -> None:
    totals = records.Totals()
    hist = Log2Hist(((0, 0, 1), (1024, 2047, 3), (4096, 8191, 2), (2**40, 2**41 - 1, 1)))
    key = (0, "WALWrite", "Exclusive")
    window = Snapshot(maps={"wait_stats": {key: Stats(7, 70_000)}, "wait_ns": {key: hist}})
    for _ in range(2):
        records.add_lwlock(totals, window)
    assert totals.lwlock_waits["WALWrite", "Exclusive"] == 14
    assert totals.lwlock_wait_ns["WALWrite", "Exclusive"] == 140_000
    buckets = dict(metrics.histogram_buckets(totals.lwlock_hist["WALWrite"]))
    assert buckets[repr(1024 / 1e9)] == 2  # the [0, 0] bucket folds into the first one
    assert buckets[repr(2048 / 1e9)] == 8
    assert buckets[repr(8192 / 1e9)] == 12
    assert buckets[repr(2**34 / 1e9)] == 12 and buckets["+Inf"] == 14  # beyond: +Inf only


@pytest.mark.parametrize("listen", ["nohost", "127.0.0.1:0", "127.0.0.1:70000", "1.2.3.4:x"])
def test_bad_listen_is_one_line(listen: str) -> None:
    done = run_pgprobe(["serve", "--listen", listen])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "not ADDR:PORT" in done.stderr


def test_without_root_it_says_so_before_listening() -> None:
    port = free_port()
    done = run_pgprobe(["serve", "--listen", f"127.0.0.1:{port}"], unprivileged=True)
    assert done.returncode == 3 and done.stderr.count("\n") == 1, done.stderr
    assert "needs root" in done.stderr and "serving" not in done.stderr


# -- with Prometheus -------------------------------------------------------------------------


def prometheus_query(port: int, query: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as reply:
        doc = json.load(reply)
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = check()
        except OSError:  # Prometheus is still starting
            found = None
        if found:
            return found
        time.sleep(1)
    pytest.fail(f"no {what} within {timeout:.0f} s")


def values(result: list[dict[str, Any]]) -> dict[str, float]:
    return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in result}


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Any]:
    """start(target_port) -> Prometheus' own port; stopped and removed after the test."""
    need(os.path.exists(PROMETHEUS), "prometheus is not installed (apt-get install prometheus)")
    started: list[subprocess.Popen[bytes]] = []
    storage = Path(tempfile.mkdtemp(prefix="pgprobe-prometheus-"))

    def start(target: int) -> int:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: pgprobe\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{target}']}}]\n"
        )
        log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (closed with the process)
        started.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={storage}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        ))  # fmt: skip
        return port

    yield start
    for p in started:
        p.terminate()
        p.wait(timeout=30)
    shutil.rmtree(storage, ignore_errors=True)


def dashboard_queries() -> list[str]:
    """The PromQL of contrib/grafana-pgprobe.json, with Grafana's variables filled in."""
    doc = json.loads((CHECKOUT / "contrib" / "grafana-pgprobe.json").read_text())
    return [
        target["expr"].replace("$__rate_interval", "8s").replace("$instance", ".*")
        for panel in doc["panels"]
        for target in panel["targets"]
    ]


class XactReader:
    """A thread that keeps one backend reading pg_xact pages, across server restarts."""

    def __init__(self, cluster: PgCluster, first: int, last: int) -> None:
        self.cluster, self.first, self.last = cluster, first, last
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.done.is_set():
            try:
                with self.cluster.connect() as conn:
                    while not self.done.is_set():
                        provoke_xact_reads(conn, self.first, self.last, rounds=1)
            except Exception:  # the server is restarting: connect again
                time.sleep(0.5)

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)


@dataclass
class SlruCluster:
    """A cluster with few SLRU buffers and xids burned over more pg_xact pages than buffers."""

    pg: PgCluster
    first: int
    last: int


@pytest.fixture(scope="module")
def slru_cluster(tracing: None) -> Iterator[SlruCluster]:
    need(_have_postgres(), "no PostgreSQL server installed (initdb not found)")
    with PgCluster(settings=CLUSTER_SETTINGS, name="pgprobe-serve") as pg:
        init = pg.pgbench("-i", "-q", "-s", "1")
        assert init.wait(timeout=120) == 0
        with pg.connect() as conn:
            first, last = burn_xids(pg.conninfo, xact_burn_size(conn))
        yield SlruCluster(pg, first, last)


def start_agent(pg: PgCluster, port: int, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "serve", *pg.conn_args,
         "--listen", f"127.0.0.1:{port}", *args],
        stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
    )  # fmt: skip


def stop_agent(agent: subprocess.Popen[str]) -> str:
    agent.send_signal(signal.SIGTERM)
    err = agent.communicate(timeout=60)[1]
    print(err)
    assert agent.returncode == 0, err
    assert err.rstrip().endswith("stopped"), err
    return err


@pytest.mark.integration
def test_slru_reads_equal_pg_stat_slru(slru_cluster: SlruCluster) -> None:
    pg = slru_cluster.pg
    port = free_port()
    agent = start_agent(pg, port, "--window", "1")
    key = 'pgprobe_slru_reads_total{slru="pg_xact"}'
    try:
        up = 'pgprobe_capture_up{source="slru"}'
        wait_for("the SLRU capture", lambda: scrape(port).get(up) == 1, 60)
        time.sleep(2.5)  # two windows: the counter is settled (nothing reads meanwhile)
        start = scrape(port)[key]
        with pg.connect() as conn:
            before = slru_stats(conn)
            provoke_xact_reads(conn, slru_cluster.first, slru_cluster.last, rounds=20)
            delta = slru_delta(before, slru_stats(conn))[XACT][1]
        assert delta > 100
        # The window holding the last read ends within a second: then the counter has them all.
        wait_for("every read counted", lambda: scrape(port)[key] - start >= delta, 15)
        time.sleep(2.5)
        counted = scrape(port)[key] - start
        print(f"pg_stat_slru Xact blks_read +{delta}, pgprobe_slru_reads_total +{counted:.0f}")
        assert counted == delta  # all of them, and no more
    finally:
        stop_agent(agent)


@pytest.mark.integration
def test_prometheus_scrapes_rates_that_survive_a_server_restart(
    slru_cluster: SlruCluster, prometheus_for: Any
) -> None:
    pg, first, last = slru_cluster.pg, slru_cluster.first, slru_cluster.last
    agent_port = free_port()
    agent = start_agent(pg, agent_port, "--window", str(WINDOW_S))
    reader = XactReader(pg, first, last)
    load = pg.pgbench("-c", "8", "-T", "200")
    try:
        port = prometheus_for(agent_port)
        lwlock = "sum(rate(pgprobe_lwlock_wait_seconds_total[8s]))"
        slru = 'rate(pgprobe_slru_reads_total{slru="pg_xact"}[8s])'

        def positive(query: str) -> Any:
            found = values(prometheus_query(port, query))
            return found if found and all(v > 0 for v in found.values()) else None

        before = wait_for("LWLock wait rate", lambda: positive(lwlock), 40)
        slru_before = wait_for("pg_xact read rate", lambda: positive(slru), 20)
        waits = values(prometheus_query(port, "pgprobe_lwlock_waits_total"))
        print(f"before the restart: lwlock {before}, pg_xact {slru_before}")
        # Every query of contrib/'s Grafana dashboard parses, and finds its series.
        for expr in dashboard_queries():
            assert prometheus_query(port, expr), expr

        old = pg.postmaster_pid
        load.kill()
        load.wait()
        restart = [str(pg.bindir / "pg_ctl"), "-D", str(pg.data), "-m", "fast", "-w",
                   "-l", str(pg.root / "server.log"), "restart"]  # fmt: skip
        subprocess.run(as_postgres(restart), check=True, capture_output=True, timeout=120)
        assert pg.postmaster_pid != old
        load = pg.pgbench("-c", "8", "-T", "200")

        restarted = (
            "pgprobe_server_restarts_total == 1 and on() pgprobe_capture_up{source='lwlock'} == 1"
        )
        wait_for("the agent back on the new server", lambda: prometheus_query(port, restarted), 30)
        after_t = time.time()
        wait_for(
            "LWLock wait rate after the restart",
            lambda: time.time() - after_t > 8 and positive(lwlock),
            30,
        )
        after = values(prometheus_query(port, lwlock))
        slru_after = wait_for("pg_xact read rate after the restart", lambda: positive(slru), 20)
        print(f"after the restart: lwlock {after}, pg_xact {slru_after}")
        # The same series, still counting (counters never went back: no reset in between).
        now = values(prometheus_query(port, "pgprobe_lwlock_waits_total"))
        assert set(waits) <= set(now)
        assert all(now[k] >= v for k, v in waits.items())
        resets = values(prometheus_query(port, "sum(resets(pgprobe_lwlock_waits_total[5m]))"))
        assert list(resets.values()) == [0.0]
        assert values(prometheus_query(port, "pgprobe_capture_lost_events_total")) is not None
    finally:
        reader.stop()
        load.kill()
        load.wait()
        err = stop_agent(agent)
    assert "the server went away" in err


def scrape(port: int) -> dict[str, float]:
    """The agent's /metrics as {'name{labels}': value} (text format, no comments)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def tracers(pid: int) -> dict[str, int]:
    """The agent's bpftrace children, by script name."""
    from pgprobe import proc

    found = {}
    for child in proc.children(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        scripts = [a.decode() for a in argv if a.endswith(b".bt")]
        if scripts:
            found[Path(scripts[0]).stem] = child
    return found


@pytest.mark.integration
def test_a_dead_tracer_is_restarted_and_sigterm_stops_everything(
    cluster: PgCluster, tracing: None
) -> None:
    port = free_port()
    agent = start_agent(cluster, port, "--window", "1")
    up = [f'pgprobe_capture_up{{source="{s}"}}' for s in ("lwlock", "slru", "cpu")]
    try:
        wait_for("every capture up", lambda: all(scrape(port).get(k) == 1 for k in up), 60)
        running = tracers(agent.pid)
        assert set(running) == {"lwlock_wait", "clog_reads", "profile"}, running
        os.kill(running["clog_reads"], signal.SIGKILL)
        restarted = 'pgprobe_capture_restarts_total{source="slru"}'
        wait_for(
            "the SLRU tracer started again",
            lambda: scrape(port).get(restarted) == 1 and scrape(port).get(up[1]) == 1,
            60,
        )
        again = tracers(agent.pid)
        assert again["clog_reads"] != running["clog_reads"]
        assert again["profile"] == running["profile"]  # the others ran on
        assert scrape(port)['pgprobe_capture_restarts_total{source="cpu"}'] == 0
        # The last window's CPU profile is pprof.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/pprof/profile") as reply:
            assert reply.read(2) == b"\x1f\x8b"
    finally:
        err = stop_agent(agent)
    assert "SLRU reads stopped" in err
    assert not any(os.path.exists(f"/proc/{p}") for p in again.values())


@pytest.mark.integration
def test_cpu_samples_are_the_backend_cpu_time_at_the_rate(
    cluster: PgCluster,
    backend: tuple[psycopg.Connection[Any], int],  # noqa: F811
) -> None:
    conn, pid = backend
    hz = 199
    port = free_port()
    agent = start_agent(cluster, port, "--window", "1", "-F", str(hz))
    key = 'pgprobe_cpu_samples_total{backend_type="client backend"}'
    try:
        up = 'pgprobe_capture_up{source="cpu"}'
        wait_for("the CPU capture", lambda: scrape(port).get(up) == 1, 60)
        time.sleep(2.5)  # two windows: the counter is settled (the backends are idle)
        start = scrape(port).get(key, 0.0)
        before = cpu_seconds(pid)
        run_query(cluster, conn, pid, 2.0)  # idle before and after: all there is to sample
        cpu_s = cpu_seconds(pid) - before
        time.sleep(2.5)  # the window holding the query's last samples has ended
        samples = scrape(port)[key] - start
        assert_close(int(samples), cpu_s, hz)
        # Backends that come and go are named too, their last window included (pgbench's
        # short check connection may be gone before a scan of /proc sees it: "unknown").
        unknown = 'pgprobe_cpu_samples_total{backend_type="unknown"}'
        before_bench = scrape(port)
        bench = cluster.pgbench("-c", "4", "-T", "4")
        assert bench.wait(timeout=60) == 0
        time.sleep(2.5)
        after_bench = scrape(port)
        named = after_bench[key] - before_bench[key]
        unnamed = after_bench.get(unknown, 0) - before_bench.get(unknown, 0)
        print(f"pgbench: {named:.0f} samples of client backends, {unnamed:.0f} unknown")
        assert named > 20 and unnamed <= 0.1 * named
    finally:
        stop_agent(agent)
