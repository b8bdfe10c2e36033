"""`pgprobe doctor` on this machine: kprobes missing, everything pgprobe needs present."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import run_pgprobe

from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

Recorder = Callable[[str, str], None]
NEEDED = ("root", "bpftrace", "btf", "tracepoints", "perf sampling", "uprobes", "usdt",
          "server binary", "usdt probes", "postgresql version", "connection")  # fmt: skip


def doctor(cluster: PgCluster, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    done = run_pgprobe(["doctor", *cluster.conn_args, "--json"], env=env)
    assert "Traceback" not in done.stderr
    return done.returncode, json.loads(done.stdout)


def test_doctor_here_is_ready_without_kprobes(cluster: PgCluster, tracing: None) -> None:
    code, doc = doctor(cluster)
    checks = {row["check"]: row for row in doc["rows"]}
    for name in NEEDED:
        assert checks[name]["status"] == "ok", checks[name]
    # This kernel has no kprobes (CONFIG_KPROBES off): said, but it blocks nothing.
    assert checks["kprobes"]["status"] == "info"
    assert "unavailable" in checks["kprobes"]["detail"]
    assert doc["meta"] == {"ready": True, "blocked_tools": [], "partial_tools": []}
    assert code == 0


def test_doctor_without_bpftrace_says_so_and_fails(
    cluster: PgCluster, tracing: None, tmp_path: Path
) -> None:
    code, doc = doctor(cluster, env={"PATH": str(tmp_path), "PGPROBE_BPFTRACE": ""})
    checks = {row["check"]: row for row in doc["rows"]}
    assert checks["bpftrace"]["status"] == "fail"
    assert "apt-get install bpftrace" in checks["bpftrace"]["fix"]
    assert code != 0
    assert set(doc["meta"]["blocked_tools"]) >= {"lwlocks", "flame", "clog-reads"}


def test_doctor_table_names_the_blocked_tools(cluster: PgCluster, tmp_path: Path) -> None:
    done = run_pgprobe(["doctor", *cluster.conn_args], env={"PATH": str(tmp_path)})
    assert done.returncode != 0
    assert "bpftrace not found" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith("not ready: these tools cannot run")


def test_doctor_says_what_runs_on_each_build(
    pg_build: PgBuild, build_cluster: PgCluster, tracing: None, tested_on: Recorder
) -> None:
    """Per build: the probes, frame pointers and symbols it has, and what runs in part."""
    code, doc = doctor(build_cluster)
    checks = {row["check"]: row for row in doc["rows"]}
    assert checks["postgresql version"]["detail"].startswith(pg_build.version)
    assert (checks["usdt probes"]["status"] == "ok") == pg_build.has_usdt
    assert (checks["frame pointers"]["status"] == "ok") == pg_build.frame_pointers
    assert (checks["symbols"]["status"] == "ok") == (not pg_build.stripped)
    if pg_build.has_usdt:
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
        "ready in part: runs here: clog-reads, flame, hot, waits; lwlocks LWLock sleeps from "
        "the scheduler, not waits; triage without its LWLock table"
    ), last
    tested_on("doctor", "ready in part (lwlocks: sleeps)")
