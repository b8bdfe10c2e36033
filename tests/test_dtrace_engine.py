"""`pgprobe lwlocks --engine dtrace` end to end, with a stand-in dtrace that replays a fixture.

No DTrace exists here, so a small program named dtrace (tests/fixtures/dtrace/
fake_dtrace.py) goes on PATH: it checks and records its command line and
prints a fixture written to the d/ scripts' documented layout, the END part
only after SIGINT, as dtrace does. Everything else is real: option parsing,
discovery of a throwaway cluster (SQL and /proc), the engine's process
handling, signals, parsing, the lwlocks maths and both renderers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import CHECKOUT, need, run_pgprobe

from pgprobe.discover import Cluster, Targets
from pgprobe.engines.base import Event, RunInfo, Snapshot
from pgprobe.engines.dtrace import DtraceOutput
from pgprobe.errors import EXIT_ENV
from pgprobe.sandbox import PgCluster
from pgprobe.tools import lwlocks

FIXTURES = Path(__file__).parent / "fixtures" / "dtrace"


@dataclass
class FakeDtrace:
    bindir: Path
    argv_log: Path

    def env(self, output: str = "lwlock_wait.out", **extra: str) -> dict[str, str]:
        return {
            "PATH": f"{self.bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            # the stand-in, not a real DTrace this machine may have (scripts/setup-dtrace)
            "PGPROBE_DTRACE": str(self.bindir / "dtrace"),
            "FAKE_DTRACE_OUTPUT": str(FIXTURES / output),
            "FAKE_DTRACE_ARGV": str(self.argv_log),
            **extra,
        }

    def argv(self) -> list[str]:
        recorded: list[str] = json.loads(self.argv_log.read_text())
        return recorded


def install_fake_dtrace(directory: Path) -> FakeDtrace:
    """An executable named dtrace in directory/bin that runs fake_dtrace.py."""
    bindir = directory / "bin"
    bindir.mkdir()
    exe = bindir / "dtrace"
    exe.write_text(f"#!{sys.executable}\n" + (FIXTURES / "fake_dtrace.py").read_text())
    exe.chmod(0o755)
    return FakeDtrace(bindir, directory / "argv.json")


@pytest.fixture
def fake_dtrace(tmp_path: Path) -> FakeDtrace:
    return install_fake_dtrace(tmp_path)


@pytest.fixture
def pg(cluster: PgCluster) -> PgCluster:
    need(os.geteuid() == 0, "the DTrace engine's preflight wants root, as dtrace does")
    return cluster


def expected_rows(fixture: str, by_pid: bool = False) -> list[list[dict[str, Any]]]:
    """The rows of each snapshot, computed in-process from the same fixture."""
    info = RunInfo()
    parser = DtraceOutput({m.name: m for m in lwlocks.MAPS}, info)
    events: list[Event] = []
    for line in (FIXTURES / fixture).read_text().splitlines():
        events.extend(parser.feed(line))
    events.extend(parser.finish())
    cluster = Cluster(postmaster_pid=1, binary="/x", version_num=150018, version="15.18",
                      data_directory=None)  # fmt: skip
    targets = Targets(cluster, [], whole_cluster=True)
    out = []
    for snap in events:
        assert isinstance(snap, Snapshot)
        rows = lwlocks.rows(lwlocks.records(snap), targets, by_pid)
        out.append([_without_names(r.as_json()) for r in rows])
    return out


def _without_names(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("backend_type", "application_name")}


def lwlocks_dtrace(pg: PgCluster, fake: FakeDtrace, *extra: str, **env: str) -> Any:
    return run_pgprobe(
        ["lwlocks", *pg.conn_args, "--engine", "dtrace", *extra], env=fake.env(**env)
    )


# -- the whole path ---------------------------------------------------------------------------


def test_lwlocks_json_through_dtrace(pg: PgCluster, fake_dtrace: FakeDtrace) -> None:
    done = lwlocks_dtrace(pg, fake_dtrace, "-d", "1", "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    doc = json.loads(done.stdout)
    assert doc["tool"] == "lwlocks"
    meta = doc["meta"]
    assert meta["engine"] == "dtrace" and meta["engine_version"] == "Sun D 1.13"
    assert meta["postmaster_pid"] == pg.postmaster_pid
    assert meta["final"] is True and meta["snapshot_time"] == "23:44:27"
    assert meta["lost_events"] == 0 and meta["failed_map_updates"] == 0
    assert 0.9 <= meta["duration_s"] <= 4
    # dtrace -q -s d/lwlock_wait.d BINARY POSTMASTER BY_PID INTERVAL ONLY_PID
    argv = fake_dtrace.argv()
    assert argv[:2] == ["-q", "-L"]
    assert Path(argv[2]).resolve() == (CHECKOUT / "d" / "lib" / "fds").resolve()
    assert argv[3] == "-s"
    assert Path(argv[4]).resolve() == (CHECKOUT / "d" / "lwlock_wait.d").resolve()
    # the last one: --max-events-per-sec's default (the guard)
    assert argv[5:] == [meta["server_binary"], str(pg.postmaster_pid), "0", "0", "0", "1000"]
    rows = doc["rows"]
    (expected,) = expected_rows("lwlock_wait.out")
    assert rows == expected
    top = rows[0]
    assert (top["tranche"], top["mode"], top["waits"]) == ("WALWrite", "Exclusive", 1677)
    assert top["total_us"] == 116711.187 and top["max_us"] == 1074.123
    assert abs(sum(r["share_pct"] for r in rows) - 100) < 0.5


def test_lwlocks_table_through_dtrace(pg: PgCluster, fake_dtrace: FakeDtrace) -> None:
    done = lwlocks_dtrace(pg, fake_dtrace, "-d", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("LWLock waits: whole cluster")
    assert lines[1].split()[:3] == ["TRANCHE", "MODE", "WAITS"]
    assert lines[2].split()[:3] == ["WALWrite", "Exclusive", "1,677"]
    assert len(lines) == 2 + 11
    assert "\x1b[" not in done.stdout


def test_interval_by_pid_through_dtrace(pg: PgCluster, fake_dtrace: FakeDtrace) -> None:
    done = lwlocks_dtrace(
        pg,
        fake_dtrace,
        *("-d", "2", "--interval", "1", "--by", "pid", "--json"),
        output="lwlock_wait_by_pid_interval.out",
    )
    assert done.returncode == 0, done.stderr
    docs = [json.loads(line) for line in done.stdout.splitlines()]
    assert [d["meta"]["final"] for d in docs] == [False, False, True]
    assert [d["meta"]["snapshot_time"] for d in docs] == ["23:44:19", "23:44:21", "23:44:22"]
    assert fake_dtrace.argv()[6:] == [str(pg.postmaster_pid), "1", "1", "0", "1000"]
    expected = expected_rows("lwlock_wait_by_pid_interval.out", by_pid=True)
    assert [[_without_names(r) for r in d["rows"]] for d in docs] == expected
    assert all("backend_type" in r for d in docs for r in d["rows"])


def test_losses_are_reported(pg: PgCluster, fake_dtrace: FakeDtrace) -> None:
    stderr = str(FIXTURES / "drops.stderr")
    done = lwlocks_dtrace(pg, fake_dtrace, "-d", "1", "--json", FAKE_DTRACE_STDERR=stderr)
    assert done.returncode == 0, done.stderr
    meta = json.loads(done.stdout)["meta"]
    assert meta["lost_events"] == 24 and meta["failed_map_updates"] == 5
    assert any(w.startswith("2 errors in probe actions") for w in meta["warnings"])
    table = lwlocks_dtrace(pg, fake_dtrace, "-d", "1", FAKE_DTRACE_STDERR=stderr)
    assert "pgprobe: warning: 24 events lost" in table.stderr
    assert "5 updates refused" in table.stderr


def test_ctrl_c_prints_what_was_collected(pg: PgCluster, fake_dtrace: FakeDtrace) -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgprobe",
            "lwlocks",
            *pg.conn_args,
            "--engine",
            "dtrace",
            "-d",
            "60",
            "--json",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=CHECKOUT,
        env={**os.environ, **fake_dtrace.env()},
    )
    time.sleep(3)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    doc = json.loads(out)
    assert doc["meta"]["interrupted"] is True
    assert doc["meta"]["duration_s"] < 10
    assert len(doc["rows"]) == 11


def test_dtrace_gets_one_sigint_and_time_to_print(pg: PgCluster, fake_dtrace: FakeDtrace) -> None:
    """A second SIGINT makes dtrace "impatient": it stops printing and END's output is lost.

    Printing can take seconds (naming thousands of user stacks), so the engine
    must not repeat SIGINT the way bpftrace needs it.
    """
    done = lwlocks_dtrace(pg, fake_dtrace, "-d", "1", "--json", FAKE_DTRACE_END_DELAY="3.5")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["rows"]) == 11


def test_hot_and_flame_through_dtrace(
    pg: PgCluster, fake_dtrace: FakeDtrace, tmp_path: Path
) -> None:
    """Stacks named by DTrace (NamedStack) through the profiling tools."""
    env = fake_dtrace.env(output="profile_hotuser.out")
    done = run_pgprobe(["hot", *pg.conn_args, "--engine", "dtrace", "-d", "1", "--json"], env=env)
    assert done.returncode == 0, done.stderr
    # dtrace -q -L d/lib/fds -s d/profile.d HZ POSTMASTER ONLY_PID KSTACKS INTERVAL
    assert fake_dtrace.argv()[5:] == ["99", str(pg.postmaster_pid), "0", "0", "0"]
    doc = json.loads(done.stdout)
    assert doc["meta"]["engine"] == "dtrace" and doc["meta"]["samples"] == 4694
    top = doc["rows"][0]
    assert (top["function"], top["module"], top["self_samples"]) == (
        "hash_bytes_extended",
        "postgres",
        1893 + 702,  # two sample sites in one function
    )
    folded = tmp_path / "cpu.folded"
    args = ["flame", *pg.conn_args, "--engine", "dtrace", "-d", "1", "--folded", "-o", str(folded)]
    done = run_pgprobe(args, env=env)
    assert done.returncode == 0, done.stderr
    stacks = dict(line.rsplit(" ", 1) for line in folded.read_text().splitlines())
    assert sum(int(n) for n in stacks.values()) == 4694
    hot = max(stacks, key=lambda k: int(stacks[k]))
    assert hot.startswith("_start;main;PostmasterMain;ServerLoop;PostgresMain;")
    assert hot.endswith(";hashtext;hash_bytes_extended") and stacks[hot] == "2595"


# -- failures, each in one line ---------------------------------------------------------------


def assert_one_line(done: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stderr)
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("stderr", "needles"),
    [
        ("privileges.stderr", ("additional privileges", "run as root")),
        ("no_provider.stderr", ("does not match any probes", "--enable-dtrace")),
        ("macos_sip.stderr", ("--enable-dtrace", "csrutil enable --without dtrace")),
    ],
)
def test_dtrace_failures(
    pg: PgCluster, fake_dtrace: FakeDtrace, stderr: str, needles: tuple[str, ...]
) -> None:
    done = lwlocks_dtrace(
        pg, fake_dtrace, "-d", "1", FAKE_DTRACE_STDERR=str(FIXTURES / stderr), FAKE_DTRACE_EXIT="1"
    )
    assert_one_line(done, EXIT_ENV, *needles)


def test_dtrace_missing(tmp_path: Path) -> None:
    need(os.geteuid() == 0, "the root check comes first")
    env = {"PATH": str(tmp_path), "PGPROBE_DTRACE": str(tmp_path / "dtrace")}
    done = run_pgprobe(["lwlocks", "--engine", "dtrace", "-d", "1"], env=env)
    assert_one_line(done, EXIT_ENV, "dtrace not found", "--engine bpftrace")


def test_a_dtrace_that_is_not_dtrace(fake_dtrace: FakeDtrace) -> None:
    need(os.geteuid() == 0, "the root check comes first")
    # systemtap-sdt-dev's /usr/bin/dtrace only generates probe headers
    env = fake_dtrace.env(FAKE_DTRACE_VERSION="Usage: dtrace [--help] [-h | -G] [-C [-I<Path>]]")
    done = run_pgprobe(["lwlocks", "--engine", "dtrace", "-d", "1"], env=env)
    assert_one_line(done, EXIT_ENV, "is not DTrace", "--engine bpftrace")


def test_dtrace_needs_root(fake_dtrace: FakeDtrace) -> None:
    done = run_pgprobe(
        ["lwlocks", "--engine", "dtrace", "-d", "1"], env=fake_dtrace.env(), unprivileged=True
    )
    assert_one_line(done, EXIT_ENV, "DTrace needs root", "sudo")
