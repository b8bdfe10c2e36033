"""Nothing a local user or a database client controls makes root pgprobe run code or hang.

Each test is a case of issue 30's table, tried for real: a process run as another user
(uid 65534, `nobody`), files that user leaves in /tmp, a real backend running JIT code,
a real server with pg_stat_statements as the witness of the SQL pgprobe sends. The other
cases live beside this file by area: names shown literally (test_security_names.py),
serve's HTTP side (test_security_serve.py), tracer output, result files and the DWARF
cap (test_security_output.py).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import CHECKOUT, cluster_for, need, run_pgprobe

from pgprobe import proc
from pgprobe.errors import EXIT_TARGET
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

NOBODY = "nobody"


def as_nobody(*argv: str) -> list[str]:
    return ["runuser", "-u", NOBODY, "--", *argv]


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A directory of the unprivileged user's own, as any local user has one."""
    need(os.geteuid() == 0, "needs root (runs a process as another user)")
    pw = pwd.getpwnam(NOBODY)
    path = Path(tempfile.mkdtemp(prefix="pgprobe-nobody-"))
    os.chown(path, pw.pw_uid, pw.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _wait_for(check: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


# -- row 1: root never runs a file it found through /proc --------------------------------


def test_a_local_users_process_named_postgres_is_never_run(nobody_dir: Path) -> None:
    """A local user's `postgres` (a copy of sleep), whose file is then replaced by a script:
    `backends --pid` (no connection: /proc only) and `doctor` read, never run it."""
    fake = nobody_dir / "postgres"
    marker = nobody_dir / "ran"
    subprocess.run(as_nobody("cp", "/bin/sleep", str(fake)), check=True)
    process = subprocess.Popen(as_nobody(str(fake), "300"))
    try:
        pid = _child_named(process.pid, "postgres")
        script = nobody_dir / "postgres.new"
        subprocess.run(
            as_nobody("sh", "-c", f'printf "#!/bin/sh\\nid > {marker}\\n" > {script}'),
            check=True,
        )
        subprocess.run(as_nobody("chmod", "755", str(script)), check=True)
        subprocess.run(as_nobody("mv", str(script), str(fake)), check=True)
        info = proc.read_info(pid)
        assert info is not None and info.comm == "postgres", info

        done = run_pgprobe(["backends", "--pid", str(pid), "-h", "/nonexistent", "-p", "1"])
        assert done.returncode == EXIT_TARGET, done
        assert done.stderr.count("\n") == 1 and f"pid {pid} is not a PostgreSQL" in done.stderr
        assert "Traceback" not in done.stderr

        doctor = run_pgprobe(["doctor", "-h", "/nonexistent", "-p", "1"])
        assert str(nobody_dir) not in doctor.stdout + doctor.stderr, doctor
        assert not marker.exists(), f"root ran the user's file: {marker.read_text()}"
    finally:
        process.kill()
        process.wait()


def _child_named(pid: int, comm: str) -> int:
    """runuser's child (or runuser itself, once exec'd) named `comm`."""
    found: list[int] = []

    def look() -> bool:
        for candidate in (pid, *proc.children(pid)):
            info = proc.read_info(candidate)
            if info is not None and info.comm == comm:
                found.append(candidate)
                return True
        return False

    _wait_for(look)
    return found[0]


def test_the_version_is_read_from_the_binary(build_cluster: PgCluster) -> None:
    """Without a connection, the version comes from the server binary read as data: the
    same number the server itself gives over SQL, on every build."""
    ((truth,),) = build_cluster.sql("SELECT current_setting('server_version_num')::int")
    done = run_pgprobe(
        [
            "backends",
            "--pid",
            str(build_cluster.postmaster_pid),
            "-h",
            "/nonexistent",
            "-p",
            "1",
            "--json",
        ]  # fmt: skip
    )
    assert done.returncode == 0, done.stderr
    meta = json.loads(done.stdout)["meta"]
    assert meta["postgres_version_num"] == truth, meta
    assert meta["postmaster_pid"] == build_cluster.postmaster_pid


# -- row 2: /tmp/perf-PID.map is untrusted data -------------------------------------------


# What a local user can leave at a perf map's path before a process writes one (nobody), and
# what code inside the backend can write there itself (postgres): how each is refused.
HOSTILE_PERF_MAPS = {
    "fifo": (NOBODY, "mkfifo {path}", "a FIFO"),
    "symlink": (NOBODY, "ln -s /dev/zero {path}", "a symbolic link"),
    "foreign": (NOBODY, "echo '{jit:x} 100000 planted_name' > {path}", "owned by uid"),
    "sparse": ("postgres", "truncate -s 300M {path}", "over the limit"),
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_PERF_MAPS))
def test_a_hostile_perf_map_is_skipped_and_said(
    cluster: PgCluster, tracing: None, kind: str
) -> None:
    """A backend runs LLVM JIT code (executable anonymous memory: the frames a perf map
    would name); its /tmp/perf-PID.map is another user's FIFO, symlink to /dev/zero or
    regular file, or a 300 MB sparse file of the backend's own user. pgprobe hot ends, with
    bounded memory, names the frames [jit] and says in one line what it skipped and why."""
    need(os.geteuid() == 0, "needs root (a file of another user)")
    jit = Path(cluster.bindir).parent / "lib" / "llvmjit.so"
    need(jit.exists(), f"this build has no LLVM JIT ({jit})")
    conn = cluster.connect()
    pid = conn.info.backend_pid
    perf_map = Path(f"/tmp/perf-{pid}.map")
    stop = threading.Event()

    def burn() -> None:
        with conn.cursor() as cur:
            cur.execute("SET jit_above_cost = 0")
            # all of the work in this backend (the one sampled), none in parallel workers
            cur.execute("SET max_parallel_workers_per_gather = 0")
            cur.execute("CREATE TEMP TABLE burn AS SELECT g AS a FROM generate_series(1, 1e6) g")
            while not stop.is_set():
                # arithmetic enough per row that the JIT-compiled expression holds a
                # good share of the samples (two short terms: none in 2 s, once in CI)
                cur.execute("SELECT sum((a * 2 + 1) % 7 + (a * 3 + 2) % 11 + (a * 5 + 3) % 13"
                            " + (a * 7 + 4) % 17 + (a * 11 + 5) % 19 + (a * 13 + 6) % 23)"
                            " FROM burn")  # fmt: skip

    worker = threading.Thread(target=burn)
    worker.start()
    try:
        _wait_for(lambda: _jit_region(pid) is not None, timeout=30)
        user, make, why = HOSTILE_PERF_MAPS[kind]
        command = make.format(path=perf_map, jit=_jit_region(pid) or 0)
        subprocess.run(["runuser", "-u", user, "--", "sh", "-c", command], check=True)
        # 4 s: in 2 s a CI run (b07eca2, a slow day) had no sample in the JIT code at all
        argv = ["hot", *cluster.conn_args, "--pid", str(pid), "-d", "4", "--unwind", "fp"]
        done, max_rss_mib = _run_measured([*argv, "--json"])
    finally:
        stop.set()
        worker.join(timeout=60)
        conn.close()
        perf_map.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rows"]
    assert any(r["function"] == "[jit]" for r in rows), rows[:5]
    assert not any(r["function"] == "planted_name" for r in rows), rows[:5]
    skipped = [line for line in done.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and str(perf_map) in skipped[0], done.stderr
    assert why in skipped[0], skipped
    # pgprobe and bpftrace each stay near their usual size (the sparse file read whole:
    # 616 MiB before).
    assert max_rss_mib < 300, max_rss_mib


def _jit_region(pid: int) -> int | None:
    """The start of pid's first executable anonymous mapping (JIT code), if any."""
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) == 5 and "x" in fields[1]:
                return int(fields[0].split("-")[0], 16)
    return None


def _run_measured(args: list[str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """`pgprobe ARGS`, and the largest resident size of it or any process it started."""
    code = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], timeout=120)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(done.returncode)\n"
    )
    argv = [sys.executable, "-c", code, sys.executable, "-m", "pgprobe", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=CHECKOUT)
    *lines, rss_kib = done.stderr.rstrip("\n").split("\n")
    done.stderr = "\n".join(lines) + "\n"
    return done, int(rss_kib) / 1024


