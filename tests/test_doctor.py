"""`pgprobe doctor` on this machine: everything pgprobe needs present; kprobes (which it does
not need) as the kernel says; each build's probes, symbols and frame pointers as readelf, nm
and objdump read them (tests/binfacts.py), not as pgprobe's own ELF reader does."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from binfacts import binary_facts, kernel_has_kprobes
from helpers import CHECKOUT, need, run_pgprobe

from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

Recorder = Callable[[str, str], None]
NEEDED = ("root", "bpftrace", "btf", "tracepoints", "perf sampling", "uprobes", "usdt",
          "server binary", "usdt probes", "postgresql version", "wait event address",
          "backend state address", "connection", "waits compiled", "sampler compiled",
          "slru compiled", "lwlocks compiled")  # fmt: skip


def doctor(cluster: PgCluster, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    done = run_pgprobe(["doctor", *cluster.conn_args, "--json"], env=env)
    assert "Traceback" not in done.stderr
    return done.returncode, json.loads(done.stdout)


def test_doctor_here_is_ready_whether_or_not_kprobes(cluster: PgCluster, tracing: None) -> None:
    code, doc = doctor(cluster)
    checks = {row["check"]: row for row in doc["rows"]}
    for name in NEEDED:
        assert checks[name]["status"] == "ok", checks[name]
    # kprobes as the kernel has them (CONFIG_KPROBES): said, but they block nothing.
    assert checks["kprobes"]["status"] == "info"
    expected = "available" if kernel_has_kprobes() else "unavailable ("
    assert checks["kprobes"]["detail"].startswith(expected), checks["kprobes"]
    assert doc["meta"] == {"ready": True, "blocked_tools": [], "partial_tools": []}
    assert code == 0


def test_doctor_without_bpftrace_says_what_needs_it(
    cluster: PgCluster, tracing: None, tmp_path: Path
) -> None:
    """Every tool runs from its compiled object (scripts/build-bpf built them): bpftrace's
    FAIL blocks none, and the verdict names what only the scripts do."""
    code, doc = doctor(cluster, env={"PATH": str(tmp_path), "PGPROBE_BPFTRACE": ""})
    checks = {row["check"]: row for row in doc["rows"]}
    assert checks["bpftrace"]["status"] == "fail"
    assert "apt-get install bpftrace" in checks["bpftrace"]["fix"]
    compiled = ("sampler compiled", "waits compiled", "slru compiled", "lwlocks compiled")
    assert {checks[c]["status"] for c in compiled} == {"ok"}, checks
    assert code == 0 and doc["meta"]["blocked_tools"] == [], doc["meta"]
    assert doc["meta"]["partial_tools"] == ["clog-reads", "waits"], doc["meta"]


def test_flame_and_waits_run_without_bpftrace(
    cluster: PgCluster, tracing: None, tmp_path: Path
) -> None:
    """What doctor says runs without bpftrace does: each from its object, with real data."""
    env = {"PATH": str(tmp_path), "PGPROBE_BPFTRACE": ""}
    with cluster.connect() as conn:
        pid = conn.info.backend_pid
        flame = run_pgprobe(["flame", *cluster.conn_args, "--pid", str(pid), "--unwind", "fp",
                             "-d", "2", "--json"], env=env)  # fmt: skip
        waits = run_pgprobe(["waits", *cluster.conn_args, "--pid", str(pid), "--by", "pid",
                             "-d", "2", "--json"], env=env)  # fmt: skip
    assert flame.returncode == 0, flame.stderr
    assert json.loads(flame.stdout)["meta"]["engine"] == "libbpf"
    assert waits.returncode == 0, waits.stderr
    doc = json.loads(waits.stdout)
    assert doc["meta"]["engine"] == "libbpf"
    # the idle session's 2 s, all of it, in its rows (the time model's own check: wall)
    total_s = sum(r["total_us"] for r in doc["rows"] if r["pid"] == pid) / 1e6
    assert abs(total_s - doc["meta"]["window_s"]) <= 0.02 * doc["meta"]["window_s"], doc


@pytest.mark.parametrize(
    "args",
    [["lwlocks", "-d", "1"], ["lwlocks", "--source", "usdt", "-d", "1"], ["clog-reads", "-d", "1"],
     ["locks", "-d", "1"], ["queries", "-d", "1"], ["top", "--batch", "1", "--interval", "1"],
     ["triage", "-d", "1"]],
    ids=["lwlocks", "lwlocks-usdt", "clog-reads", "locks", "queries", "top", "triage"],
)  # fmt: skip
def test_the_other_compiled_tools_run_without_bpftrace(
    cluster: PgCluster, tracing: None, tmp_path: Path, args: list[str]
) -> None:
    """The rest of what doctor spares: each from its object, none asks for bpftrace."""
    env = {"PATH": str(tmp_path), "PGPROBE_BPFTRACE": ""}
    report = ["-o", str(tmp_path / "report.html")] if args[0] == "triage" else []
    done = run_pgprobe([*args, *cluster.conn_args, "--json", *report], env=env)
    assert done.returncode == 0, done.stderr
    meta = json.loads(done.stdout.splitlines()[-1])["meta"]
    assert meta["engine"] == "libbpf", meta
    assert args[0] == "triage" or not meta.get("warnings"), meta  # triage: its parts' words


def test_doctor_table_names_the_blocked_tools(
    cluster: PgCluster, tracing: None, tmp_path: Path
) -> None:
    """Without bpftrace and without the compiled objects (an empty bpf/build/ mounted over
    the checkout's, in a mount namespace of its own), the tracing tools cannot run."""
    unshare, mount = shutil.which("unshare"), shutil.which("mount")
    need(unshare is not None and mount is not None, "unshare or mount is not installed")
    build = CHECKOUT / "bpf" / "build"
    need(build.is_dir(), "bpf/build/ is not built (scripts/build-bpf)")
    hide = '"$1" -t tmpfs -o size=1m none "$2" && shift 2 && exec "$@"'
    env = {k: v for k, v in os.environ.items() if k != "PGPROBE_BPFTRACE"}
    env["PATH"] = str(tmp_path)  # no bpftrace either
    done = subprocess.run(
        [str(unshare), "--mount", "--propagation", "private", "/bin/sh", "-c", hide, "sh",
         str(mount), str(build), sys.executable, "-m", "pgprobe", "doctor", *cluster.conn_args],
        capture_output=True, text=True, timeout=120, cwd=CHECKOUT, env=env,
    )  # fmt: skip
    assert done.returncode != 0, done.stderr
    assert "bpftrace not found" in done.stdout and "is not built" in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    cannot = "clog-reads, flame, hot, lwlocks, triage, waits"
    assert last == f"not ready: these tools cannot run here: {cannot}", last


def test_doctor_reads_my_wait_event_info(cluster: PgCluster, tracing: None) -> None:
    """The address against nm -D and /proc/PID/maps (bpf/waits.bt's recipe), the pointer
    against the postmaster's writable mappings, the value against a second read."""
    _, doc = doctor(cluster)
    (row,) = [r for r in doc["rows"] if r["check"] == "wait event address"]
    print(row["detail"])
    assert row["status"] == "ok", row
    found = re.fullmatch(
        r"my_wait_event_info found at 0x([0-9a-f]+), read 0x([0-9a-f]+) -> 0x([0-9a-f]{8}) "
        r"\(postmaster (\d+)\)",
        row["detail"],
    )
    assert found, row["detail"]
    addr, pointer, value = (int(found.group(i), 16) for i in (1, 2, 3))
    pm = int(found.group(4))
    binary = str(Path(f"/proc/{pm}/exe").resolve())
    nm = subprocess.run(["nm", "-D", "--defined-only", binary], capture_output=True, text=True)
    (sym,) = [int(f[0], 16) for f in map(str.split, nm.stdout.splitlines())
              if len(f) == 3 and f[2] == "my_wait_event_info"]  # fmt: skip
    maps = [line.split() for line in Path(f"/proc/{pm}/maps").read_text().splitlines()]
    (base,) = [int(m[0].split("-")[0], 16) for m in maps
               if len(m) == 6 and m[5] == binary and m[2] == "00000000"]  # fmt: skip
    assert addr == sym + base
    writable = [tuple(int(x, 16) for x in m[0].split("-")) for m in maps if m[1][1] == "w"]
    assert any(lo <= pointer < hi for lo, hi in writable), hex(pointer)
    with open(f"/proc/{pm}/mem", "rb", buffering=0) as mem:
        mem.seek(pointer)
        assert int.from_bytes(mem.read(4), "little") == value


def test_doctor_reads_a_backends_state(cluster: PgCluster, tracing: None) -> None:
    """MyBEEntry->st_state read in a session idle in transaction, as pg_stat_activity says."""
    with cluster.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT 1")  # and nothing more: idle in transaction
        pid = conn.info.backend_pid
        _, doc = doctor(cluster)
        (row,) = [r for r in doc["rows"] if r["check"] == "backend state address"]
        print(row["detail"])
        assert row["status"] == "ok", row
        read = rf"read 'idle in transaction' in backend {pid}"
        assert re.fullmatch(r"MyBEEntry found at 0x[0-9a-f]+, st_state at \+\d+; " + read,
                            row["detail"]), row  # fmt: skip


def test_doctor_says_what_runs_on_each_build(
    pg_build: PgBuild, build_cluster: PgCluster, tracing: None, tested_on: Recorder
) -> None:
    """Per build: the probes, frame pointers and symbols it has (readelf, nm and objdump's
    reading; pgbuilds' too, which docs/support.md's table once took), and what runs in part."""
    code, doc = doctor(build_cluster)
    checks = {row["check"]: row for row in doc["rows"]}
    facts = binary_facts(str(pg_build.postgres))
    assert checks["postgresql version"]["detail"].startswith(pg_build.version)
    assert (checks["usdt probes"]["status"] == "ok") == facts.usdt, checks["usdt probes"]
    assert (checks["frame pointers"]["status"] == "ok") == facts.frame_pointers
    assert (checks["symbols"]["status"] == "ok") == (not facts.stripped), checks["symbols"]
    helpers = (pg_build.has_usdt, pg_build.stripped, pg_build.frame_pointers)
    assert helpers == (facts.usdt, facts.stripped, facts.frame_pointers), (helpers, facts)
    if facts.usdt:
        assert doc["meta"] == {"ready": True, "blocked_tools": [], "partial_tools": []}
        assert code == 0
        tested_on("doctor", "ready")
        return
    assert doc["meta"] == {
        "ready": True,
        "blocked_tools": [],
        "partial_tools": ["lwlocks", "triage"],
    }
    assert code == 0
    done = run_pgprobe(["doctor", *build_cluster.conn_args])
    last = done.stdout.strip().splitlines()[-1]
    assert last == (
        "ready in part: runs here: clog-reads, flame, hot, waits; lwlocks without --source usdt "
        "(exact counts per wait); triage without its LWLock table"
    ), last
    tested_on("doctor", "ready in part (no lwlocks --source usdt)")
