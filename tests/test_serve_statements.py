"""`pgprobe serve --statements N`: the top N statements' DB time as series, against pg_sleep
lengths, with the compiled time model on a real cluster (once).

Three statements of known lengths in one session: `SELECT pg_sleep(0.2)` ten times (2.0 s),
`SELECT 1 FROM pg_sleep(0.1)` ten times (1.0 s), `SELECT 2, pg_sleep(0.05)` twice (0.1 s),
then a CPU-bound statement of seconds. With --statements 3 the burner and the first two
are series under the ids pg_stat_statements shows, the sleeps each its seconds of Timeout
± 2 %; the third sleep is not a series (bounded cardinality) but is in the total of every
statement. The burner runs through a window: the agent's last-window CPU profile (pprof,
read by `go tool pprof`) has most of its samples under its query id label.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import cluster_for, need
from test_flame_by_query import pprof_by_query
from test_serve import scrape, start_agent, stop_agent, wait_for

from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import free_port
from pgprobe.tools.waits import compiled

pytestmark = pytest.mark.integration

SETTINGS = {"shared_preload_libraries": "'pg_stat_statements'", "compute_query_id": "on"}
LOADS = (("SELECT pg_sleep(0.2)", 10, 2.0, "SELECT pg_sleep($1)"),
         ("SELECT 1 FROM pg_sleep(0.1)", 10, 1.0, "SELECT $1 FROM pg_sleep($2)"),
         ("SELECT 2, pg_sleep(0.05)", 2, 0.1, "SELECT $1, pg_sleep($2)"))  # fmt: skip
BURN = "SELECT count(*) FROM generate_series(1, 15000000) AS burn"  # ~4 s of CPU here


@pytest.mark.once
def test_top_statements_are_series_of_their_seconds(
    pg_build: PgBuild, tracing: None, tmp_path: Path
) -> None:
    need(compiled.object_path() is not None, "bpf/build/waits.bpf.o: run scripts/build-bpf")
    window = 1
    ended = 'pgprobe_capture_last_window_end_timestamp_seconds{source="waits"}'
    windows = 'pgprobe_capture_windows_total{source="waits"}'
    with cluster_for(pg_build, SETTINGS, name="pgprobe-serve-statements") as pg:
        pg.sql("CREATE EXTENSION pg_stat_statements")
        port = free_port()
        agent = start_agent(pg, port, "--window", str(window), "--waits-duty", "1",
                            "--statements", "3")  # fmt: skip
        try:
            wait_for("the time model", lambda: scrape(port).get(ended, 0) > 0, 60)
            with pg.connect() as conn:
                for text, times, _, _ in LOADS:
                    for _ in range(times):
                        conn.execute(text)
                burn = threading.Thread(target=conn.execute, args=(BURN,))
                burn.start()
                time.sleep(2.5 * window)  # a whole window of it: the last window's profile
                profile = tmp_path / "cpu.pb.gz"
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/pprof/profile",
                                            timeout=10) as reply:  # fmt: skip
                    profile.write_bytes(reply.read())
                burn.join()
            done = time.time()
            folded = scrape(port)[windows]
            wait_for("the last window", lambda: (m := scrape(port))[ended] > done + window
                     and m[windows] >= folded + 2, 60)  # fmt: skip
            got = scrape(port)
        finally:
            err = stop_agent(agent)
        rows = pg.sql("SELECT query, queryid FROM pg_stat_statements")
    print(err, rows, {k: v for k, v in got.items() if "statement" in k})
    by_text = {str(q): int(str(i)) for q, i in rows}
    series = {k: v for k, v in got.items() if k.startswith("pgprobe_statement_seconds_total")}
    shown = {k.split('query_id="')[1].split('"')[0] for k in series}
    assert len(shown) == 3, series  # the burner's, and the two longest sleeps'
    for _, _, seconds, normalised in LOADS[:2]:
        qid = by_text[normalised]
        assert str(qid) in shown, (qid, shown)
        key = f'pgprobe_statement_seconds_total{{part="Timeout",query_id="{qid}"}}'
        assert abs(series.get(key, 0.0) - seconds) <= 0.02 * seconds, (key, series)
    every = got['pgprobe_statements_seconds_total{kind="statement",part="Timeout"}']
    assert abs(every - 3.1) <= 0.02 * 3.1, every
    # the CPU profile's samples of the burner carry its query id
    burner = str(next(i for q, i in by_text.items() if q.startswith("SELECT count(*)")))
    labelled = pprof_by_query(profile)
    assert labelled.get(burner, 0) >= 0.5 * sum(labelled.values()), (burner, labelled)
