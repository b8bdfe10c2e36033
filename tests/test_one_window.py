"""clog-reads under a saturating load: the probe's reads beside pg_stat_slru over one window.

The load of the issue: 8 clients looking up old xids (4 pg_xact buffers, every
look-up misses) and 8 TPC-B clients, on a 2-CPU machine. The SQL window opens
when the probes are live ("@@live") and closes when they stop counting (END),
so the two windows agree within milliseconds (meta.duration_s, the probe's,
and meta.slru_stats_window_s, the SQL one).

- A bounded load that starts after the window opened and ends (its clients
  disconnect, which flushes their statistics) before it closes: the probe's
  reads equal the blks_read delta exactly.
- A continuous load: a backend that stays connected publishes its counts at
  most once a second, and pgbench's clients, started together, publish together:
  pg_stat_slru then moves in steps of about a second of reads, and an 8 s window
  reads 8 or 9 of them (ci8 read 0.915 so). Here each batch of 20 look-ups is
  a connection of its own (pgbench -C), whose counts are published when it
  ends: only the batches in flight at each edge (at most 8 x 20 reads), and
  the TPC-B clients' few reads (a handful per second), can be off: within 3 %.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slru_workload
from helpers import run_pgprobe, start_pgprobe

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
        scripts = tmp_path_factory.mktemp("window")
        (scripts / "lookups.sql").write_text(slru_workload.xact_lookup_pgbench_script(first, last))
        # the reconnecting load: 20 look-ups per connection, so that connecting is not all it does
        batch = slru_workload.xact_lookup_pgbench_script(first, last, LOOKUPS_PER_CONNECTION)
        (scripts / "batches.sql").write_text(batch)
        yield pg, scripts


def loads(
    pg: PgCluster, scripts: Path, *limit: str, reconnect: bool = False
) -> list[subprocess.Popen[str]]:
    """8 TPC-B clients and 8 look-up clients; reconnect: each look-up connection runs one
    batch of LOOKUPS_PER_CONNECTION (pgbench -C)."""
    lookups = (
        ("-C", "-f", str(scripts / "batches.sql"))
        if reconnect
        else ("-f", str(scripts / "lookups.sql"))
    )
    return [
        pg.pgbench("-c", "8", "-j", "1", *limit),
        pg.pgbench("-n", "-c", "8", "-j", "1", *limit, *lookups),
    ]


LOOKUPS_PER_CONNECTION = 20
SOURCES = ("uprobe", "syscalls")  # clog-reads --source: the default, and the syscall view


def check_rows(doc: dict[str, Any]) -> tuple[int, int]:
    """Every row is a read of an SLRU (file); (probe reads, blks_read delta) of pg_xact."""
    for row in doc["rows"]:
        if doc["meta"]["source"] == "uprobe":
            assert row["slru"] == "pg_xact", row
            continue
        assert row["file"].startswith(SLRU_DIRS) and row["slru"], row
        assert row["bytes"] == row["reads"] * slru_workload.BLCKSZ, row
    meta = doc["meta"]
    assert abs(meta["duration_s"] - meta["slru_stats_window_s"]) < 0.05, meta
    return meta["reads"], meta["slru_stats"]["pg_xact"]["blks_read"]


@pytest.mark.parametrize("source", SOURCES)
def test_bounded_saturating_load_is_exact(thrash: tuple[PgCluster, Path], source: str) -> None:
    pg, scripts = thrash
    argv = ["clog-reads", *pg.conn_args, "-d", "40", "--json", "--source", source]
    run = start_pgprobe(argv)
    from test_faults import wait_attached

    wait_attached(run.pid)
    for load in loads(pg, scripts, "-t", "400"):
        out, _ = load.communicate(timeout=300)
        assert load.returncode == 0, out
    time.sleep(1)  # the clients have gone: their counts are flushed
    run.send_signal(2)  # Ctrl-C: end the capture now
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0, err
    reads, blks_read = check_rows(json.loads(out))
    assert reads > 1000, "the lookups missed the 4 pg_xact buffers"
    assert reads == blks_read


@pytest.mark.parametrize("source", SOURCES)
def test_continuous_saturating_load_within_3_percent(
    thrash: tuple[PgCluster, Path], source: str
) -> None:
    pg, scripts = thrash
    running = loads(pg, scripts, "-T", "120", reconnect=True)  # see the module's docstring
    try:
        time.sleep(3)
        argv = ["clog-reads", *pg.conn_args, "-d", "8", "--json", "--source", source]
        done = run_pgprobe(argv, timeout=120)
    finally:
        for load in running:
            load.terminate()
            load.communicate(timeout=60)
    assert done.returncode == 0, done.stderr
    reads, blks_read = check_rows(json.loads(done.stdout))
    assert blks_read > 1000
    print(f"{source}, continuous load: {reads} probe reads / {blks_read} blks_read = "
          f"{reads / blks_read:.3f}")  # fmt: skip
    assert abs(reads / blks_read - 1) <= 0.03, (reads, blks_read)