# -- row 9: SQL that fetches only what is shown -------------------------------------------


@pytest.mark.once
def test_triage_reads_statement_texts_once(pg_build: PgBuild, tracing: None) -> None:
    """pg_stat_statements itself witnesses the SQL triage sends: its counters every second
    without the texts, the texts once (for the statements shown); the tools' discovery
    reads no pg_stat_activity.query."""
    settings = {"shared_preload_libraries": "'pg_stat_statements'"}
    with cluster_for(pg_build, settings, name="pgprobe-sql") as pg:
        pg.sql("CREATE EXTENSION pg_stat_statements")
        pg.sql("CREATE TABLE t AS SELECT 1 AS a")
        pg.sql("SELECT pg_stat_statements_reset()")
        report = Path(pg.root) / "report.html"
        done = run_pgprobe(["triage", *pg.conn_args, "-d", "3", "-o", str(report)])
        assert done.returncode == 0, done.stderr
        waits = run_pgprobe(["waits", *pg.conn_args, "-d", "1"])
        assert waits.returncode == 0, waits.stderr
        rows = pg.sql("SELECT query, calls FROM pg_stat_statements WHERE query ILIKE '%pg_stat%'")
    calls = {str(q): int(c) for q, c in rows}
    counters = [c for q, c in calls.items() if "FROM pg_stat_statements($1)" in q]
    texts = [c for q, c in calls.items() if "queryid = ANY" in q]
    assert sum(counters) >= 3, calls  # the window's edges and every second between
    assert texts == [1], calls  # the texts: once, at the end
    full_activity = [q for q in calls if "pg_stat_activity" in q and "coalesce(query" in q]
    assert not full_activity, full_activity


