"""`pgprobe doctor` on this machine: kprobes missing, everything pgprobe needs present."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import run_pgprobe

from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration

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
    assert doc["meta"] == {"ready": True, "blocked_tools": []}
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
