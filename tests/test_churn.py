"""Connection churn: every process-second counted once, and only while the process lived.

A load of short sessions (tests/churn_load.py: connections born every 50-200 ms, living
0.05-2 s, some blocked on a row lock, some in pg_sleep, beside a steady pgbench) under
`pgprobe waits --by pid`. Two truths, neither pgprobe's code:

- the kernel's own fork and exit tracepoints, read by a bpftrace one-liner of the test's
  (churn_load.KernelLifetimes): each process's seconds inside the window (the
  postmaster's children born before the one-liner attached: alive from the window's start);
- the server's log (log_connections, log_disconnections): every client backend pgprobe
  counts is one the server started, and its seconds cover at least the span between its
  two log lines (written after its fork and before its exit, to the millisecond).

The compiled time model (the default) on every build; bpf/waits.bt (--engine bpftrace,
the fallback) once. The script's window begins at BEGIN, which bpftrace 0.17 runs before it
attaches the other probes: a process born or ended before they are all in is counted
from the window's start or to its final switch-out, and is not checked one by one.
"""

from __future__ import annotations

import json
import time

import pytest
from churn_load import (
    CHURN_SETTINGS,
    LONGEST_SLEEP_S,
    ChurnLoad,
    KernelLifetimes,
    inside,
    lifetimes,
)
from helpers import cluster_for, run_pgprobe

from pgprobe import proc, safefile
from pgprobe.pgbuilds import PgBuild

# The one-liner's programs and pgprobe's run one after the other at the same tracepoints,
# preemptible (Linux 6.x): under this load a task waited between the two up to 3.3 ms here
# and 9.3 ms in a CI run (the raw fork and exit times agree within 0.05 ms otherwise). The
# errors this test is for are larger: a teardown (12-65 ms), a whole window.
EXACT_S = 0.015
LOG_MS_S = 0.002  # the log's timestamps: milliseconds, truncated
TEARDOWN_S = 0.1  # a backend's exit to its final switch-out: 1-65 ms measured under this load
# "unknown": a sleep begun before the capture and not named, and a new backend's ClientRead
# before its status entry says its state (its first one). The compiled object reads every
# process's wait event at its start: next to none of the first. The script's names come
# from a pg_stat_activity read before bpftrace starts, so a sleep begun between that read
# and BEGIN (bpftrace's compile: 0.3-1 s) is unknown until it ends: never longer than the
# load's longest sleep, in a process that was there before the probes (CI: 1.77 s and
# 2.42 s of 175 s, a few sessions); the rest stays under the share.
UNKNOWN_SHARE = 0.01
BEFORE_CAPTURE = "(asleep since before capture)"  # waitevents.BEFORE_CAPTURE's name


def test_every_process_second_is_counted_once_while_the_process_lived(
    pg_build: PgBuild, tracing: None
) -> None:
    churn(pg_build, "compiled")


@pytest.mark.once
def test_the_script_counts_every_process_second_once(pg_build: PgBuild, tracing: None) -> None:
    churn(pg_build, "bpftrace")


