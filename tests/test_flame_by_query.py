"""`flame`/`hot` --by query and --query-id: CPU samples per statement, against truths pgprobe
does not compute, with real bpftrace on every build.

Two sessions each run one CPU-bound statement until its backend has used 2 s of CPU
(/proc/PID/schedstat), at once, while three captures sample them: `flame --by query
--format folded`, `flame --query-id A -o X.pb.gz` (read back by the real `go tool pprof`)
and `hot --by query --json`. Each statement's samples are its backend's CPU time x Hz
(helpers.assert_samples_match_cpu: within 10 %, the upper side plus the machine's steal),
under the id pg_stat_statements shows for it (found by running the statement once, small,
before: its constants are normalised away, and a cancelled statement is not counted).
Builds without frame pointers sample with frame pointers all the same (their stacks are
cut; the statement is read from the backend's memory, not the stack).

Once: a server without query ids says so in one line, with the fix, and the samples are
under '(active, no query id)'; the options that cannot go together are one-line errors.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import (
    assert_samples_match_cpu,
    cluster_for,
    run_pgprobe,
    steal_seconds_since,
    steal_ticks,
)
from test_flame import cpu_seconds, run_query, start_pgprobe, stop, wait_sampling
from test_pprof import go_pprof

from pgprobe.pgbuilds import PgBuild
from pgprobe.render.flamegraph import parse_folded
from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

SETTINGS = {"shared_preload_libraries": "'pg_stat_statements'", "compute_query_id": "on"}
HZ = 499
CPU_S = 2.0
# generate_series in the target list: value per call (ProjectSet), nothing materialised
HASHING = "SELECT sum(hashtext(repeat(g::text, 20))) FROM (SELECT generate_series(1, {n}) AS g) s"
COUNTING = "SELECT count(*) FROM (SELECT generate_series(1, {n}) AS a) s WHERE a % 7 = 3"


def session(pg: PgCluster) -> tuple[psycopg.Connection[Any], int]:
    conn = pg.connect()
    conn.execute("SET jit = off")
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return conn, int(row[0])


def queryid(pg: PgCluster, conn: psycopg.Connection[Any], text: str) -> int:
    """The statement's id, from pg_stat_statements after one small run of it."""
    conn.execute(text.format(n=10))
    rows = pg.sql("SELECT DISTINCT queryid FROM pg_stat_statements WHERE query LIKE "
                  f"'{normalised_prefix(text)}%' AND toplevel")  # fmt: skip
    assert len(rows) == 1, rows
    return int(str(rows[0][0]))


def normalised_prefix(text: str) -> str:
    """The statement's text up to its first constant (pg_stat_statements shows $1 there)."""
    return re.split(r"\d", text, maxsplit=1)[0]


def pprof_by_query(path: Path) -> dict[str, int]:
    """Samples per query_id label from `go tool pprof -raw` ("" for none)."""
    lines = go_pprof("-raw", str(path)).splitlines()
    out: dict[str, int] = {}
    last = 0
    for line in lines[lines.index("Samples:") + 2 : lines.index("Locations")]:
        values, colon, _ = line.partition(":")
        if colon and values.strip() and all(v.isdigit() for v in values.split()):
            last = int(values.split()[0])
            out[""] = out.get("", 0) + last
        else:
            found = re.findall(r"\bquery_id:\[(-?\d+)\]", line)
            if found:  # the labels of the sample just read
                out[""] -= last
                out[found[0]] = out.get(found[0], 0) + last
    return out


