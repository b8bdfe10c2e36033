"""pgprobe queries against pg_wait_sampling: each statement's wait shares, like with like.

pg_wait_sampling (Debian's postgresql-15-pg-wait-sampling, scripts/setup) samples every
process's PGPROC wait_event_info each profile_period (10 ms) and counts the sample under
(pid, event, queryid): the queryid pg_stat_statements shows, set from the planner hook to
ExecutorEnd. A sample sees the event the backend has set: woken from a sleep but still
waiting for a CPU, a backend has not cleared it yet, so that runqueue time counts under
the event it slept in; a running or preempted backend has none. 1.1.4 (Debian 12) skips
those, so there are no CPU samples; pg_wait_sampling.sample_cpu (later versions) counts
them with event NULL. pgprobe's comparable figures per statement are so:
  wait event E -> total_us + runq_woken_us of E;
  CPU (only where the extension samples it) -> cpu_us + runq_preempted_us.
Each side becomes shares of the statement's sampled time. The profile is read around the
whole pgprobe run (its window lies inside), so a steady load's shares are compared, not
its times.

The load, never prepared (1.1.4 takes the queryid in the planner hook: a cached plan's
samples would have queryid 0): a sleeper (PgSleep only), two sessions that lock one row
FOR UPDATE and sleep holding it (Lock:transactionid and PgSleep, about half each), and a
CPU burner per CPU (no wait events), so that woken backends wait for a CPU.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest
from helpers import cluster_for, need, run_pgprobe

from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

SETTINGS = {
    "shared_preload_libraries": "'pg_wait_sampling, pg_stat_statements'",
    "compute_query_id": "on",
    "pg_wait_sampling.profile_period": "10",
    "max_parallel_workers_per_gather": "0",
}
SLEEP = "SELECT pg_sleep(0.05)"
LOCKED_SLEEP = "SELECT pg_sleep(0.02) FROM (SELECT id FROM t WHERE id = 1 FOR UPDATE) s"
CPU = "SELECT count(g) FROM (SELECT generate_series(1, 3000000) AS g) s"  # no tuplestore
MIN_SAMPLES = 100
Shares = dict[str, float]  # "Type:Event" (or "CPU") -> share of the statement's samples


def prepare(pg: PgCluster) -> bool:
    """The extensions and the locked row; whether running backends are sampled (as CPU)."""
    for sql in ("CREATE EXTENSION pg_wait_sampling", "CREATE EXTENSION pg_stat_statements",
                "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t VALUES (1)",
                "SELECT pg_wait_sampling_reset_profile()"):  # fmt: skip
        pg.sql(sql)
    return pg.sql("SELECT current_setting('pg_wait_sampling.sample_cpu', true)")[0][0] == "on"


def profile(pg: PgCluster) -> Counter[tuple[int, str]]:
    """pg_wait_sampling's samples by (queryid, event), all pids summed; NULL event: CPU."""
    rows = pg.sql("SELECT queryid, coalesce(event_type || ':' || event, 'CPU'), sum(count) "
                  "FROM pg_wait_sampling_profile WHERE queryid <> 0 GROUP BY 1, 2")  # fmt: skip
    return Counter({(cast(int, q), cast(str, e)): int(cast(Any, n)) for q, e, n in rows})


def shares_by_statement(delta: Counter[tuple[int, str]]) -> dict[int, tuple[int, Shares]]:
    """queryid -> (samples, shares) of the statements with MIN_SAMPLES samples or more."""
    totals: Counter[int] = Counter()
    for (qid, _), n in delta.items():
        totals[qid] += n
    return {qid: (n, {e: c / n for (q, e), c in delta.items() if q == qid and c > 0})
            for qid, n in totals.items() if n >= MIN_SAMPLES}  # fmt: skip


@contextmanager
def load(pg: PgCluster) -> Iterator[None]:
    """The sessions above, looping until the block ends; their errors fail the test."""
    stop, errors = threading.Event(), list[Exception]()

    def loop(sql: str) -> None:
        try:
            with pg.connect(prepare_threshold=None) as conn:
                while not stop.is_set():
                    conn.execute(sql)
        except Exception as exc:  # reported below, in the test's thread
            errors.append(exc)

    sessions = [SLEEP, LOCKED_SLEEP, LOCKED_SLEEP] + [CPU] * (os.cpu_count() or 1)
    threads = [threading.Thread(target=loop, args=(s,), daemon=True) for s in sessions]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors, errors


def pgprobe_shares(row: dict[str, Any], cpu_sampled: bool) -> Shares:
    """A `queries --json` row's time as pg_wait_sampling would sample it, as shares."""
    time = {f"{w['wait_event_type']}:{w['wait_event']}": w["total_us"] + w["runq_woken_us"]
            for w in row["waits"]}  # fmt: skip
    if cpu_sampled:
        time["CPU"] = row["cpu_us"] + row["runq_preempted_us"]
    total = sum(time.values())
    assert total > 0, row
    return {e: t / total for e, t in time.items()}


@pytest.mark.once
def test_statement_wait_shares_agree_with_pg_wait_sampling(
    pg_build: PgBuild, tracing: None
) -> None:
    """For each statement with MIN_SAMPLES or more samples, and each event either side
    names, pgprobe's share p' and pg_wait_sampling's p (n samples) agree:
    |p' - p| <= max(3 sigma, 3 points), sigma = sqrt(p (1 - p) / n), the binomial
    standard error of the sampled share."""
    need(pg_build.id == "15-debian", "pg_wait_sampling is Debian's package, for its 15")
    need((pg_build.bindir.parent / "lib" / "pg_wait_sampling.so").exists(),
         "pg_wait_sampling is not installed: scripts/setup")  # fmt: skip
    with cluster_for(pg_build, SETTINGS, name="pgprobe-pgws") as pg:
        cpu_sampled = prepare(pg)
        with load(pg):
            before = profile(pg)
            done = run_pgprobe(["queries", *pg.conn_args, "-d", "6", "--json"], timeout=180)
            after = profile(pg)
        assert done.returncode == 0, done.stderr
        rows = {r["query_id"]: r for r in json.loads(done.stdout)["rows"]
                if r["kind"] == "statement"}  # fmt: skip
        truth = shares_by_statement(after - before)
        assert len(truth) >= 2, truth  # the sleeper's and the lockers' statements at least
        for qid, (n, sampled) in truth.items():
            assert qid in rows, (qid, sampled, sorted(rows))
            measured = pgprobe_shares(rows[qid], cpu_sampled)
            for event in sampled.keys() | measured.keys():
                p, got = sampled.get(event, 0.0), measured.get(event, 0.0)
                allowed = max(3 * math.sqrt(p * (1 - p) / n), 0.03)
                assert abs(got - p) <= allowed, (rows[qid]["query"], event, got, p, n)
