"""waits.bt keeps a live task's running totals in its @task entry (fields 4-8: on CPU,
runqueue after a preemption and after a wakeup, the wait event it last slept in and the
time asleep in it), not in @cpu_ns / @runq_ns / @wait_ns, which get them when it exits
or (the wait) when the event changes. Pure: the readers add them, in one window and in
the difference of two (interval mode), for `waits` and for `lwlocks --source sched`."""

from __future__ import annotations

from typing import Any

from pgprobe import waitevents
from pgprobe.discover import Cluster, Targets
from pgprobe.engines.base import Log2Hist, Snapshot
from pgprobe.tools.lwlocks.records import rows as lwlocks_rows
from pgprobe.tools.lwlocks.records import sleep_records
from pgprobe.tools.lwlocks.view import cells as lwlocks_cells
from pgprobe.tools.waits import records

CLIENT_READ = 0x06000000
WAL_INSERT = 0x01000037  # LWLock:WALInsert on 15


def snapshot(now: int, task: tuple[int, ...], wait_ns: dict[Any, Any]) -> Snapshot:
    return Snapshot(
        maps={
            "window_ns": {(): 1_000},
            "now_ns": {(): now},
            "cpu_ns": {(7,): 100},  # charged before (an earlier life of the map)
            "runq_ns": {(7, records.WOKEN): 10},
            "wait_ns": wait_ns,
            "task": {(7,): task, (8,): (0, records.NOT_OURS, 0, 0, 0, 0, 0, 0, 0)},
        }
    )


def test_running_totals_in_task_are_added() -> None:
    # asleep in ClientRead since 9,000; totals: 2,000 on CPU, 300 + 400 runnable,
    # 5,000 in WALInsert (its last event) besides what @wait_ns had
    task = (9_000, records.ASLEEP, CLIENT_READ, 0, 2_000, 300, 400, WAL_INSERT, 5_000)
    snap = snapshot(10_000, task, {(7, WAL_INSERT): 700, (7, CLIENT_READ): 50})
    (p,) = records.records(snap, [], lambda pid: pid == 7)
    assert p.cpu_ns == 2_100
    assert p.runq_ns == {records.PREEMPTED: 300, records.WOKEN: 410}
    # ClientRead: the map's 50 plus the open sleep (10,000 - 9,000)
    assert p.wait_ns == {WAL_INSERT: 5_700, CLIENT_READ: 1_050}


def test_interval_windows_are_differences_of_the_totals() -> None:
    """The event changed between two prints: the running total moved to @wait_ns."""
    first = snapshot(10_000, (9_500, records.ON_CPU, 0, 0, 2_000, 0, 0, WAL_INSERT, 5_000), {})
    second = snapshot(
        20_000,
        (19_000, records.ON_CPU, 0, 0, 6_000, 0, 0, CLIENT_READ, 3_000),
        {(7, WAL_INSERT): 5_000},
    )
    (p,) = records.since(first, second, [], lambda pid: pid == 7)
    assert p.wait_ns == {CLIENT_READ: 3_000}
    assert p.cpu_ns == (6_000 + 1_000) - (2_000 + 500)


def test_lwlocks_sleeps_include_the_running_total() -> None:
    assert waitevents.name(15, WAL_INSERT) == ("LWLock", "WALInsert")
    task = (9_000, records.ON_CPU, 0, 0, 0, 0, 0, WAL_INSERT, 5_000)
    snap = snapshot(10_000, task, {(7, WAL_INSERT): 700, (7, CLIENT_READ): 50})
    (rec,) = sleep_records(snap, 15, clipped=False)
    assert (rec.pid, rec.tranche, rec.total_ns) == (7, "WALInsert", 5_700)
    later = snapshot(20_000, (19_000, records.ON_CPU, 0, 0, 0, 0, 0, WAL_INSERT, 9_000),
                     {(7, WAL_INSERT): 700})  # fmt: skip
    (rec,) = sleep_records(later, 15, clipped=True, previous=snap)
    assert rec.total_ns == 4_000


def test_a_window_with_sleep_time_and_no_sleep_ended_has_no_average() -> None:
    """--interval: a sleep in WALInsert across the window's edges charges its time to the
    window and ends in a later one: the row has time and 0 sleeps, and no average."""
    snap = snapshot(10_000, (9_000, records.ON_CPU, 0, 0, 0, 0, 0, WAL_INSERT, 5_000), {})
    later = snapshot(20_000, (19_000, records.ON_CPU, 0, 0, 0, 0, 0, WAL_INSERT, 9_000), {})
    recs = sleep_records(later, 15, clipped=True, previous=snap)
    targets = Targets(Cluster(1, "/bin/postgres", 150018, "15.18", None), [], True)
    (row,) = lwlocks_rows(recs, targets, by_pid=False)
    data = row.as_json()
    assert (data["waits"], data["total_us"], data["avg_us"]) == (0, 4.0, None)
    assert lwlocks_cells(row)["avg_us"] == "-"


def test_a_sleep_under_way_is_in_the_total_not_in_the_average() -> None:
    """One 100 us WALInsert sleep ended, another is under way since 1,000 ns before the
    read: the total holds both (as the time model does), the average the ended one alone,
    never above MAX (a CI run had AVG 471 us over MAX 131 us from an open 9 ms WALWrite)."""
    hist = Log2Hist(((65_536, 131_071, 1),))
    snap = snapshot(110_000, (109_000, records.ASLEEP, WAL_INSERT, 0, 0, 0, 0, 0, 0),
                    {(7, WAL_INSERT): 100_000})  # fmt: skip
    snap.maps["wait_hist"] = {(7, WAL_INSERT): hist}
    (rec,) = sleep_records(snap, 15, clipped=False)
    assert (rec.waits, rec.total_ns, rec.ended_ns) == (1, 101_000, 100_000)
    targets = Targets(Cluster(1, "/bin/postgres", 150018, "15.18", None), [], True)
    (row,) = lwlocks_rows([rec], targets, by_pid=False)
    data = row.as_json()
    assert (data["total_us"], data["avg_us"]) == (101.0, 100.0)
    assert data["avg_us"] <= data["max_us"]


def test_lost_warning_names_only_what_was_lost() -> None:
    """One line, and only the kinds of events that were lost: no "0 switch-ins" beside
    the breaks that were the only loss."""
    none = {"switch_in": 0, "switch_out": 0, "wakeup": 0, "cpu_gaps": 0}
    assert records.lost_warning(none, 0.0) is None
    gaps = records.lost_warning({**none, "cpu_gaps": 3}, 1.25)
    assert gaps is not None and gaps.startswith("events lost: 3 breaks of 1.2 ms")
    assert "switch" not in gaps and "wakeups" not in gaps
    switches = records.lost_warning({**none, "switch_out": 2}, 0.0)
    assert switches == (
        "events lost: 0 switch-ins and 2 switch-outs (those intervals are not accounted)"
    )
    wakeups = records.lost_warning({**none, "wakeup": 5}, 0.0)
    assert wakeups is not None and "5 wakeups" in wakeups and "switch" not in wakeups