def test_cpu_samples_per_statement_against_schedstat(
    pg_build: PgBuild, tracing: None, tmp_path: Path
) -> None:
    with cluster_for(pg_build, SETTINGS, name="pgprobe-flame-query") as pg:
        pg.sql("CREATE EXTENSION pg_stat_statements")
        (a, a_pid), (b, b_pid) = session(pg), session(pg)
        a_id, b_id = queryid(pg, a, HASHING), queryid(pg, b, COUNTING)
        pprof_file = tmp_path / "cpu.pb.gz"
        common = [*pg.conn_args, "-F", str(HZ), "-d", "120", "--unwind", "fp"]
        runs = [
            start_pgprobe("flame", *common, "--by", "query", "--format", "folded"),
            start_pgprobe("flame", *common, "--query-id", str(a_id), "-o", str(pprof_file)),
            start_pgprobe("hot", *common, "--by", "query", "--json", "--top", "3"),
        ]
        for run in runs:
            wait_sampling(run)
        truth: dict[int, float] = {}
        steal = steal_ticks()

        def load(conn: psycopg.Connection[Any], pid: int, text: str, qid: int) -> None:
            before = cpu_seconds(pid)
            run_query(conn, pid, CPU_S, query=text.format(n=2_000_000_000))
            truth[qid] = cpu_seconds(pid) - before

        loads = [threading.Thread(target=load, args=(a, a_pid, HASHING, a_id)),
                 threading.Thread(target=load, args=(b, b_pid, COUNTING, b_id))]  # fmt: skip
        for t in loads:
            t.start()
        for t in loads:
            t.join()
        steal_s = steal_seconds_since(steal)
        (folded, err), (_, pprof_err), (hot, _) = (stop(run) for run in runs)
        a.close()
        b.close()
    print(truth, steal_s, err, pprof_err)
    towers: dict[str, int] = {}
    for stack, n in parse_folded(folded).items():
        towers[stack[0]] = towers.get(stack[0], 0) + n
    print(sorted(towers.items(), key=lambda kv: -kv[1])[:5])
    for qid, text in ((a_id, HASHING), (b_id, COUNTING)):
        root = [r for r in towers if r.startswith(f"query {qid}: ")]
        assert len(root) == 1, (qid, list(towers))
        assert normalised_prefix(text) in root[0]  # its text, from pg_stat_statements
        assert_samples_match_cpu(towers[root[0]], truth[qid], HZ, steal_s, ("flame", qid))
    # --query-id: one statement's samples only, labelled with its id in the pprof file
    labelled = pprof_by_query(pprof_file)
    assert set(labelled) <= {str(a_id), ""} and not labelled.get(""), labelled
    assert_samples_match_cpu(labelled[str(a_id)], truth[a_id], HZ, steal_s, "pprof")
    rows = json.loads(hot)["rows"]
    for qid in (a_id, b_id):
        mine = [r for r in rows if r["query_id"] == qid]
        assert mine and mine[0]["kind"] == "statement", rows[:4]
        assert_samples_match_cpu(mine[0]["statement_samples"], truth[qid], HZ, steal_s, "hot")
    # each statement's functions are its own: hashing in one, none of it in the other
    hashing = {r["function"] for r in rows if r["query_id"] == a_id}
    counting = {r["function"] for r in rows if r["query_id"] == b_id}
    assert "hash_bytes" in hashing and "hash_bytes" not in counting, (hashing, counting)


@pytest.mark.once
def test_without_query_ids_says_so_and_keeps_the_samples(cluster: PgCluster, tracing: None) -> None:
    with cluster.connect() as conn:
        setting = conn.execute("SHOW compute_query_id").fetchone()
        libraries = conn.execute("SHOW shared_preload_libraries").fetchone()
        assert setting and libraries and setting[0] == "auto"
        assert "pg_stat_statements" not in str(libraries[0])
        conn.execute("SET jit = off")
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = int(row[0])
        probe = start_pgprobe("flame", *cluster.conn_args, "-F", "199", "-d", "60", "--unwind",
                              "fp", "--by", "query", "--format", "folded")  # fmt: skip
        wait_sampling(probe)
        before, steal = cpu_seconds(pid), steal_ticks()
        run_query(conn, pid, 1.0, query=COUNTING.format(n=2_000_000_000))
        cpu_s, steal_s = cpu_seconds(pid) - before, steal_seconds_since(steal)
        out, err = stop(probe)
    notes = [ln for ln in err.splitlines() if "no query ids" in ln]
    assert len(notes) == 1 and "ALTER SYSTEM SET compute_query_id = on" in notes[0], err
    unnamed = sum(n for s, n in parse_folded(out).items() if s[0] == "(active, no query id)")
    assert_samples_match_cpu(unnamed, cpu_s, 199, steal_s + 0.05, "no ids")


@pytest.mark.once
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["flame", "--by", "query", "--unwind", "dwarf"],
            "perf's samples (dwarf) carry no query id",
        ),
        (["hot", "--no-text"], "--no-text goes with --by query or --query-id"),
        (["flame", "--query-id", "x"], "invalid int value"),
    ],
)
def test_options_that_cannot_go_together(
    cluster: PgCluster, tracing: None, args: list[str], message: str
) -> None:
    done = run_pgprobe([*args, *cluster.conn_args, "-d", "1"])
    assert isinstance(done, subprocess.CompletedProcess)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