# -- row 11: the DTrace sysroot keeps apt's metadata checks -------------------------------


def test_dtrace_sysroot_keeps_apts_metadata_checks() -> None:
    """scripts/setup-dtrace's tree: no global switch-off of Valid-Until or Date checks; an
    expired snapshot mirror is exempted alone, in its own sources line."""
    home = Path(os.environ.get("PGPROBE_DTRACE_HOME", "/var/lib/pgprobe/dtrace"))
    sysroot = home / "sysroot"
    need(
        (sysroot / "usr/sbin/dtrace").exists() and os.environ.get("PGPROBE_NO_DTRACE") != "1",
        f"no DTrace sysroot at {sysroot}: scripts/setup-dtrace",
    )
    dump = subprocess.run(
        ["chroot", str(sysroot), "apt-config", "dump"], capture_output=True, text=True, check=True
    ).stdout
    assert 'Acquire::Check-Valid-Until "false"' not in dump, dump
    assert 'Acquire::Check-Date "false"' not in dump, dump
    for line in (sysroot / "etc/apt/sources.list").read_text().splitlines():
        if line.startswith("deb "):
            assert "check-date" not in line, line


# -- row 12: root writes nothing into a directory another user owns -----------------------


@pytest.mark.once
def test_cluster_files_are_written_as_the_postgres_user(pg_build: PgBuild) -> None:
    """A data directory's file replaced by a symlink to a root-only file: the throwaway
    cluster's configuration write (tests, demo, benchmarks) cannot reach it."""
    need(os.geteuid() == 0, "needs root (the postgres user's directory)")
    with cluster_for(pg_build, name="pgprobe-conf") as pg:
        target = Path(tempfile.mkdtemp(prefix="pgprobe-root-")) / "secret"
        target.write_text("root's\n")
        target.chmod(0o600)
        conf = pg.data / "postgresql.conf"
        conf.unlink()
        conf.symlink_to(target)
        with pytest.raises(subprocess.CalledProcessError):
            pg.write_config("postgresql.conf", "work_mem = '1MB'\n", "a")
        assert target.read_text() == "root's\n"
        shutil.rmtree(target.parent)
