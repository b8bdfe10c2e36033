"""clog-reads under a saturating load: the probe's reads beside pg_stat_slru over one window.

The load of the issue: 8 clients looking up old xids (4 pg_xact buffers, every
look-up misses) and 8 TPC-B clients, on a 2-CPU machine. The SQL window opens
when the probes are live ("@@live") and closes when they stop counting (END),
so the two windows agree within milliseconds (meta.duration_s, the probe's,
and meta.slru_stats_window_s, the SQL one).

- A bounded load that starts after the window opened and ends (its clients
  disconnect, which flushes their statistics) before it closes: the probe's
  reads equal the blks_read delta exactly.
- A continuous load: backends publish their counts at most once a second, so
  each edge of the window may differ by up to a second of reads: within 3 %.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slru_workload
from helpers import CHECKOUT, run_pgprobe

from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

SLRU_DIRS = ("pg_xact/", "pg_clog/", "pg_subtrans/", "pg_multixact/", "pg_commit_ts/",
             "pg_serial/", "pg_notify/")  # fmt: skip


@pytest.fixture(scope="module")
def thrash(
    tracing: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[PgCluster, Path]]:
    settings = {**slru_workload.CLUSTER_SETTINGS, "max_connections": "60"}
    with PgCluster(name="pgprobe-window", settings=settings) as pg:
        assert pg.pgbench("-i", "-q", "-s", "2").wait(timeout=300) == 0
        with pg.connect() as conn:
            n = slru_workload.xact_burn_size(conn) * 2
        first, last = slru_workload.burn_xids(pg.conninfo, n)
        script = tmp_path_factory.mktemp("window") / "lookups.sql"
        script.write_text(slru_workload.xact_lookup_pgbench_script(first, last))
        yield pg, script


def loads(pg: PgCluster, script: Path, *limit: str) -> list[subprocess.Popen[str]]:
    return [
        pg.pgbench("-c", "8", "-j", "1", *limit),
        pg.pgbench("-n", "-c", "8", "-j", "1", *limit, "-f", str(script)),
    ]


def check_rows(doc: dict[str, Any]) -> tuple[int, int]:
    """Every row is a read of an SLRU file; (probe reads, blks_read delta) of pg_xact."""
    for row in doc["rows"]:
        assert row["file"].startswith(SLRU_DIRS) and row["slru"], row
        assert row["bytes"] == row["reads"] * slru_workload.BLCKSZ, row
    meta = doc["meta"]
    assert abs(meta["duration_s"] - meta["slru_stats_window_s"]) < 0.05, meta
    return meta["reads"], meta["slru_stats"]["pg_xact"]["blks_read"]


def test_bounded_saturating_load_is_exact(thrash: tuple[PgCluster, Path]) -> None:
    pg, script = thrash
    run = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "clog-reads", *pg.conn_args, "-d", "40", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=CHECKOUT,
    )
    from test_faults import wait_attached

    wait_attached(run.pid)
    for load in loads(pg, script, "-t", "400"):
        out, _ = load.communicate(timeout=300)
        assert load.returncode == 0, out
    time.sleep(1)  # the clients have gone: their counts are flushed
    run.send_signal(2)  # Ctrl-C: end the capture now
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    reads, blks_read = check_rows(json.loads(out))
    assert reads > 1000, "the lookups missed the 4 pg_xact buffers"
    assert reads == blks_read


def test_continuous_saturating_load_within_3_percent(thrash: tuple[PgCluster, Path]) -> None:
    pg, script = thrash
    running = loads(pg, script, "-T", "120")
    try:
        time.sleep(3)
        done = run_pgprobe(["clog-reads", *pg.conn_args, "-d", "8", "--json"], timeout=120)
    finally:
        for load in running:
            load.terminate()
            load.communicate(timeout=60)
    assert done.returncode == 0, done.stderr
    reads, blks_read = check_rows(json.loads(done.stdout))
    assert blks_read > 1000
    print(f"continuous load: {reads} probe reads / {blks_read} blks_read = {reads / blks_read:.3f}")
    assert abs(reads / blks_read - 1) <= 0.03, (reads, blks_read)
