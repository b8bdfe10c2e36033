"""`pgprobe lwlocks --by query`: LWLock sleeps per statement, against pg_stat_activity's own
view of who waits on what (once, a real cluster under pgbench, the compiled time model).

pgbench -c 8 TPC-B on 2 CPUs waits on WALWrite at commit (group commit). pg_stat_activity,
sampled every 20 ms by the test, shows each waiting backend's wait event with its query_id:
the statement pgprobe charges the most WALWrite time to is the one the samples catch most
often in WALWrite, and its share of WALWrite is within 15 points of the samples' (a sample
sees a sleep and the runqueue time after it, so pgprobe's share counts both: SLEPT +
WOKEN). --source usdt with --by query is refused in one line.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest
from helpers import cluster_for, need, run_pgprobe

from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster
from pgprobe.tools.waits import compiled

pytestmark = pytest.mark.integration

# fsync on: commits wait for the WAL flush, so that WALWrite is contended (group commit)
SETTINGS = {"shared_preload_libraries": "'pg_stat_statements'", "compute_query_id": "on",
            "fsync": "on", "synchronous_commit": "on"}  # fmt: skip
TRANCHE = "WALWrite"


class Sampler(threading.Thread):
    """pg_stat_activity every 20 ms: (wait_event, query_id) of every LWLock wait seen."""

    def __init__(self, pg: PgCluster) -> None:
        super().__init__(daemon=True)
        self.pg = pg
        self.seen: Counter[tuple[str, int]] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        with self.pg.connect() as conn:
            while not self.stop.is_set():
                rows = conn.execute("SELECT wait_event, query_id FROM pg_stat_activity WHERE "
                                    "wait_event_type = 'LWLock' AND query_id IS NOT NULL "
                                    "AND pid <> pg_backend_pid()").fetchall()  # fmt: skip
                self.seen.update((str(w), int(str(q))) for w, q in rows)
                time.sleep(0.02)


@pytest.mark.once
def test_walwrite_sleeps_belong_to_the_statement_pg_stat_activity_shows(
    pg_build: PgBuild, tracing: None
) -> None:
    need(compiled.object_path() is not None, "bpf/build/waits.bpf.o: run scripts/build-bpf")
    with cluster_for(pg_build, SETTINGS, name="pgprobe-lwlocks-query") as pg:
        pg.sql("CREATE EXTENSION pg_stat_statements")
        assert pg.pgbench("-i", "-q", "-s", "2").wait(timeout=300) == 0
        bench = pg.pgbench("-c", "8", "-j", "2", "-T", "60", "-n")
        time.sleep(1.5)
        sampler = Sampler(pg)
        sampler.start()
        done = run_pgprobe(["lwlocks", *pg.conn_args, "-d", "8", "--by", "query", "--json"])
        sampler.stop.set()
        sampler.join()
        refused = run_pgprobe(["lwlocks", *pg.conn_args, "-d", "1", "--by", "query",
                               "--source", "usdt"])  # fmt: skip
        bench.terminate()
        bench.communicate(timeout=30)
    assert done.returncode == 0, done.stderr
    rows = [r for r in json.loads(done.stdout)["rows"] if r["tranche"] == TRANCHE]
    charged: Counter[int] = Counter()
    for r in rows:
        if r["query_id"] is not None:
            charged[r["query_id"]] += r["sleep_us"] + r["woken_us"]
    sampled = Counter({q: n for (w, q), n in sampler.seen.items() if w == TRANCHE})
    print(charged.most_common(4), sampled.most_common(4))
    assert sum(sampled.values()) >= 30, sampled  # enough samples to judge
    top, _ = sampled.most_common(1)[0]
    assert charged.most_common(1)[0][0] == top, (charged, sampled)
    share = charged[top] / sum(charged.values())
    sampled_share = sampled[top] / sum(sampled.values())
    assert abs(share - sampled_share) <= 0.15, (share, sampled_share)
    assert refused.returncode == 2 and "not with --source usdt" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
