"""`pgprobe clog-reads` on a real cluster with real bpftrace: counts exact against pg_stat_slru.

One throwaway cluster with the SLRU workload's settings (shared_buffers =
128kB: 4 pg_xact buffers; autovacuum and parallel query off), xids burnt over
7 pg_xact pages, and a transaction held open with 102 400 subtransactions
(tests/slru_workload.py). Each test starts `pgprobe clog-reads` as a user
would, waits until its bpftrace has attached every probe (its perf events are
open), runs the workload on one connection between two pg_stat_slru reads of
that connection (slru_stats() flushes the backend's own counters first), and
ends pgprobe with Ctrl-C (SIGINT): pgprobe prints what it collected.

The workload's numbers are exact by construction (see slru_workload.py): every
pg_xact_status() lookup misses (24 reads), and the two scans of the holder's
table miss about once per pg_subtrans page. So the probe's reads for the
workload backend must equal the blks_read delta of that SLRU, exactly.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from helpers import CHECKOUT, need, run_pgprobe
from slru_workload import (
    BLCKSZ,
    CLUSTER_SETTINGS,
    SUBTRANS,
    XACT,
    SubtransHolder,
    burn_xids,
    provoke_subtrans_reads,
    provoke_xact_reads,
    slru_delta,
    slru_stats,
    subtrans_holder,
    xact_burn_size,
)

from pgprobe.errors import EXIT_USAGE
from pgprobe.sandbox import PgCluster, pg_bindir

pytestmark = pytest.mark.integration

APPLICATION = "slru-workload"
HEX_FRAME = re.compile(r"^(0x)?[0-9a-fA-F]{6,}$")


# -- fixtures --------------------------------------------------------------------------------


@dataclass
class Workload:
    """The cluster, the workload connection and what it needs to provoke reads."""

    cluster: PgCluster
    conn: psycopg.Connection[Any]
    pid: int
    first: int
    last: int
    holder: SubtransHolder

    def run(self, xact: bool = True, subtrans: bool = True) -> dict[str, tuple[int, int]]:
        """Provoke the reads; return pg_stat_slru's deltas (hits, reads) around them."""
        before = slru_stats(self.conn)
        if xact:
            provoke_xact_reads(self.conn, self.first, self.last)
        if subtrans:
            provoke_subtrans_reads(self.conn, self.holder)
        after = slru_stats(self.conn)
        return slru_delta(before, after)


def _have_postgres() -> bool:
    try:
        return (pg_bindir() / "initdb").exists()
    except (OSError, RuntimeError, ValueError):
        return False


@pytest.fixture(scope="module")
def workload(tracing: None) -> Iterator[Workload]:
    need(_have_postgres(), "no PostgreSQL server installed (initdb not found)")
    with PgCluster(settings=CLUSTER_SETTINGS, name="pgprobe-clog") as pg:
        version = int(str(pg.sql("SHOW server_version_num")[0][0]))
        need(version >= 130000, "pg_stat_slru and pg_xact_status need PostgreSQL 13+")
        with pg.connect(application_name=APPLICATION) as conn:
            first, last = burn_xids(pg.conninfo, xact_burn_size(conn))
            with subtrans_holder(pg.conninfo) as holder:
                yield Workload(pg, conn, conn.info.backend_pid, first, last, holder)


# -- running pgprobe -------------------------------------------------------------------------


def _bpftrace_child(ppid: int) -> int | None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        if comm == "bpftrace" and int(stat.rsplit(")", 1)[1].split()[1]) == ppid:
            return int(entry)
    return None


def _perf_event_fds(pid: int) -> int:
    count = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]":
                count += 1
        except OSError:
            continue
    return count


def start(workload: Workload, *args: str) -> subprocess.Popen[str]:
    """pgprobe clog-reads in the background, attached when this returns.

    bpftrace 0.17 opens one output-buffer perf event per CPU at start, then one
    per tracepoint (and one for interval:s:1) as it attaches: attached is when
    that count has grown and stopped growing. pgprobe reads pg_stat_slru's
    "before" 0.1 s after bpftrace says it attaches, so a little more is waited.
    """
    argv = [sys.executable, "-m", "pgprobe", "clog-reads", *workload.cluster.conn_args,
            "-d", "60", *args]  # fmt: skip
    probe = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT
    )
    cpus = os.cpu_count() or 1
    deadline = time.monotonic() + 60
    seen, stable_since = 0, time.monotonic()
    while time.monotonic() < deadline:
        if probe.poll() is not None:
            pytest.fail(f"pgprobe ended before attaching: {probe.communicate()[1]}")
        child = _bpftrace_child(probe.pid)
        count = _perf_event_fds(child) if child is not None else 0
        if count != seen:
            seen, stable_since = count, time.monotonic()
        elif count > cpus + 10 and time.monotonic() - stable_since > 0.3:
            time.sleep(0.3)
            return probe
        time.sleep(0.02)
    probe.kill()
    pytest.fail(f"bpftrace did not attach within 60 s: {probe.communicate()[1]}")


