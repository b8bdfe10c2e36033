"""`pgprobe queries` against truths it does not compute: real clusters, real BPF, every build.
Long because its tests share one runner (queries_running, result), the settings that give
query ids, and pg_stat_statements' ids (queryid, row_of); the scripts' query dimension is
checked in the three-statement test's own window, beside the tool.

- Three known statements in three sessions over one window (every build): `SELECT
  pg_sleep(0.2)` ten times is 2.0 s ± 2 % of Timeout:PgSleep on its own query id (the id
  pg_stat_statements shows: this checks st_query_id's offset per build); a CPU-bound
  statement's CPU + runqueue is its backend's /proc/PID/schedstat delta ± 2 % (plus, on
  the upper side, the machine's steal: schedstat's CPU time leaves it out); an UPDATE
  blocked 3 s by another session's row lock is 3.0 s ± 2 % of Lock:transactionid on its id.
  bpf/waits.bt run by hand beside it with QID_OFF (the scripts' query dimension): the
  same three checks on its @query_ns.
- pgbench TPC-B at half its unthrottled rate (the issue's), one statement in ten a heavier
  one (30k rows of pgbench_accounts, 1.2 ms per call for 10k on a fast VM: short of the
  2 ms bound), every build: each statement with ≥ 5 % of DB time has
  an active time of at least 0.95 times its pg_stat_statements total_exec_time +
  total_plan_time delta over the same seconds (sampled every 0.1 s by the test, taken at
  the window's edges pgprobe reports), and at most 2 times it where pg_stat_statements
  times at least 2 ms per call; the top statement is the same in both. Why not 2 times
  for every statement: pg_stat_statements times the executor and the planner; pgprobe
  holds the statement's run up to its idle report (pg_stat_activity's `active`, and
  reading its message before): parse analysis, a preemption in any of it; on TPC-B's
  20-100 µs statements on a 2-CPU VM that is 1.7-4.6 times the executor's time
  (measured: docs/queries.md). And transaction control (BEGIN, END, COMMIT) is left out of both
  checks: its commit runs after pg_stat_statements' hook returns (finish_xact_command), so
  pg_stat_statements times it at ~1 µs while the commit, its WAL and the statistics flush
  at idle are END's. At this rate pgbench often sends the next statement before the
  backend has gone to sleep after the last one (3 statements in 4): runs that span
  statements are split where the backend is preempted after a statement ended (waits.
  bpf.c's mark()), which this checks (the heavy statement kept 0.71-0.83 of its time
  split at sleeps alone).
- The same mix unthrottled (once): the heavy statement's row is still 0.95-2 times
  pg_stat_statements' time, and the output counts what may be charged to a later
  statement (meta.not_split_us).
- compute_query_id = off (once): the one line with the fix, and the statements grouped by
  their text (pg_sleep's 2.0 s ± 2 % under its text).
- More statements in one session than its entry has slots (once): 48 pg_sleep(0.05) of
  distinct ids, twice each, each id 0.1 s ± 2 % (the slots taken over, their totals moved
  to the map during the capture, the rest read from the live entry).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from byhand import SCRIPT_LOST_SHARE, ByHand, script_lost
from helpers import (
    CHECKOUT,
    QUERIES_BPF_LINKS,
    WAITS_BT,
    bpf_link_fds,
    cluster_for,
    need,
    steal_seconds_since,
    steal_ticks,
    took_lost_path,
)

from pgprobe import proc
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster
from pgprobe.tools.waits import compiled

pytestmark = pytest.mark.integration

SETTINGS = {
    "shared_preload_libraries": "'pg_stat_statements'",
    "compute_query_id": "on",
    "pg_stat_statements.track_planning": "on",
}
TOLERANCE = 0.02


@contextmanager
def queries_running(
    pg: PgCluster, *args: str, duration: float, interrupt: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """`pgprobe queries --json` over pg, yielded once its probes are attached; interrupt:
    ended by Ctrl-C (SIGINT) once the block is done, so that the window holds all of the
    load whatever the machine's load makes it last (`duration` is then a bound)."""
    argv = [sys.executable, "-m", "pgprobe", "queries", "-h", str(pg.root), "-p", str(pg.port),
            "-U", "postgres", "-d", str(duration), "--json", *args]  # fmt: skip
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=CHECKOUT)  # fmt: skip
    deadline = time.monotonic() + 60
    while bpf_link_fds(run.pid) < QUERIES_BPF_LINKS:
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "pgprobe queries did not attach in 60 s"
        time.sleep(0.01)
    try:
        yield run
        if interrupt:
            time.sleep(0.2)
            run.send_signal(signal.SIGINT)
    finally:
        run.wait(timeout=duration + 60)


