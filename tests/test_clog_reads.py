"""`pgprobe clog-reads` on a real cluster with real bpftrace: counts exact against pg_stat_slru.

Long because it holds every clog-reads test, grouped by section below.

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
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import (
    CHECKOUT,
    bpf_link_fds,
    bpftrace_child,
    cluster_for,
    need,
    perf_event_fds,
    run_pgprobe,
)
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

from pgprobe import discover
from pgprobe.engines.base import Log2Hist, Snapshot, Stats
from pgprobe.errors import EXIT_USAGE
from pgprobe.pgbuilds import PgBuild
from pgprobe.pgversions import slru_stat_name
from pgprobe.sandbox import PgCluster
from pgprobe.tools import clog_reads

APPLICATION = "slru-workload"
HEX_FRAME = re.compile(r"^(0x)?[0-9a-fA-F]{6,}$")
# pg_stat_statements for the query ids of `clog-reads --by query` (tests/test_clog_uprobe.py);
# it reads no SLRU page, so the exact counts stay exact
STATEMENTS = {"shared_preload_libraries": "'pg_stat_statements'", "compute_query_id": "on"}


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


@pytest.fixture(scope="module")
def workload(pg_build: PgBuild, tracing: None) -> Iterator[Workload]:
    """On each build (tests marked once: the ONCE build only, see conftest.py)."""
    with cluster_for(pg_build, {**CLUSTER_SETTINGS, **STATEMENTS}, name="pgprobe-clog") as pg:
        version = int(str(pg.sql("SHOW server_version_num")[0][0]))
        need(version >= 130000, "pg_stat_slru and pg_xact_status need PostgreSQL 13+")
        pg.sql("CREATE EXTENSION pg_stat_statements")
        with pg.connect(application_name=APPLICATION) as conn:
            first, last = burn_xids(pg.conninfo, xact_burn_size(conn))
            with subtrans_holder(pg.conninfo) as holder:
                yield Workload(pg, conn, conn.info.backend_pid, first, last, holder)


# -- running pgprobe -------------------------------------------------------------------------


def start(workload: Workload, *args: str) -> subprocess.Popen[str]:
    """pgprobe clog-reads in the background (-d 60, ended by stop()), attached when this returns.

    The tests of this file are the syscall source's (files, bytes, latency, --trace):
    --source syscalls unless args say otherwise (tests/test_clog_uprobe.py: the default).
    """
    source = [] if "--source" in args else ["--source", "syscalls"]
    argv = [sys.executable, "-m", "pgprobe", "clog-reads", *workload.cluster.conn_args,
            "-d", "60", *source, *args]  # fmt: skip
    probe = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT
    )
    wait_attached(probe)
    return probe


STABLE_S = 1.0


def wait_attached(probe: subprocess.Popen[str]) -> None:
    """Until pgprobe has attached its probe: the compiled object's uprobe, or bpftrace's probes.

    bpftrace 0.17 opens one output-buffer perf event per CPU at start, then one
    per tracepoint or uprobe (and one for interval:s:1) as it attaches (the
    uprobe script has 5, the syscall one 20): attached is when
    that count has grown and stopped growing (for a second: on a loaded machine
    attaching can pause for a few hundred ms). pgprobe reads pg_stat_slru's
    "before" 0.1 s after bpftrace says it attaches, so a little more is waited.
    """
    cpus = os.cpu_count() or 1
    deadline = time.monotonic() + 60
    seen, stable_since = 0, time.monotonic()
    while time.monotonic() < deadline:
        if probe.poll() is not None:
            pytest.fail(f"pgprobe ended before attaching: {probe.communicate()[1]}")
        if bpf_link_fds(probe.pid) >= 1:  # bpf/clog_reads.bpf.c: its uprobe, in pgprobe
            time.sleep(0.3)  # pgprobe's opening pg_stat_slru read, right after the attach
            return
        child = bpftrace_child(probe.pid)
        count = perf_event_fds(child) if child is not None else 0
        if count != seen:
            seen, stable_since = count, time.monotonic()
        elif count > cpus + 3 and time.monotonic() - stable_since > STABLE_S:
            time.sleep(0.3)
            return
        time.sleep(0.02)
    # SIGINT, not SIGKILL: pgprobe stops its bpftrace (which runs in a session of its own).
    probe.send_signal(signal.SIGINT)
    try:
        err = probe.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        child = bpftrace_child(probe.pid)
        if child is not None:
            os.kill(child, signal.SIGKILL)
        probe.kill()
        err = probe.communicate()[1]
    pytest.fail(f"bpftrace did not attach within 60 s: {err}")


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


@pytest.mark.integration
def test_reads_equal_pg_stat_slru_for_pg_xact_and_pg_subtrans(
    workload: Workload, tested_on: Callable[[str, str], None]
) -> None:
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
    version = int(str(workload.cluster.sql("SHOW server_version_num")[0][0]))
    assert stats["pg_xact"]["name"] == slru_stat_name(version, "pg_xact")
    assert stats["pg_xact"]["blks_read"] == xact_reads
    assert stats["pg_subtrans"]["blks_read"] == sub_reads
    assert stats["pg_subtrans"]["blks_hit"] == delta[SUBTRANS][0]
    assert meta["slru"] == ["pg_xact", "pg_subtrans"]
    assert meta["open_errors"] == [] and meta["lost_events"] == 0
    assert meta["postmaster_pid"] == workload.cluster.postmaster_pid
    assert meta["interrupted"] is True
    tested_on("clog-reads", "exact vs pg_stat_slru")


@pytest.mark.integration
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


@pytest.mark.integration
@pytest.mark.once
def test_stacks_name_the_clog_code_path(workload: Workload, tmp_path: Path) -> None:
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
    # The table shows them too, by name, and --folded writes them for a flame graph.
    folded = tmp_path / "reads.folded"
    probe = start(workload, "--pid", str(workload.pid), "--folded", str(folded))
    delta = workload.run(subtrans=False)
    out, _ = stop(probe)
    assert "Top reading code paths" in out
    assert "      TransactionIdGetStatus" in out and "      SimpleLruReadPage" in out
    stacks = dict(line.rsplit(" ", 1) for line in folded.read_text().splitlines())
    assert sum(int(n) for n in stacks.values()) == delta[XACT][1]
    assert any(";TransactionIdGetStatus;SimpleLruReadPage;" in stack for stack in stacks)


@pytest.mark.integration
@pytest.mark.once
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


@pytest.mark.integration
@pytest.mark.once
def test_trace_json_lines_then_the_document(workload: Workload) -> None:
    probe = start(workload, "--trace", "--json", "--pid", str(workload.pid))
    delta = workload.run(subtrans=False)
    out, _ = stop(probe)
    docs = [json.loads(line) for line in out.splitlines()]
    reads, summary = docs[:-1], docs[-1]
    assert all(d["event"] == "read" and d["slru"] == "pg_xact" for d in reads)
    assert len(reads) == delta[XACT][1] == summary["rows"][0]["reads"]
    assert summary["tool"] == "clog-reads" and summary["meta"]["mode"] == "trace"


@pytest.mark.integration
@pytest.mark.once
def test_interval_summaries_each_with_their_pg_stat_slru_delta(workload: Workload) -> None:
    """A burst of pg_xact reads right after each of three summaries, published before it
    ends (slru_stats()): each summary's reads equal its own pg_stat_slru delta, each burst
    is whole in one summary, and all of them are the workload's."""
    version = int(str(workload.cluster.sql("SHOW server_version_num")[0][0]))
    # 14: slru_stats() waits a second for the collector; a burst then fits a 3 s window.
    interval = 1 if version >= 150000 else 3
    argv = [sys.executable, "-m", "pgprobe", "clog-reads", *workload.cluster.conn_args,
            "-d", "60", "--interval", str(interval), "--json"]  # fmt: skip
    probe = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(probe, lines), daemon=True)
    docs: list[dict[str, Any]] = []
    bursts: list[int] = []  # the reads of each burst (pg_stat_slru, the workload's own)
    late = False  # a burst ended after the next summary came: it may straddle an edge

    def next_summary() -> None:
        line = lines.get(timeout=60)
        assert line is not None, probe.communicate(timeout=60)[1]
        docs.append(json.loads(line))

    try:
        wait_attached(probe)
        reader.start()
        last = slru_stats(workload.conn)
        for rounds in (1, 3, 2):  # bursts of different sizes
            next_summary()  # a window's edges are just behind: the burst is far from both
            provoke_xact_reads(workload.conn, workload.first, workload.last, rounds)
            now = slru_stats(workload.conn)
            bursts.append(now[XACT][1] - last[XACT][1])
            last = now
            late = late or not lines.empty()
        next_summary()  # (each comes as the next window ends) ...
        next_summary()  # ... the last burst's window
        probe.send_signal(signal.SIGINT)
        reader.join(timeout=60)
        err = probe.communicate(timeout=60)[1]
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.communicate()
    assert probe.returncode == 0, err
    while (line := lines.get_nowait()) is not None:
        docs.append(json.loads(line))
    assert [d["meta"]["final"] for d in docs] == [False] * (len(docs) - 1) + [True]
    for doc in docs:
        assert doc["meta"]["source"] == "uprobe"  # the default
        assert doc["meta"]["interval"] == interval
        assert doc["meta"]["slru_stats"]["pg_xact"]["name"] in ("Xact", "transaction")
    counted = [sum(r["reads"] for r in d["rows"] if r["slru"] == XACT) for d in docs]
    published = [d["meta"]["slru_stats"][XACT]["blks_read"] for d in docs]
    print(f"bursts {bursts}; per summary: counted {counted}, pg_stat_slru {published}"
          f"{', a burst ran late' if late else ''}")  # fmt: skip
    assert all(bursts), bursts
    if not late:  # no read near an edge: every window exact, each burst whole in one
        assert counted == published, (counted, published)
        assert [n for n in counted if n] == bursts, (counted, bursts)
    # A burst over an edge can have reads counted on one side of it and published on the
    # other: through each edge the running totals differ by at most that burst ...
    gaps = [sum(published[: i + 1]) - sum(counted[: i + 1]) for i in range(len(docs))]
    assert all(abs(gap) <= max(bursts) for gap in gaps), (gaps, bursts)
    # ... and all of them, published before the Ctrl-C, are equal.
    assert sum(counted) == sum(published) == sum(bursts), (counted, published, bursts)
    # Each summary's pg_stat_slru window runs from the previous summary to this one.
    windows = [doc["meta"]["slru_stats_window_s"] for doc in docs]
    print(f"windows {windows}")
    assert all(0 <= w < 3 * interval for w in windows), windows