def stop(probe: subprocess.Popen[str]) -> tuple[str, str]:
    """Ctrl-C, as a user ends a capture; pgprobe prints what it collected."""
    time.sleep(0.2)
    probe.send_signal(signal.SIGINT)
    out, err = probe.communicate(timeout=60)
    assert probe.returncode == 0, err
    return out, err


def reads_by_slru(rows: list[dict[str, Any]], pid: int) -> dict[str, tuple[int, int]]:
    """(reads, bytes) per SLRU for one pid, from JSON rows."""
    out: dict[str, tuple[int, int]] = {}
    for row in rows:
        if row["pid"] == pid:
            reads, nbytes = out.get(row["slru"], (0, 0))
            out[row["slru"]] = (reads + row["reads"], nbytes + row["bytes"])
    return out


# -- tests -----------------------------------------------------------------------------------


def test_reads_equal_pg_stat_slru_for_pg_xact_and_pg_subtrans(workload: Workload) -> None:
    probe = start(workload, "--slru", "pg_xact,pg_subtrans", "--json")
    delta = workload.run()
    out, err = stop(probe)
    doc = json.loads(out)
    meta, rows = doc["meta"], doc["rows"]
    got = reads_by_slru(rows, workload.pid)
    print(f"probe {got}, pg_stat_slru delta {delta}")

    xact_reads = delta[XACT][1]
    assert xact_reads >= 24, delta  # 24 lookups over 6 pages through 4 buffers: all miss
    assert got["pg_xact"] == (xact_reads, xact_reads * BLCKSZ)
    sub_reads = delta[SUBTRANS][1]
    assert sub_reads >= 50, delta  # two scans over 50 pages through 32 buffers
    assert got["pg_subtrans"] == (sub_reads, sub_reads * BLCKSZ)
    # Every read is the workload's (autovacuum off, the holder idle in its transaction).
    assert {r["pid"] for r in rows} == {workload.pid}
    for row in rows:
        assert row["file"].startswith(row["slru"] + "/")
        assert (row["backend_type"], row["application_name"]) == ("client backend", APPLICATION)
        assert 0 < row["avg_us"] <= row["max_us"] and row["p99_us"] <= row["max_us"]

    # pgprobe's own pg_stat_slru window holds the workload's: the same deltas.
    stats = meta["slru_stats"]
    assert meta["slru_stats_unavailable"] is None
    assert stats["pg_xact"]["name"] == XACT
    assert stats["pg_xact"]["blks_read"] == xact_reads
    assert stats["pg_subtrans"]["blks_read"] == sub_reads
    assert stats["pg_subtrans"]["blks_hit"] == delta[SUBTRANS][0]
    assert meta["slru"] == ["pg_xact", "pg_subtrans"]
    assert meta["open_errors"] == [] and meta["lost_events"] == 0
    assert meta["postmaster_pid"] == workload.cluster.postmaster_pid
    assert meta["interrupted"] is True


def test_table_per_backend_and_totals_beside_pg_stat_slru(workload: Workload) -> None:
    probe = start(workload, "--pid", str(workload.pid), "--slru", "pg_xact", "--slru", "subtrans")
    delta = workload.run()
    out, _ = stop(probe)
    print(out)
    lines = out.splitlines()
    assert lines[0].startswith(f"SLRU reads of pg_xact, pg_subtrans: pids {workload.pid}")
    assert lines[1].split()[:4] == ["PID", "BACKEND", "TYPE", "APPLICATION"]
    # PID, BACKEND TYPE (two words), APPLICATION, SLRU, READS, BYTES, ...
    rows = {line.split()[4]: line.split() for line in lines[2:4]}
    assert rows["pg_xact"][:4] == [str(workload.pid), "client", "backend", APPLICATION]
    assert rows["pg_xact"][5] == f"{delta[XACT][1]:,}"
    assert rows["pg_subtrans"][5] == f"{delta[SUBTRANS][1]:,}"
    assert rows["pg_subtrans"][6] == f"{delta[SUBTRANS][1] * BLCKSZ:,}"
    totals = next(i for i, ln in enumerate(lines) if ln.startswith("Totals per SLRU"))
    assert "pg_stat_slru counts the whole cluster" in lines[totals]
    header = lines[totals + 1].split()
    assert header[:2] == ["SLRU", "READS"] and header[-4:] == ["BLKS_HIT", "BLKS_READ", "HIT", "%"]
    by_slru = {ln.split()[0]: ln.split() for ln in lines[totals + 2 :] if ln.strip()}
    for slru, name in (("pg_xact", XACT), ("pg_subtrans", SUBTRANS)):
        cells = by_slru[slru]  # SLRU READS ... BLKS_HIT BLKS_READ HIT%
        assert cells[1] == cells[-2] == f"{delta[name][1]:,}", cells
        assert cells[-3] == f"{delta[name][0]:,}", cells
    assert by_slru["pg_xact"][-1] == "0.00%"  # every pg_xact lookup missed


