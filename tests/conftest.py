"""Shared fixtures: root + bpftrace, and a throwaway cluster initialised for pgbench."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from helpers import need

from pgprobe.sandbox import PgCluster, pg_bindir


@pytest.fixture(scope="session")
def tracing() -> None:
    """Root and bpftrace: what every eBPF integration test needs."""
    need(os.geteuid() == 0, "needs root to run bpftrace")
    need(shutil.which("bpftrace") is not None, "bpftrace is not installed")


def _have_postgres() -> bool:
    try:
        return (pg_bindir() / "initdb").exists()
    except (OSError, RuntimeError, ValueError):
        return False


@pytest.fixture(scope="session")
def cluster() -> Iterator[PgCluster]:
    """One throwaway cluster for the session, initialised for pgbench (scale 2)."""
    need(_have_postgres(), "no PostgreSQL server installed (initdb not found)")
    with PgCluster(name="pgprobe-session") as pg:
        init = pg.pgbench("-i", "-q", "-s", "2")
        out, _ = init.communicate(timeout=300)
        assert init.returncode == 0, out
        yield pg
