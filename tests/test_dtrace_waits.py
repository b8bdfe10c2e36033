"""d/waits.d in a real DTrace (DTrace for Linux 2.0.7, scripts/setup-dtrace), a real cluster.

The ground truth of tests/test_waits.py for the DTrace twin: a backend in
pg_sleep(2) is charged Timeout:PgSleep 2.0 s +- 2 %, named as pg_stat_activity
names it while it sleeps; its on-CPU and runqueue time equal the deltas of
/proc/PID/schedstat over the same window (the backend sleeps across both
edges); a backend idle in transaction meanwhile (BEGIN; SELECT 1; nothing until
the sleep ends) is active Client:ClientRead in state "idle in transaction" for
that time +- 2 % (d/waits.d's copyin of MyBEEntry->st_state). The sleep starts
after dtrace printed @@attached and ends before Ctrl-C, so the whole sleep is
inside the window. Then d/waits.d run by hand with its lock parameters (MyProc's
address, offsetof(PGPROC, waitLock)) and QID_OFF: a SELECT queued 2 s behind a table lock
is charged to the lock pg_locks showed it queued on, in its mode, and to the query id
pg_stat_activity showed for it, its own truth +- 2 % (the checks of tests/test_locks.py).
Under CI=true it fails when DTrace is missing.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from byhand import ByHand, by_hand_args, major_of, script_lost
from helpers import CHECKOUT, steal_seconds_since, steal_ticks
from test_dtrace_live import Run, dtrace
from test_locks import HOLD_S, TIMED, Scene, check_script_locks
from test_queries import script_queries
from test_waits import near, schedstat, settled, total_us

from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

__all__ = ["dtrace"]  # the fixture, shared with test_dtrace_live


def test_pg_sleep_is_timeout_pgsleep(dtrace: str, tmp_path: Path) -> None:
    with (
        PgCluster(name="pgprobe-dtrace-waits") as pg,
        pg.connect() as sleeper,
        pg.connect() as intx,
    ):
        pid, intx_pid = sleeper.info.backend_pid, intx.info.backend_pid
        before, steal_before = settled({"sleeper": pid})["sleeper"], steal_ticks()
        args = ["waits", *pg.conn_args, "--engine", "dtrace", "--by", "pid", "-d", "900"]
        run = Run(tmp_path, *args, "--json", dtrace=dtrace)
        print(f"dtrace attached in {run.wait_attached('@@attached', 2.0):.1f} s")
        assert schedstat(pid) == before, "ran while attaching"
        intx.execute("BEGIN")
        intx.execute("SELECT 1")
        began = time.monotonic()
        work = threading.Thread(target=sleeper.execute, args=("SELECT pg_sleep(2)",))
        work.start()
        time.sleep(1.0)
        query = "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = "
        (seen,) = pg.sql(f"{query}{pid}")
        work.join(timeout=60)
        in_tx_truth = time.monotonic() - began
        intx.execute("COMMIT")
        after = settled({"sleeper": pid})["sleeper"]
        steal_us = steal_seconds_since(steal_before) * 1e6
        doc, err, stop_s = run.stop()
        assert schedstat(pid) == after, "ran while stopping"
    print(f"stderr {err.strip()!r}; stopped in {stop_s:.1f} s")
    assert seen == ("Timeout", "PgSleep")
    assert doc["meta"]["engine"] == "dtrace"
    sleep_s = total_us(doc["rows"], pid, "wait", "Timeout", "PgSleep") / 1e6
    print(f"PgSleep {sleep_s:.4f} s (truth 2.0)")
    assert near(sleep_s, 2.0), sleep_s
    in_tx = [r for r in doc["rows"] if r["pid"] == intx_pid
             and r["state"] == "idle in transaction"]  # fmt: skip
    in_tx_s = sum(r["total_us"] for r in in_tx) / 1e6
    print(f"idle in transaction {in_tx_s:.4f} s (truth {in_tx_truth:.4f})")
    assert {r["category"] for r in in_tx} == {"wait"}
    assert near(in_tx_s, in_tx_truth), (in_tx_s, in_tx_truth)

    cpu_us, runq_us = total_us(doc["rows"], pid, "on CPU"), total_us(doc["rows"], pid, "runqueue")
    cpu_truth, runq_truth = (after[0] - before[0]) / 1e3, (after[1] - before[1]) / 1e3
    runs = after[2] - before[2]
    print(f"on CPU {cpu_us:.0f} us (schedstat {cpu_truth:.0f}), runqueue {runq_us:.0f} us "
          f"(schedstat {runq_truth:.0f}), {runs} runs")  # fmt: skip
    # Per run, schedstat (rq clock) and the probe (its own clock) stamp a switch a
    # few us apart (see tests/test_waits.py): 50 us a run, as there.
    busy, busy_truth = cpu_us + runq_us, cpu_truth + runq_truth
    # The probe's on-CPU may also hold the machine's steal (wall clock), as in test_waits.
    assert busy >= busy_truth - max(busy_truth * 0.02, 50 * runs), (busy, busy_truth)
    assert busy <= busy_truth + max(busy_truth * 0.02, 50 * runs + steal_us), (busy, steal_us)


def test_a_lock_wait_by_hand(dtrace: str) -> None:
    with PgCluster({"compute_query_id": "on"}, name="pgprobe-dtrace-locks") as pg:
        pg.sql("CREATE TABLE t (id int)")
        pg.sql(TIMED)
        args = by_hand_args(pg, pg.postgres_binary or pg.bindir / "postgres")
        by_hand = ByHand([dtrace, "-qs", str(CHECKOUT / "d" / "waits.d"), *args], "@@attached")
        scene = Scene(pg)
        try:
            holder = scene.session()
            holder.execute("BEGIN")
            holder.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")
            waiter = scene.wait("SELECT count(*) FROM t", set())
            (qid,) = pg.sql(f"SELECT query_id FROM pg_stat_activity WHERE pid = {waiter}")[0]
            time.sleep(HOLD_S)
            holder.execute("COMMIT")
        finally:
            scene.done()
        assert not scene.errors, scene.errors
        lines = by_hand.stop()
        check_script_locks(scene, lines, major_of(pg), "waits.d")
    # QID_OFF: the wait on the statement pg_stat_activity showed (timed()'s, the top level)
    rows = script_queries(lines)
    locked = sum(ns for (tid, kind, _s, wei, q), ns in rows.items()
                 if tid == waiter and kind == 4 and wei >> 24 == 3 and q == qid) / 1e9  # fmt: skip
    print(f"waits.d by hand: {locked:.4f} s of Lock on query {qid} (truth {scene.truth[waiter]})")
    if waiter in script_lost(lines):  # counted in check_script_locks' lost paths
        assert locked <= 1.02 * scene.truth[waiter], rows
    else:
        assert locked == pytest.approx(scene.truth[waiter], rel=0.02), rows