def test_stacks_name_the_clog_code_path(workload: Workload) -> None:
    probe = start(workload, "--pid", str(workload.pid), "--stacks", "--json")
    delta = workload.run(subtrans=False)
    out, err = stop(probe)
    doc = json.loads(out)
    stacks = doc["meta"]["stacks"]
    assert sum(s["reads"] for s in stacks) == delta[XACT][1]
    top = stacks[0]
    print("\n".join(top["frames"]))
    frames = set(top["frames"])
    assert {"TransactionIdGetStatus", "SimpleLruReadPage"} <= frames, top["frames"]
    assert "pg_xact_status" in frames
    assert not any(HEX_FRAME.match(f) for f in top["frames"]), top["frames"]
    # The table shows them too, by name.
    probe = start(workload, "--pid", str(workload.pid), "--stacks")
    workload.run(subtrans=False)
    out, _ = stop(probe)
    assert "Top reading code paths" in out
    assert "      TransactionIdGetStatus" in out and "      SimpleLruReadPage" in out


def test_trace_prints_one_line_per_read(workload: Workload) -> None:
    probe = start(workload, "--trace", "--slru", "all", "--pid", str(workload.pid))
    delta = workload.run()
    out, _ = stop(probe)
    lines = out.splitlines()
    assert lines[0].split() == ["TIME", "PID", "FILE", "OFFSET", "BYTES", "LAT", "us"]
    end = next(i for i, ln in enumerate(lines) if ln.startswith("SLRU reads of"))
    reads = [ln.split() for ln in lines[1:end] if ln.strip()]
    files = [r[2] for r in reads]
    assert all(r[1] == str(workload.pid) and r[4] == str(BLCKSZ) for r in reads)
    xact = sum(f.startswith("pg_xact/") for f in files)
    subtrans = sum(f.startswith("pg_subtrans/") for f in files)
    assert (xact, subtrans) == (delta[XACT][1], delta[SUBTRANS][1])
    assert len(reads) == xact + subtrans
    # Offsets are whole pages: OFFSET / 8192 is the page in the segment.
    assert all(int(r[3]) % BLCKSZ == 0 for r in reads)
    # The summary after the trace counts the same reads.
    summary = {ln.split()[4]: ln.split()[5] for ln in lines[end + 2 : end + 4]}
    assert summary == {"pg_xact": f"{xact:,}", "pg_subtrans": f"{subtrans:,}"}


def test_trace_json_lines_then_the_document(workload: Workload) -> None:
    probe = start(workload, "--trace", "--json", "--pid", str(workload.pid))
    delta = workload.run(subtrans=False)
    out, _ = stop(probe)
    docs = [json.loads(line) for line in out.splitlines()]
    reads, summary = docs[:-1], docs[-1]
    assert all(d["event"] == "read" and d["slru"] == "pg_xact" for d in reads)
    assert len(reads) == delta[XACT][1] == summary["rows"][0]["reads"]
    assert summary["tool"] == "clog-reads" and summary["meta"]["mode"] == "trace"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--slru", "pg_bogus"], "unknown SLRU 'pg_bogus'"),
        (["--slru", "pg_xact,nope"], "unknown SLRU 'nope'"),
        (["--slru", ","], "empty SLRU list"),
        (["--interval", "0"], "must be greater than 0"),
    ],
)
def test_bad_options_are_one_line(args: list[str], needle: str) -> None:
    done = run_pgprobe(["clog-reads", *args])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == EXIT_USAGE, done.stderr
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert done.stdout == ""
