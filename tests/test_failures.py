"""Every user error is one line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import need, run_pgprobe

from pgprobe.errors import EXIT_CONNECT, EXIT_ENV, EXIT_TARGET, EXIT_TRACER, EXIT_USAGE
from pgprobe.sandbox import PgCluster, pg_bindir
from pgprobe.tools import common


def assert_one_line_error(done: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stderr)
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert done.stdout == ""


# -- bad options: no cluster needed ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["lwlocks", "-d", "abc"], "not a number of seconds"),
        (["lwlocks", "-d", "0"], "must be more than 0 and at most 86400 seconds: 0"),
        (["lwlocks", "-d", "90000"], "must be more than 0 and at most 86400 seconds"),
        (["lwlocks", "--interval", "0"], "must be greater than 0"),
        (["lwlocks", "--pid", "-3"], "must be greater than 0"),
        (["lwlocks", "--pid", "12ab"], "not a whole number"),
        (["lwlocks", "--pid", "99999999"], "not a valid pid"),
        (["lwlocks", "--by", "tranche"], "invalid choice"),
        (["lwlocks", "--bogus"], "unrecognized arguments"),
        (["lwlocks", "--source", "perf"], "invalid choice"),
        (["nosuchtool"], "invalid choice"),
        (["lwlocks", "-p", "http"], "not a whole number"),
    ],
)
def test_bad_options(args: list[str], needle: str) -> None:
    assert_one_line_error(run_pgprobe(args), EXIT_USAGE, needle)


@pytest.mark.parametrize(
    ("check", "text", "said"),
    [
        (common.bounded(int, 1, 10, unit="Hz"), "11", "must be between 1 and 10 Hz: 11"),
        (common.bounded(int, 1, 10, unit="Hz"), "1.5", "not a whole number of Hz: '1.5'"),
        (common.bounded(float, 0.0, 5.0, low_open=True), "0", "more than 0 and at most 5: 0"),
        (common.bounded(float, 0.0, 5.0), "nan", "must be between 0 and 5: nan"),
        (common.bounded(int, 0), "-1", "must be 0 or more: -1"),
    ],
)
def test_bounded_numbers_say_what_they_must_be(
    check: Callable[[str], float], text: str, said: str
) -> None:
    """common.bounded, every tool's number type: the bounds (NaN is never within) in words."""
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
        check(text)
    assert check("1") == 1


def test_interval_longer_than_duration() -> None:
    need(os.geteuid() == 0, "the root check comes first")
    done = run_pgprobe(["lwlocks", "-d", "2", "--interval", "5"])
    assert_one_line_error(done, EXIT_USAGE, "--interval 5 is longer than the duration")


# -- the machine ----------------------------------------------------------------------------


def test_not_root() -> None:
    done = run_pgprobe(["lwlocks", "-d", "1"], unprivileged=True)
    assert_one_line_error(done, EXIT_ENV, "needs root", "sudo")


def test_bpftrace_missing(tmp_path: Path) -> None:
    """Asked for (the commands run from their compiled objects without it)."""
    need(os.geteuid() == 0, "the root check comes first")
    env = {"PATH": str(tmp_path), "PGPROBE_BPFTRACE": ""}
    done = run_pgprobe(["lwlocks", "-d", "1", "--engine", "bpftrace"], env=env)
    assert_one_line_error(done, EXIT_ENV, "bpftrace not found", "apt-get install bpftrace")


# -- the server -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_cluster(tracing: None) -> Iterator[PgCluster]:
    with PgCluster(name="pgprobe-other") as pg:
        yield pg


def test_connection_refused(tracing: None) -> None:
    done = run_pgprobe(["lwlocks", "-h", "/nonexistent", "-p", "1", "-d", "1"])
    assert_one_line_error(done, EXIT_CONNECT, "cannot connect to PostgreSQL")


def test_auth_failed_does_not_echo_the_password(tracing: None) -> None:
    with PgCluster(name="pgprobe-auth") as pg:
        pg.sql("CREATE ROLE probe LOGIN PASSWORD 'right-secret'")
        pg.write_config("pg_hba.conf", "local all postgres trust\nlocal all all scram-sha-256\n")
        pg.sql("SELECT pg_reload_conf()")
        done = run_pgprobe(
            ["lwlocks", "-h", str(pg.root), "-p", str(pg.port), "-U", "probe", "-d", "1"],
            env={"PGPASSWORD": "wrong-secret-123"},
        )
    assert_one_line_error(done, EXIT_CONNECT, "cannot connect", "password authentication failed")
    assert "wrong-secret-123" not in done.stderr


def test_pid_that_does_not_exist(cluster: PgCluster, tracing: None) -> None:
    pid = _unused_pid()
    done = run_pgprobe(["lwlocks", *cluster.conn_args, "--pid", str(pid), "-d", "1"])
    assert_one_line_error(done, EXIT_TARGET, f"pid {pid} does not exist")


def test_pid_that_is_not_postgres(cluster: PgCluster, tracing: None) -> None:
    done = run_pgprobe(["lwlocks", *cluster.conn_args, "--pid", str(os.getpid()), "-d", "1"])
    assert_one_line_error(done, EXIT_TARGET, f"pid {os.getpid()} is not a PostgreSQL process")