def _read_lines(probe: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    """probe's stdout, line by line as it comes, then None."""
    assert probe.stdout is not None
    for line in probe.stdout:
        lines.put(line)
    lines.put(None)


@pytest.mark.integration
@pytest.mark.once
def test_without_a_connection_the_cross_check_is_unavailable(workload: Workload) -> None:
    """--pid from /proc (nothing listens there): a warning, and the reads are still counted."""
    argv = ["-h", "/nonexistent", "-p", "1", "--pid", str(workload.pid), "--json"]
    probe = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "clog-reads", *argv, "-d", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
    )  # fmt: skip
    wait_attached(probe)
    delta = workload.run(subtrans=False)
    out, err = stop(probe)
    assert "pg_stat_slru cross-check is unavailable" in err
    doc = json.loads(out)
    assert doc["meta"]["slru_stats"] is None
    assert "no connection" in doc["meta"]["slru_stats_unavailable"]
    assert [r["reads"] for r in doc["rows"]] == [delta[XACT][1]]


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


def test_stacks_and_trace_together_are_refused() -> None:
    done = run_pgprobe(["clog-reads", "--stacks", "--trace"])
    assert done.returncode == EXIT_USAGE
    assert done.stderr.strip() == "pgprobe: --stacks and --trace cannot be combined: choose one"