def churn(pg_build: PgBuild, engine: str) -> None:
    argv = [
        "-d",
        "6",
        "--by",
        "pid",
        "--json",
        *(["--engine", engine] if engine != "compiled" else []),
    ]
    with cluster_for(pg_build, CHURN_SETTINGS, name="pgprobe-churn") as pg:
        postmaster = pg.postmaster_pid
        with KernelLifetimes(postmaster) as kernel, ChurnLoad(pg) as load:
            time.sleep(3)  # under way: sessions born and gone before pgprobe starts
            alive_before = set(proc.children(postmaster)) | {postmaster}
            done = run_pgprobe(["waits", *pg.conn_args, *argv])
        assert not load.errors, load.errors
        log = safefile.read_limited(str(pg.root / "server.log"), 256 * 2**20).decode()
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["meta"]["engine"] == ("libbpf" if engine == "compiled" else "bpftrace")
    start, end = doc["meta"]["window_unix_s"]
    counted: dict[int, float] = {}
    unknown: dict[int, float] = {}
    before: dict[int, float] = {}  # of it: asleep since before the capture
    for row in doc["rows"]:
        counted[row["pid"]] = row["wall_us"] / 1e6
        if row["category"] == "unknown":
            unknown[row["pid"]] = unknown.get(row["pid"], 0.0) + row["total_us"] / 1e6
            if row["wait_event"] == BEFORE_CAPTURE:
                before[row["pid"]] = before.get(row["pid"], 0.0) + row["total_us"] / 1e6
    # The kernel: every process of the cluster that lived in the window, for how long.
    lived = alive_before | set(kernel.forks)
    truth = {pid: kernel.inside(pid, start, end) for pid in lived}
    truth = {pid: s for pid, s in truth.items() if s > 0}
    # the probes not all in yet (the script: from BEGIN until bpftrace has attached them)
    attaching = start + max(0.0, doc["meta"]["window_s"] - doc["meta"]["duration_s"]) + 0.05

    # A process that exited (the tracepoint) before the window but was still torn down when
    # the probes came in is counted to its final switch-out.
    def stranger(pid: int) -> bool:
        # its exit just before the window, its teardown into the attach (the tracer then
        # runs at a raised priority: measured 275 ms for one)
        gone_before = kernel.exits.get(pid, end) < start
        return not (gone_before and counted[pid] <= attaching - start + TEARDOWN_S)

    strangers = {pid: (round(counted[pid], 4), kernel.edges(pid, start, end))
                 for pid in set(counted) - set(truth) if stranger(pid)}  # fmt: skip
    assert not strangers, f"counted, but not alive in the window: {strangers}"
    meta = doc["meta"]
    # One by one: each process whose fork and exit the probes were all in to see.
    checked = {pid for pid in counted if pid in truth and not kernel.changed(pid, start, attaching)}
    wrong = {pid: (round(counted[pid], 4), round(truth[pid], 4), kernel.edges(pid, start, end),
                   "born" * (pid in meta["born_pids"]) + "exited" * (pid in meta["exited_pids"]))
             for pid in checked if abs(counted[pid] - truth[pid]) > EXACT_S}  # fmt: skip
    total, true_total = sum(counted.values()), sum(truth.values())
    missed = {pid: (round(s, 4), kernel.edges(pid, start, end)) for pid, s in truth.items()
              if pid not in counted}  # fmt: skip
    summary = (f"{engine}: {len(counted)} processes ({len(kernel.forks)} forked, "
               f"{len(kernel.exits)} exited), {total:.3f} of {true_total:.3f} process-seconds, "
               f"unknown {sum(unknown.values()):.3f} s; not counted: {missed}; "
               f"off (pgprobe, kernel, edges): {wrong}")  # fmt: skip
    print(summary)
    assert not wrong, summary
    assert abs(total - true_total) <= 0.01 * true_total, summary
    if engine == "compiled":
        assert sum(unknown.values()) < UNKNOWN_SHARE * total, summary
    else:
        assert sum(unknown.values()) - sum(before.values()) < UNKNOWN_SHARE * total, summary
        longest = LONGEST_SLEEP_S + EXACT_S
        late = {pid: (round(s, 4), kernel.edges(pid, start, end)) for pid, s in before.items()
                if s > longest or kernel.forks.get(pid, start) > attaching}  # fmt: skip
        assert not late, f"unknown, and not a sleep begun before the probes: {late}; {summary}"
    # The server's log: each client backend counted is one it started, counted at least
    # from its first line to its last.
    logged = lifetimes(log)
    clients = {pid for pid in counted if pid in logged}
    assert len(clients) >= 20, (len(clients), summary)  # the churn was there
    short = {pid: (round(counted[pid], 4), round(inside(logged[pid], start, end), 4))
             for pid in clients & checked
             if counted[pid] < inside(logged[pid], start, end) - LOG_MS_S}  # fmt: skip
    assert not short, f"counted less than the log's lifetime (pgprobe, log): {short}"