def result(run: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    return json.loads(out), err


def queryid(pg: PgCluster, text: str) -> int:
    rows = pg.sql(f"SELECT queryid FROM pg_stat_statements WHERE query LIKE '{text}%' "
                  "AND toplevel")  # fmt: skip
    assert len({r[0] for r in rows}) == 1, rows
    return int(str(rows[0][0]))


def row_of(doc: dict[str, Any], qid: int, kind: str = "statement") -> dict[str, Any]:
    rows = [r for r in doc["rows"] if r["query_id"] == qid and r["kind"] == kind]
    assert len(rows) == 1, (qid, [(r["kind"], r["query_id"], r["query"]) for r in doc["rows"]])
    return rows[0]


def wait_s(row: dict[str, Any], name: str) -> float:
    return sum(w["total_us"] for w in row["waits"] if w["wait_event"] == name) / 1e6


def sleeper(pg: PgCluster) -> None:
    with pg.connect() as conn:
        for _ in range(10):
            conn.execute("SELECT pg_sleep(0.2)")


def burner(pg: PgCluster, truth: dict[str, float]) -> None:
    """The CPU-bound statement, its session closed right after: a backend that reads its
    client's Terminate before it sleeps again ends in that run (its statement read at its
    proc_exit(), the memory gone at its final switch-out)."""
    with pg.connect() as conn:
        pid = int(str(conn.execute("SELECT pg_backend_pid()").fetchone()[0]))  # type: ignore[index]
        truth["pid"] = pid
        before, steal = proc.schedstat(pid), steal_ticks()
        conn.execute("SELECT count(*) FROM generate_series(1, 12000000) AS burn")
        after = proc.schedstat(pid)
        truth["steal_s"] = steal_seconds_since(steal)
        assert before is not None and after is not None
        truth["cpu_runq_s"] = (after[0] - before[0] + after[1] - before[1]) / 1e9


def blocked_update(pg: PgCluster, truth: dict[str, float]) -> None:
    with pg.connect() as holder, pg.connect() as waiter:
        holder.autocommit = False
        holder.execute("UPDATE rows SET v = v + 1 WHERE id = 1")
        done = threading.Event()

        def wait() -> None:
            waiter.execute("UPDATE rows SET v = v + 2 WHERE id = 1")
            done.set()

        started = time.monotonic()
        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(max(0.0, started + 3.0 - time.monotonic()))
        holder.commit()
        thread.join()
        truth["blocked_s"] = time.monotonic() - started


def test_three_statements_against_their_truths(pg_build: PgBuild, tracing: None) -> None:
    need(compiled.object_path() is not None, "bpf/build/waits.bpf.o: run scripts/build-bpf")
    truth: dict[str, float] = {}
    with cluster_for(pg_build, SETTINGS, name="pgprobe-queries") as pg:
        pg.sql("CREATE EXTENSION pg_stat_statements")
        pg.sql("CREATE TABLE rows (id int PRIMARY KEY, v int); INSERT INTO rows VALUES (1, 0)")
        by_hand = ByHand.waits_bt(pg, pg_build)
        with queries_running(pg, duration=120, interrupt=True) as run:
            loads = [threading.Thread(target=sleeper, args=(pg,)),
                     threading.Thread(target=burner, args=(pg, truth)),
                     threading.Thread(target=blocked_update, args=(pg, truth))]  # fmt: skip
            for load in loads:
                load.start()
            for load in loads:
                load.join()
            time.sleep(0.3)  # the sessions' exits seen before the end
        doc, err = result(run)
        lines = by_hand.stop()
        script = script_queries(lines)
        sleep_id = queryid(pg, "SELECT pg_sleep")
        burn_id = queryid(pg, "SELECT count(*) FROM generate_series")
        (before,) = pg.sql(
            "SELECT queryid FROM pg_stat_statements WHERE toplevel AND "
            "query = 'SELECT pg_backend_pid()' AND calls = 1"
        )  # the burner's
        before_id = int(str(before[0]))
        update_id = queryid(pg, "UPDATE rows SET")
    print(json.dumps(doc["rows"][:6], indent=1), err, truth)
    slept = wait_s(row_of(doc, sleep_id), "PgSleep")
    assert abs(slept - 2.0) <= TOLERANCE * 2.0, slept
    burn = row_of(doc, burn_id)
    on_cpu = (burn["cpu_us"] + burn["runq_preempted_us"] + burn["runq_woken_us"]) / 1e6
    # schedstat's CPU time leaves out what the hypervisor stole, pgprobe's holds it (the
    # backend was on its CPU): the upper side adds the machine's steal in the statement
    low, high = 1 - TOLERANCE, 1 + TOLERANCE
    assert low * truth["cpu_runq_s"] <= on_cpu <= high * (truth["cpu_runq_s"] + truth["steal_s"]), (
        on_cpu, truth)  # fmt: skip
    locked = wait_s(row_of(doc, update_id), "transactionid")
    assert abs(locked - 3.0) <= TOLERANCE * 3.0, (locked, truth)
    assert doc["meta"]["query_ids"] is True

    def script_s(qid: int, kinds: set[int], wait_class: int | None, tid: int = 0) -> float:
        def wanted(t: int, kind: int, wei: int, q: int) -> bool:
            return q == qid and kind in kinds and wait_class in (None, wei >> 24) and tid in (0, t)

        return sum(ns for (t, k, _s, wei, q), ns in script.items() if wanted(t, k, wei, q)) / 1e9

    # Like for like: the truth (the client's schedstat delta) also holds the burner's wait
    # for a CPU between its two statements (after a wakeup or a preemption while idle),
    # which the script keeps with the statement before (pg_backend_pid()'s)
    between = script_s(before_id, {2, 3}, None, int(truth["pid"]))
    on_cpu = script_s(burn_id, {1, 2}, None) + between
    by_script = {"slept": script_s(sleep_id, {4}, 0x09), "locked": script_s(update_id, {4}, 0x03),
                 "on_cpu": on_cpu}  # fmt: skip
    # A process the script names in @unseen lost time (or moved runqueue time to a sleep):
    # at most its truth then, and the run is counted (helpers.took_lost_path)
    lost = script_lost(lines)
    pids = {"slept": row_of(doc, sleep_id)["pids"], "locked": row_of(doc, update_id)["pids"],
            "on_cpu": [int(truth["pid"])]}  # fmt: skip
    print(f"waits.bt by hand: {by_script} (between the statements {between}); lost {lost}")
    exact = {name: not lost & set(pids[name]) for name in pids}
    took_lost_path("waits.bt by hand: statements", not all(exact.values()), SCRIPT_LOST_SHARE,
                   WAITS_BT)  # fmt: skip
    for name, want in (("slept", 2.0), ("locked", 3.0)):
        got = by_script[name]
        assert abs(got - want) <= TOLERANCE * want or (not exact[name] and got <= high * want), (
            name, by_script, truth)  # fmt: skip
    assert (low * truth["cpu_runq_s"] if exact["on_cpu"] else 0) <= by_script["on_cpu"] <= high * (
        truth["cpu_runq_s"] + truth["steal_s"]), (by_script, truth)  # fmt: skip


QUERY_ROW = re.compile(r"@query_ns(?:\[|\t)(\d+(?:(?:, |\t)-?\d+){4})(?:\]: |\t)(\d+)$")


def script_queries(lines: list[str]) -> dict[tuple[int, ...], int]:
    """(tid, kind, state, wei, query id) -> ns of a script's @query_ns (its last print)."""
    out: dict[tuple[int, ...], int] = {}
    for line in lines:
        m = QUERY_ROW.match(line)
        if m:
            out[tuple(int(v) for v in re.split(r", |\t", m.group(1)))] = int(m.group(2))
    return out


class StatementsSampler(threading.Thread):
    """pg_stat_statements every 0.1 s, each reading stamped with the Unix time."""

    def __init__(self, pg: PgCluster) -> None:
        super().__init__(daemon=True)
        self.pg = pg
        self.readings: list[tuple[float, dict[int, tuple[float, int]]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        with self.pg.connect() as conn:
            while not self.done.is_set():
                rows = conn.execute("SELECT queryid, sum(total_exec_time + total_plan_time), "
                                    "sum(calls) FROM pg_stat_statements WHERE toplevel "
                                    "GROUP BY queryid").fetchall()  # fmt: skip
                self.readings.append((time.time(), {int(str(q)): (float(str(t)), int(str(c)))
                                                    for q, t, c in rows}))  # fmt: skip
                time.sleep(0.1)

    def at(self, unix: float) -> dict[int, tuple[float, int]]:
        return min(self.readings, key=lambda r: abs(r[0] - unix))[1]


def unthrottled_tps(pg: PgCluster, scripts: tuple[str, ...]) -> float:
    out, _ = pg.pgbench(*scripts, "-c", "4", "-j", "2", "-T", "3", "-n").communicate(timeout=60)
    tps = [ln for ln in out.splitlines() if ln.startswith("tps =")]
    assert tps, out
    return float(tps[0].split()[2])


# The ≤ 2 bound holds where the executor's time per call outweighs what pgprobe also holds
# (message read, parse, send, preemptions outside the executor): 0.6-2.4 ms per call on a
# loaded 2-CPU VM (CI: UPDATE pgbench_accounts at 0.51 ms/call was 2.68 times its time).
# The heavy statement is held to it whatever its time per call: 1.9-2.4 ms (1.96 on a quiet
# CI run, just under HEAVY_MS); summing more rows turns its plan into a 17 ms sequential scan.
HEAVY_MS = 2.0
HEAVY = "SELECT sum(abalance) FROM pgbench_accounts WHERE aid BETWEEN 1 AND 30000;\n"
TRANSACTION_CONTROL = ("BEGIN", "END", "COMMIT", "START TRANSACTION")


Truth = dict[int, tuple[float, int]]  # query id -> (exec + plan ms, calls) over the window


def pgbench_window(build: PgBuild, divisor: int) -> tuple[dict[str, Any], Truth]:
    """`pgprobe queries` over 8 s of TPC-B plus one heavier statement in ten at 1/divisor of
    the mix's unthrottled rate (0: unthrottled), and pg_stat_statements over the same seconds."""
    with cluster_for(build, SETTINGS, name="pgprobe-queries-tpcb") as pg:
        init = pg.pgbench("-i", "-q", "-s", "2")
        assert init.wait(timeout=300) == 0
        pg.sql("CREATE EXTENSION pg_stat_statements")
        heavy = pg.root / "heavy.sql"
        heavy.write_text(HEAVY)
        heavy.chmod(0o644)
        scripts = ("-b", "tpcb-like@9", "-f", f"{heavy}@1")
        rate = ["-R", str(max(20, int(unthrottled_tps(pg, scripts) / divisor)))] if divisor else []
        load = pg.pgbench(*scripts, "-c", "4", "-j", "2", "-T", "16", "-n", *rate)
        time.sleep(2)
        sampler = StatementsSampler(pg)
        sampler.start()
        with queries_running(pg, "--limit", "50", duration=8) as run:
            pass
        doc, _err = result(run)
        sampler.done.set()
        sampler.join()
        load.communicate(timeout=60)
    start, end = doc["meta"]["window_unix_s"]
    before, after = sampler.at(start), sampler.at(end)
    zero = (0.0, 0)
    return doc, {q: (ms - before.get(q, zero)[0], n - before.get(q, zero)[1])
                 for q, (ms, n) in after.items()}  # fmt: skip


def statements_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["rows"] if r["kind"] == "statement"
            and not r["query"].upper().startswith(TRANSACTION_CONTROL)]  # fmt: skip


def test_pgbench_statements_against_pg_stat_statements(pg_build: PgBuild, tracing: None) -> None:
    need(compiled.object_path() is not None, "bpf/build/waits.bpf.o: run scripts/build-bpf")
    doc, truth = pgbench_window(pg_build, 2)
    db_us = doc["meta"]["db_time_us"]
    statements = statements_of(doc)
    bounded = 0
    for row in statements:
        if row["db_time_us"] < 0.05 * db_us:
            continue
        ms, calls = truth[row["query_id"]]
        ratio = row["db_time_us"] / 1000 / ms
        print(f"{ratio:.3f} {row['db_time_us'] / 1e6:.3f} s {ms / calls:.3f} ms/call "
              f"{row['query'][:50]}")  # fmt: skip
        assert ratio >= 0.95, (ratio, row, ms)
        if ms / calls >= HEAVY_MS or row["query"].startswith(HEAVY[:20]):
            assert ratio <= 2.0, (ratio, row, ms)
            bounded += 1
    assert bounded >= 1, statements
    top = max((q for q in truth if q in {r["query_id"] for r in statements}),
              key=lambda q: truth[q][0])  # fmt: skip
    assert statements[0]["query_id"] == top, (statements[0], truth[top])
    assert doc["meta"]["outside_statements_us"] >= 0


@pytest.mark.once
def test_heavy_statement_kept_unthrottled(pg_build: PgBuild, tracing: None) -> None:
    """Unthrottled, runs span statements most of the time: the heavy statement's row
    still holds its own time (split at the backend's reads of its next message)."""
    need(compiled.object_path() is not None, "bpf/build/waits.bpf.o: run scripts/build-bpf")
    doc, truth = pgbench_window(pg_build, 0)
    (heavy,) = [r for r in statements_of(doc) if r["query"].startswith("SELECT sum(abalance)")]
    ms, _calls = truth[heavy["query_id"]]
    not_split = doc["meta"]["not_split_us"] / 1000
    print(f"heavy {heavy['db_time_us'] / 1000:.1f} ms, not split {not_split:.1f} ms, "
          f"pg_stat_statements {ms:.1f} ms")  # fmt: skip
    assert 0.95 * ms <= heavy["db_time_us"] / 1000 <= 2.0 * ms, (heavy, not_split, ms)


@pytest.mark.once
def test_waits_by_query(pg_build: PgBuild, tracing: None) -> None:
    """`waits --by query`: each statement's time model; pg_sleep's under its own id."""
    need(compiled.object_path() is not None, "bpf/build/waits.bpf.o: run scripts/build-bpf")
    with cluster_for(pg_build, SETTINGS, name="pgprobe-queries-waits") as pg:
        pg.sql("CREATE EXTENSION pg_stat_statements")
        argv = [sys.executable, "-m", "pgprobe", "waits", "-h", str(pg.root), "-p",
                str(pg.port), "-U", "postgres", "-d", "120", "--by", "query", "--json"]  # fmt: skip
        run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=CHECKOUT)  # fmt: skip
        deadline = time.monotonic() + 60
        while bpf_link_fds(run.pid) < QUERIES_BPF_LINKS:
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.01)
        sleeper(pg)
        time.sleep(0.2)
        run.send_signal(signal.SIGINT)
        doc, _err = result(run)
        sleep_id = queryid(pg, "SELECT pg_sleep")
    parts = {(p["category"], p["wait_event"]): p for p in doc["rows"] if p["query_id"] == sleep_id}
    slept = parts[("wait", "PgSleep")]["total_us"] / 1e6
    assert abs(slept - 2.0) <= TOLERANCE * 2.0, parts
    assert ("on CPU", "on CPU") in parts and doc["tool"] == "waits"