# -- through the DTrace engine (a stand-in dtrace replaying a fixture) ----------------------

DTRACE_FIXTURES = CHECKOUT / "tests" / "fixtures" / "dtrace"


def fake_dtrace_env(tmp_path: Path, output: str) -> dict[str, str]:
    """PATH with a `dtrace` that replays tests/fixtures/dtrace/<output> (see fake_dtrace.py)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "dtrace"
    exe.write_text(f"#!{sys.executable}\n" + (DTRACE_FIXTURES / "fake_dtrace.py").read_text())
    exe.chmod(0o755)
    return {
        "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PGPROBE_DTRACE": "",
        "FAKE_DTRACE_OUTPUT": str(DTRACE_FIXTURES / output),
        "FAKE_DTRACE_ARGV": str(tmp_path / "argv.json"),
    }


@pytest.mark.integration
@pytest.mark.once
def test_stacks_named_by_dtrace(workload: Workload, tmp_path: Path) -> None:
    env = fake_dtrace_env(tmp_path, "clog_reads_stacks.out")
    argv = ["clog-reads", *workload.cluster.conn_args, "--engine", "dtrace", "-d", "1",
            "--stacks", "--slru", "pg_xact,pg_subtrans", "--json"]  # fmt: skip
    done = run_pgprobe(argv, env=env)
    assert done.returncode == 0, done.stderr
    # dtrace -q -s d/clog_reads.d POSTMASTER SLRU_MASK MODE ONLY_PID INTERVAL
    recorded = json.loads((tmp_path / "argv.json").read_text())
    assert recorded[-5:] == [str(workload.cluster.postmaster_pid), "5", "1", "0", "0"]
    doc = json.loads(done.stdout)
    got = {(r["pid"], r["file"]): r["reads"] for r in doc["rows"]}
    assert got == {(28544, "pg_xact/0001"): 48, (28544, "pg_xact/0002"): 31,
                   (28544, "pg_subtrans/0005"): 12, (28551, "pg_xact/0002"): 7}  # fmt: skip
    stacks = doc["meta"]["stacks"]
    assert [s["reads"] for s in stacks] == [52, 27, 12, 7]
    assert stacks[0]["frames"][:6] == [
        "libc.so.1`__pread", "SlruPhysicalReadPage", "SimpleLruReadPage",
        "SimpleLruReadPage_ReadOnly", "TransactionIdGetStatus", "TransactionLogFetch",
    ]  # fmt: skip
    assert "SubTransGetTopmostTransaction" in stacks[2]["frames"]
    assert set(stacks[3]["frames"]) == {"[unknown]"}  # the process had gone: hex only


@pytest.mark.integration
@pytest.mark.once
def test_trace_through_dtrace(workload: Workload, tmp_path: Path) -> None:
    env = fake_dtrace_env(tmp_path, "clog_reads_trace.out")
    argv = ["clog-reads", *workload.cluster.conn_args, "--engine", "dtrace", "-d", "1", "--trace"]
    done = run_pgprobe(argv, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["TIME", "PID", "FILE"]
    end = next(i for i, ln in enumerate(lines) if ln.startswith("SLRU reads of"))
    assert len([ln for ln in lines[1:end] if ln.strip()]) == 6
    assert lines[end + 2].startswith("28544 ") and re.search(
        r" pg_xact +6 +49,152 ", lines[end + 2]
    )


# -- pieces, without a cluster ---------------------------------------------------------------


def test_slru_names_and_masks() -> None:
    value = clog_reads.slru_value
    assert value("pg_xact, pg_subtrans/") == ("pg_xact", "pg_subtrans")
    assert value("Subtrans,multixact_member") == ("pg_subtrans", "pg_multixact/members")
    assert value("pg_multixact") == ("pg_multixact/offsets", "pg_multixact/members")
    chosen = clog_reads.selected_slrus
    assert chosen([], 15) == ["pg_xact"]
    assert chosen([], 9) == ["pg_clog"]  # 9.6 and older
    assert chosen([("pg_clog",)], 15) == ["pg_xact"] and chosen([("pg_xact",)], 9) == ["pg_clog"]
    assert len(chosen([("all",)], 15)) == 7 and "pg_clog" not in chosen([("all",)], 15)
    assert clog_reads.slru_mask(chosen([("all",)], 15)) == 255 - 2
    assert clog_reads.slru_mask(chosen([("pg_xact", "pg_subtrans")], 15)) == 5
    assert clog_reads.slru_of("pg_multixact/offsets/0000") == "pg_multixact/offsets"
    # pg_stat_slru's names of 13-16 and of 17+ map to the same directories
    for old, new in (("Xact", "transaction"), ("Subtrans", "subtransaction"),
                     ("MultiXactOffset", "multixact_offset"),
                     ("MultiXactMember", "multixact_member"), ("CommitTs", "commit_timestamp"),
                     ("Serial", "serializable"), ("Notify", "notify")):  # fmt: skip
        assert clog_reads.STAT_NAMES[old] == clog_reads.STAT_NAMES[new] in clog_reads.SLRU_BITS


def test_cross_check_unavailable_before_13() -> None:
    cluster = discover.Cluster(postmaster_pid=1, binary="/x", version_num=120017,
                               version="12.17", data_directory=None,
                               conninfo="host=/x")  # fmt: skip
    stats = clog_reads.SlruStats.open(cluster)
    assert stats.conn is None and stats.delta() is None
    assert stats.unavailable == (
        "PostgreSQL 12.17 has no pg_stat_slru (13 and later): the cross-check is "
        "unavailable; tracing anyway"
    )


def test_rows_from_a_snapshot() -> None:
    key1, key2 = (7, "pg_xact/0001"), (7, "pg_xact/0002")
    snap = Snapshot(maps={
        "read_stats": {key1: Stats(3, 3000), key2: Stats(1, 5000)},
        "read_bytes": {key1: 3 * 8192, key2: 8192},
        "read_max_ns": {key1: 1500, key2: 5000},
        "read_ns": {key1: Log2Hist(((512, 1023, 2), (1024, 2047, 1))),
                    key2: Log2Hist(((4096, 8191, 1),))},
        "open_errors": {(8, "pg_subtrans/0009"): 2},
    })  # fmt: skip
    recs = clog_reads.records(snap)
    per_pid = clog_reads.group_rows(recs, "pid")
    assert len(per_pid) == 1
    row = per_pid[0]
    assert (row.slru, row.files, row.reads, row.bytes, row.max_ns) == (
        "pg_xact", ("pg_xact/0001", "pg_xact/0002"), 4, 4 * 8192, 5000)  # fmt: skip
    assert row.avg_us == 2.0 and row.percentile_us(0.99) <= 5.0
    per_file = clog_reads.group_rows(recs, "file")
    assert [r.as_json()["file"] for r in per_file] == ["pg_xact/0001", "pg_xact/0002"]
    errors = clog_reads.open_errors(snap, lambda pid: True)
    assert [e.as_json() for e in errors] == [
        {"pid": 8, "slru": "pg_subtrans", "file": "pg_subtrans/0009", "count": 2}
    ]
    assert clog_reads.files_cell([f"pg_subtrans/{i:04X}" for i in range(6)]) == (
        "0000 0001 0002 0003 +2"
    )


def test_trace_lines() -> None:
    read = clog_reads.parse_trace_line("1592707897038\t25433\tpg_xact/0005\t106496\t8192\t2940")
    assert read == clog_reads.TraceRead(1592707897038, 25433, "pg_xact/0005", 106496, 8192, 2940)
    assert clog_reads.parse_trace_line("TIME_NS\tPID\tFILE\tOFFSET\tBYTES\tLAT_NS") is None
    assert read.as_json(0)["lat_us"] == 2.94 and read.as_json(0)["slru"] == "pg_xact"
    fields = read.text(0).split()
    assert fields[1:] == ["25433", "pg_xact/0005", "106496", "8192", "2.9"]


def test_totals_beside_pg_stat_slru_and_the_note_when_they_differ() -> None:
    key = (7, "pg_xact/0001")
    snap = Snapshot(maps={"read_stats": {key: Stats(24, 24000)}, "read_bytes": {key: 24 * 8192},
                          "read_max_ns": {key: 3000}})  # fmt: skip
    totals = clog_reads.group_rows(clog_reads.records(snap), "slru")
    zero = dict.fromkeys(clog_reads.STAT_COLUMNS, 0)
    delta = {
        "pg_xact": {**zero, "name": "Xact", "blks_read": 20, "hit_ratio_pct": 0.0},
        "pg_subtrans": {**zero, "name": "Subtrans", "blks_hit": 5, "hit_ratio_pct": 100.0},
        "pg_notify": {**zero, "name": "Notify", "hit_ratio_pct": None},
    }
    cells = clog_reads.totals_cells(totals, delta, ["pg_xact"])
    assert [(c["slru"], c.get("reads"), c["blks_read"], c["hit_pct"]) for c in cells] == [
        ("pg_xact", "24", "20", "0.00%"),
        ("pg_subtrans (not traced)", None, "0", "100.00%"),
    ]
    cluster = discover.Cluster(postmaster_pid=1, binary="/x", version_num=150018,
                               version="15.18", data_directory=None)  # fmt: skip
    whole = discover.Targets(cluster, [], whole_cluster=True)
    note = clog_reads.agreement_note(totals, delta, whole)
    assert note.startswith("Traced reads and blks_read differ (pg_xact 24 vs 20): ")
    assert clog_reads.agreement_note(totals, delta, discover.Targets(cluster, [7], False)) == ""
