"""Names from clients, the server and binaries are shown as text, never interpreted (issue 30,
row 3; the rule: pgprobe/render/literal.py).

Real throwaway cluster, real client sessions, the real tools, on a real terminal (a pty,
250 columns, TERM=xterm-256color: rich draws the tables) and piped. The sessions set hostile
``application_name``s (rich markup ``[/x]``, ``[link=...]``, ordinary brackets ``psql [prod]``
and ``a[i]``, ESC and bidi: PostgreSQL 15 and older turn those into ``?`` itself), log in as a
role and into a database whose names hold ESC sequences, a bell, markup and a bidi override,
and run queries that start with such a comment. Function names come from a
/tmp/perf-PID.map (which any local user can write for any pid) naming the LLVM JIT code of
a real backend (``SET jit_above_cost = 0``); a folded file from elsewhere carries raw ones.

What must hold everywhere: exit 0; no ESC sequence, bell or bidi control from a name among
the bytes written (pgprobe's own colour codes on a terminal aside), no OSC 8 link; the names
readable: brackets literally (``psql [prod]``, ``a[i]``, ``[/x]``), control characters as
``\\xNN`` and bidi controls as ``\\uNNNN``. The HTML report and the SVG hold no raw control
character and parse; folded stacks stay one stack a line. JSON keeps the raw values.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import CHECKOUT, cluster_for, need, run_pgprobe
from psycopg import sql
from slru_workload import burn_xids, provoke_xact_reads, xact_burn_size
from test_clog_reads import wait_attached

from pgprobe.literal import literal
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster
from pgprobe.unwind import choose

pytestmark = [pytest.mark.integration, pytest.mark.once]

BIDI = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: what follows is shown reversed
APPS = (
    "[/x]",
    "[link=http://evil.example/]click",
    "psql [prod]",
    "a[i]",
    "t\x1b]0;pwned\x07\x1b[31mred",
    f"b{BIDI}evil",
)
BRACKETS = ("psql [prod]", "a[i]")  # must appear as they are
ROLE = f"r\x1b]0;pwned\x07[/x]{BIDI}"
DATABASE = "d\x1b[31m[link=http://evil.example/]x"
MARK = f"/* q\x1b]0;pwned\x07\x1b[31m[/x]{BIDI} */"
# The clog-reads workload's application_name: markup, links and brackets at once.
COMBINED = "psql [prod] a[i] [link=http://evil.example/]x[/x]"
JIT_NAME = f"hot[/x]\x1b]0;pwned\x07\x1b[31m[link=http://evil.example/]fn{BIDI}"
# As folded stacks write it: a ";" inside a name would split the frame (pgprobe.stacks.fold).
FOLDED_JIT = literal(JIT_NAME.replace(";", ":"))
JIT_QUERY = f"{MARK} SELECT sum((g * 7 + h % 13) * 3 - g / 5 + h * h) FROM t WHERE g % 3 <> h"
SLEEP_QUERY = f"{MARK} SELECT pg_sleep(0.02) FROM generate_series(1, 50)"

# Bytes that only a name could have put there: OSC (window title, OSC 8 links), the bell,
# a red foreground (rich draws no red here), the bidi override, an 8-bit CSI.
HOSTILE_BYTES = (b"\x1b]", b"\x07", b"\x1b[31m", BIDI.encode(), "\x9b".encode())
# What is not text in a file meant to be read (tab and newline are).
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # pgprobe's own colours and cursor moves (rich)
SVG = "{http://www.w3.org/2000/svg}"


# -- the scene: a cluster, hostile names, sessions -------------------------------------------


@dataclass
class Scene:
    cluster: PgCluster
    evil: psycopg.Connection[Any]  # as ROLE on DATABASE, having run MARK ...
    evil_pid: int
    statements: bool  # pg_stat_statements is loaded


@pytest.fixture(scope="module")
def scene(pg_build: PgBuild, tracing: None) -> Iterator[Scene]:
    lib = pg_build.bindir.parent
    statements = any(lib.rglob("pg_stat_statements.so"))
    settings = {
        "shared_buffers": "1MB",  # 4 pg_xact buffers: the clog-reads workload misses them
        "autovacuum": "off",
        "max_parallel_workers_per_gather": "0",
    }
    if statements:
        settings["shared_preload_libraries"] = "'pg_stat_statements'"
    with cluster_for(pg_build, settings, name="pgprobe-names") as pg:
        with pg.connect() as admin:
            if statements:
                admin.execute("CREATE EXTENSION pg_stat_statements")
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(ROLE)))
            admin.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(DATABASE), sql.Identifier(ROLE)
                )
            )
        idle = [pg.connect(application_name=app) for app in APPS]
        evil = pg.connect(user=ROLE, dbname=DATABASE, application_name=COMBINED)
        evil.execute("CREATE TABLE t AS SELECT g, g % 97 AS h FROM generate_series(1, 300000) g")
        evil.execute("VACUUM ANALYZE t")
        evil.execute(f"{MARK} SELECT 1")
        try:
            yield Scene(pg, evil, evil.info.backend_pid, statements)
        finally:
            for conn in [*idle, evil]:
                conn.close()


@contextmanager
def busy(scene: Scene, query: str) -> Iterator[int]:
    """The hostile session runs `query` in a loop, JIT-compiled, and /tmp/perf-PID.map names
    all of its executable anonymous memory (the JIT code) JIT_NAME; yields its pid."""
    row = scene.evil.execute("SELECT pg_jit_available()").fetchone()
    need(bool(row and row[0]), "this build has no LLVM JIT (llvmjit.so)")
    scene.evil.execute("SET jit_above_cost = 0")
    scene.evil.execute("SET jit_inline_above_cost = -1")  # compile fast: no inlining,
    scene.evil.execute("SET jit_optimize_above_cost = -1")  # no optimization passes
    perf_map = Path(f"/tmp/perf-{scene.evil_pid}.map")
    perf_map.write_text(f"0 {2**47:x} {JIT_NAME}\n", encoding="utf-8")
    stop = threading.Event()

    def loop() -> None:
        with suppress(psycopg.Error):
            while not stop.is_set():
                scene.evil.execute(query)

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    time.sleep(1.0)  # past the first compile
    try:
        yield scene.evil_pid
    finally:
        stop.set()
        scene.cluster.sql(f"SELECT pg_cancel_backend({scene.evil_pid})")
        worker.join(60)
        perf_map.unlink(missing_ok=True)
        scene.evil.execute("RESET ALL")


@contextmanager
def pgbench_per_app(scene: Scene, apps: Sequence[str]) -> Iterator[None]:
    """pgbench -c 2 under each application_name (PGAPPNAME): LWLock waits in every backend."""
    pg = scene.cluster
    init = pg.pgbench("-i", "-q", "-s", "1")
    out, _ = init.communicate(timeout=300)
    assert init.returncode == 0, out
    benches = []
    for app in apps:
        argv = [str(pg.bindir / "pgbench"), "-h", str(pg.root), "-p", str(pg.port),
                "-U", "postgres", "-c", "2", "-T", "600", "postgres"]  # fmt: skip
        benches.append(
            subprocess.Popen(
                argv,
                env={**os.environ, "PGAPPNAME": app},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    time.sleep(1.5)  # let the clients connect
    try:
        yield
    finally:
        for bench in benches:
            bench.terminate()
            bench.wait(timeout=30)


# -- pgprobe on a terminal, pgprobe piped ----------------------------------------------------


class Terminal:
    """pgprobe ARGS with stdout and stderr on a new pty (250x60), as a user runs it; every
    byte it writes to the terminal is kept (a thread drains it, so pgprobe never blocks)."""

    def __init__(self, args: Sequence[str]) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 250, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "250", "LINES": "60"}
        env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgprobe", *args],
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
            cwd=CHECKOUT,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        self.master = master
        self.raw = bytearray()
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                return
            if not chunk:
                return
            self.raw += chunk

    def finish(self, timeout: float = 180, interrupt: bool = False) -> tuple[int, bytes]:
        """(exit code, bytes written); interrupt: Ctrl-C first, as a user ends a capture."""
        if interrupt:
            time.sleep(0.2)
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.reader.join(30)
        os.close(self.master)
        return code, bytes(self.raw)


def on_terminal(args: Sequence[str]) -> bytes:
    code, raw = Terminal(args).finish()
    assert code == 0, raw.decode(errors="replace")[-3000:]
    return raw


def piped(args: Sequence[str]) -> str:
    done = run_pgprobe(args, timeout=180)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def shown_on_terminal(raw: bytes, *expected: str) -> str:
    """The text a terminal shows: no hostile sequence in the bytes, each expected text in it."""
    for bad in HOSTILE_BYTES:
        assert bad not in raw, (bad, raw.decode(errors="replace")[-3000:])
    text = CSI.sub("", raw.decode("utf-8", "replace"))
    for want in expected:
        assert want in text, (want, text[-3000:])
    return text


def shown_piped(out: str, *expected: str) -> str:
    """Piped, pgprobe writes no escape at all, nor a bidi control; each expected text in it."""
    assert not RAW_CONTROL.search(out), out[-3000:]
    for want in expected:
        assert want in out, (want, out[-3000:])
    return out


# -- the tools -------------------------------------------------------------------------------


def test_backends(scene: Scene) -> None:
    args = ["backends", *scene.cluster.conn_args]
    names = [*APPS[:4], literal(ROLE), literal(DATABASE), literal(MARK)]
    shown_on_terminal(on_terminal(args), *names)
    shown_piped(piped(args), *names)
    # JSON is data: the raw values, escaped by the JSON encoder only.
    doc = json.loads(run_pgprobe([*args, "--json"]).stdout)
    rows = doc["rows"]
    assert any(r["usename"] == ROLE and r["datname"] == DATABASE for r in rows), rows
    assert any(r["query"].startswith(MARK) for r in rows), rows
    assert {"[/x]", "psql [prod]", "a[i]"} <= {r["application_name"] for r in rows}


def test_waits_by_pid_and_its_stacks(scene: Scene, tmp_path: Path) -> None:
    """The time model's table (pid, backend type) and the off-CPU stacks of a backend that
    sleeps in pg_sleep called from its JIT code (named JIT_NAME by the perf map)."""
    need(choose.perf_binary() is not None, "perf is not installed (Debian: linux-perf)")
    folded, svg = tmp_path / "waits.folded", tmp_path / "waits.svg"
    with busy(scene, SLEEP_QUERY) as pid:
        base = ["waits", *scene.cluster.conn_args, "--pid", str(pid), "--by", "pid", "-d", "2",
                "--stacks", "--unwind", "dwarf"]  # fmt: skip
        shown_on_terminal(on_terminal([*base, "--format", "folded", "-o", str(folded)]), "PgSleep")
        shown_piped(piped([*base, "-o", str(svg)]), "PgSleep")
    assert_folded(folded.read_text(encoding="utf-8"), FOLDED_JIT)
    assert_svg(svg.read_text(encoding="utf-8"), FOLDED_JIT)


def test_lwlocks_by_pid(scene: Scene, pg_build: PgBuild) -> None:
    """Both sources: the scheduler's (the default) and, where the build has them, the USDT
    probes' (tranche names from the probe's argument)."""
    base = ["lwlocks", *scene.cluster.conn_args, "--by", "pid", "-d", "3"]
    sources = [["--source", "sched"]]
    if pg_build.has_usdt:
        sources.append(["--source", "usdt", "--max-events-per-sec", "0"])
    with pgbench_per_app(scene, APPS[:4]):
        for source in sources:
            shown_on_terminal(on_terminal([*base, *source]), *BRACKETS, "[/x]")
            shown_piped(piped([*base, *source]), *BRACKETS, "[/x]")


def test_clog_reads(scene: Scene) -> None:
    pg = scene.cluster
    with pg.connect(application_name=COMBINED) as conn:
        first, last = burn_xids(pg.conninfo, xact_burn_size(conn))
        args = ["clog-reads", *pg.conn_args, "--pid", str(conn.info.backend_pid), "-d", "60"]
        term = Terminal(args)
        wait_attached(term.proc)
        provoke_xact_reads(conn, first, last)
        code, raw = term.finish(interrupt=True)
        assert code == 0, raw.decode(errors="replace")[-3000:]
        shown_on_terminal(raw, COMBINED)
        probe = subprocess.Popen(
            [sys.executable, "-m", "pgprobe", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=CHECKOUT,
        )
        wait_attached(probe)
        provoke_xact_reads(conn, first, last)
        probe.send_signal(signal.SIGINT)
        out, err = probe.communicate(timeout=60)
        assert probe.returncode == 0, err
        shown_piped(out + err, COMBINED)


def test_hot(scene: Scene) -> None:
    with busy(scene, JIT_QUERY) as pid:
        args = ["hot", *scene.cluster.conn_args, "--pid", str(pid), "-d", "3"]
        shown_on_terminal(on_terminal(args), literal(JIT_NAME))
        shown_piped(piped(args), literal(JIT_NAME))


def test_flame_folded_and_svg(scene: Scene, tmp_path: Path) -> None:
    """Folded stacks of a capture with JIT_NAME frames; an SVG drawn from a folded file from
    elsewhere whose frame names hold raw ESC, bell and bidi characters."""
    with busy(scene, JIT_QUERY) as pid:
        args = ["flame", *scene.cluster.conn_args, "--pid", str(pid), "-d", "2", "--folded"]
        done = run_pgprobe(args, timeout=180)
    assert done.returncode == 0, done.stderr
    shown_piped(done.stderr)
    assert_folded(done.stdout, FOLDED_JIT)
    raw = tmp_path / "raw.folded"
    role = ROLE.replace(";", ":")
    raw.write_text(f"main;{JIT_NAME.replace(';', ':')};leaf 5\nmain;{role} 3\n", "utf-8")
    svg = tmp_path / "raw.svg"
    piped(["flame", "--from", str(raw), "-o", str(svg)])
    assert_svg(svg.read_text(encoding="utf-8"), FOLDED_JIT, literal(role))


def test_triage(scene: Scene, tmp_path: Path) -> None:
    """The summary on a terminal and piped, and the HTML report: the hot JIT function and
    the dominant statement's text (pg_stat_statements) are named in the findings."""
    need(scene.statements, "pg_stat_statements is not in this build")
    reports = tmp_path / "term.html", tmp_path / "piped.html"
    with busy(scene, JIT_QUERY) as pid:
        base = ["triage", *scene.cluster.conn_args, "--pid", str(pid), "-d", "3"]
        term = on_terminal([*base, "-o", str(reports[0])])
        out = piped([*base, "-o", str(reports[1])])
    shown_on_terminal(term, literal(MARK))
    shown_piped(out, literal(MARK))
    for report in reports:
        html = report.read_text(encoding="utf-8")
        bad = RAW_CONTROL.search(html)
        assert bad is None, html[max(0, bad.start() - 200) : bad.end() + 200]
        assert literal(JIT_NAME).replace("://", "&#58;//") in html
        assert literal(MARK) in html


# -- checks of the files ---------------------------------------------------------------------


def assert_folded(text: str, *names: str) -> None:
    """One `frames count` a line, nothing that is not text, the names readable."""
    assert not RAW_CONTROL.search(text), text[-2000:]
    for line in text.splitlines():
        assert re.fullmatch(r".+ \d+", line), line
    for name in names:
        assert name in text, (name, text[-2000:])


def assert_svg(text: str, *names: str) -> None:
    """Well-formed XML with no raw control or bidi character; each name in a frame's text."""
    root = ET.fromstring(text)
    assert not RAW_CONTROL.search(text)
    shown = "\n".join("".join(t.itertext()) for t in root.iter(f"{SVG}title"))
    for name in names:
        assert name in shown, (name, shown[-2000:])