def test_pid_of_another_cluster(cluster: PgCluster, other_cluster: PgCluster) -> None:
    foreign = other_cluster.postmaster_pid
    done = run_pgprobe(["lwlocks", *cluster.conn_args, "--pid", str(foreign), "-d", "1"])
    assert_one_line_error(done, EXIT_TARGET, f"pid {foreign} belongs to another PostgreSQL cluster")


def test_filters_that_match_nothing(cluster: PgCluster, tracing: None) -> None:
    done = run_pgprobe(["lwlocks", *cluster.conn_args, "--application", "no-such-app", "-d", "1"])
    assert_one_line_error(done, EXIT_TARGET, "no backend matches")


def test_server_without_usdt_probes(tracing: None) -> None:
    """A real server whose binary lost its probe notes.

    lwlocks' default source (the scheduler's) needs none; asked for the probes (--source
    usdt), it names the missing probe.
    """
    need(shutil.which("objcopy") is not None, "objcopy (binutils) is needed to strip the notes")
    with tempfile.TemporaryDirectory(prefix="pgprobe-noprobes-") as tmp:
        binary = _postgres_without_probes(Path(tmp))
        with PgCluster(name="pgprobe-noprobes", postgres_binary=binary) as pg:
            fallback = run_pgprobe(["lwlocks", *pg.conn_args, "-d", "1", "--json"])
            done = run_pgprobe(["lwlocks", *pg.conn_args, "-d", "1", "--source", "usdt"])
    assert fallback.returncode == 0, fallback.stderr
    assert json.loads(fallback.stdout)["meta"]["source"] == "sched_switch"
    assert_one_line_error(done, EXIT_ENV, "built without --enable-dtrace", "still works: waits")


def _postgres_without_probes(tmp: Path) -> Path:
    """A copy of the installed server without .note.stapsdt, laid out so it finds its files.

    PostgreSQL finds share/ and lib/ relative to its own binary, so the copy sits in a
    tree that mirrors the installation, with links to the real directories.
    """
    real_bin = pg_bindir()
    version_dir = real_bin.parent  # /usr/lib/postgresql/15
    tree = tmp / "usr"
    bindir = tree / "lib" / "postgresql" / version_dir.name / "bin"
    bindir.mkdir(parents=True)
    (bindir.parent / "lib").symlink_to(version_dir / "lib")
    share = Path("/usr/share/postgresql") / version_dir.name
    (tree / "share" / "postgresql").mkdir(parents=True)
    (tree / "share" / "postgresql" / version_dir.name).symlink_to(share)
    binary = bindir / "postgres"
    subprocess.run(
        ["objcopy", "--remove-section=.note.stapsdt", str(real_bin / "postgres"), str(binary)],
        check=True,
    )
    # The server runs as the postgres user: it must reach the copy.
    for directory in (tmp, tree, tree / "lib", bindir.parent.parent, bindir.parent, bindir,
                      tree / "share", tree / "share" / "postgresql"):  # fmt: skip
        directory.chmod(0o755)
    return binary


def _unused_pid() -> int:
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def test_no_traceback_for_internal_paths() -> None:
    """`python -m pgprobe` with no command is a usage error: the short help that says where
    to start (issue 32), no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "pgprobe"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith("usage: pgprobe") and "start here:" in done.stderr
    assert "Traceback" not in done.stderr


def test_ctrl_c_while_finishing_is_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C after the capture (unwinding, writing) cuts the output: one line says so."""
    from pgprobe import cli

    def interrupted(ns: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    parser = cli.build_parser("hot")
    parse = parser.parse_args
    monkeypatch.setattr(
        parser, "parse_args", lambda a: argparse.Namespace(**{**vars(parse(a)), "run": interrupted})
    )
    monkeypatch.setattr(cli, "build_parser", lambda only: parser)
    assert cli.main(["hot", "-d", "1"]) == 130
    assert capsys.readouterr().err == "pgprobe: interrupted: the output is incomplete\n"


def test_tracer_error_is_surfaced(cluster: PgCluster, tracing: None) -> None:
    """bpftrace's own complaint, in one line (here: a limit it enforces on its environment)."""
    done = run_pgprobe(
        ["lwlocks", "--source", "usdt", "--engine", "bpftrace", *cluster.conn_args, "-d", "1"],
        env={"BPFTRACE_STRLEN": "9999"},
    )
    assert_one_line_error(done, EXIT_TRACER, "bpftrace failed", "BPFTRACE_STRLEN")


@pytest.mark.parametrize(("version_num", "version"), [(120017, "12.17"), (100023, "10.23")])
def test_servers_before_13_are_refused_with_the_reason(version_num: int, version: str) -> None:
    from pgprobe.discover import Cluster, Targets
    from pgprobe.errors import PgprobeError
    from pgprobe.tools import lwlocks

    old = Cluster(postmaster_pid=1, binary="/nonexistent", version_num=version_num,
                  version=version, data_directory=None)  # fmt: skip
    with pytest.raises(PgprobeError) as caught:
        lwlocks.check_server(Targets(old, [], whole_cluster=True))
    assert f"this server is {version}" in caught.value.message
    assert "13 and later" in caught.value.message