@pytest.mark.once
def test_without_query_ids_statements_are_grouped_by_text(pg_build: PgBuild, tracing: None) -> None:
    need(compiled.object_path() is not None, "bpf/build/waits.bpf.o: run scripts/build-bpf")
    with cluster_for(pg_build, {"compute_query_id": "off"}, name="pgprobe-queries-off") as pg:
        with queries_running(pg, duration=120, interrupt=True) as run:
            sleeper(pg)
        doc, err = result(run)
    notes = [ln for ln in err.splitlines() if "no query ids" in ln]
    assert len(notes) == 1 and "compute_query_id = on" in notes[0], err
    rows = [r for r in doc["rows"] if r["kind"] == "text" and "pg_sleep" in r["query"]]
    assert len(rows) == 1, doc["rows"]
    slept = wait_s(rows[0], "PgSleep")
    assert abs(slept - 2.0) <= TOLERANCE * 2.0, slept
    assert doc["meta"]["query_ids"] is False


MANY_SHAPES = 48  # statements of distinct ids in one session: more keys than its 32 slots


@pytest.mark.once
def test_more_statements_than_slots_keep_their_time(pg_build: PgBuild, tracing: None) -> None:
    """One session runs MANY_SHAPES statements of distinct ids, each a 0.05 s pg_sleep
    (twice each, and the session left open: its slots are taken over, their totals moved
    to the map while the capture runs, and the rest read from its entry at the end):
    each id holds 0.1 s of PgSleep, at least 2 % under it and at most 2 % over what the
    client's clock saw the two statements take (a 50 ms pg_sleep overslept by 1.1 ms on a
    loaded VM), the sum the same way."""
    need(compiled.object_path() is not None, "bpf/build/waits.bpf.o: run scripts/build-bpf")
    texts = [f"SELECT pg_sleep(0.05){', 1' * k}" for k in range(MANY_SHAPES)]
    clock: dict[int, float] = {}  # shape -> the client's seconds for its two runs
    with cluster_for(pg_build, SETTINGS, name="pgprobe-queries-slots") as pg:
        pg.sql("CREATE EXTENSION pg_stat_statements")
        with pg.connect() as conn, queries_running(pg, "--limit", "1000", duration=120,
                                                   interrupt=True) as run:  # fmt: skip
            for _ in range(2):
                for shape, text in enumerate(texts):
                    began = time.monotonic()
                    conn.execute(text)
                    clock[shape] = clock.get(shape, 0.0) + time.monotonic() - began
        doc, _err = result(run)
        rows = pg.sql("SELECT queryid, query FROM pg_stat_statements "
                      "WHERE query LIKE 'SELECT pg_sleep%' AND toplevel")  # fmt: skip
    # normalised texts: "SELECT pg_sleep($1), $2, ..."; the shape is the number of commas
    ids = {str(q).count(","): int(str(qid)) for qid, q in rows}
    assert sorted(ids) == list(range(MANY_SHAPES)), rows
    slept = {shape: wait_s(row_of(doc, qid), "PgSleep") for shape, qid in ids.items()}
    for shape, seconds in slept.items():
        assert (1 - TOLERANCE) * 0.1 <= seconds <= (1 + TOLERANCE) * clock[shape], (
            shape, seconds, clock[shape])  # fmt: skip
    total = sum(slept.values())
    assert (1 - TOLERANCE) * 0.1 * MANY_SHAPES <= total <= (1 + TOLERANCE) * sum(clock.values())
