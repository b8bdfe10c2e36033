"""The demo: a throwaway cluster under a load with a known problem, and pgprobe on it.

The problem: clog (pg_xact) buffer thrashing. The cluster has shared_buffers =
128kB, so few pg_xact buffers (4 before PostgreSQL 17, 16 from 17: the xid range
is sized from the server's own count); after a few hundred thousand transactions,
eight clients look up the status of random old transactions (as visibility
checks of unhinted rows do), while eight more run pgbench's TPC-B-like load.
`pgprobe lwlocks` shows the waits, `pgprobe triage` writes the report and its
findings name the SLRU reads. --pg picks the build (tests/conftest.py's ids:
14, 15-debian, 16, 17, 18); on a build without USDT probes lwlocks says so and
the demo goes on. scripts/samples.py runs every command on the same load.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pgprobe import pgbuilds
from pgprobe.sandbox import PgCluster

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT / "tests"))

import slru_workload  # noqa: E402  (the tests' proven SLRU workload)


def show(argv: list[str]) -> int:
    print(f"\n$ {shlex.join(['pgprobe', *argv[3:]])}", flush=True)
    return subprocess.call(argv)


@contextmanager
def thrashing_cluster(build: pgbuilds.PgBuild, seconds: int) -> Iterator[PgCluster]:
    """A throwaway cluster of `build` under the demo's load for `seconds`, then removed."""
    print(f"starting a throwaway cluster of {build.describe()}, shared_buffers=128kB", flush=True)
    settings = {**slru_workload.CLUSTER_SETTINGS, "max_connections": "100"}
    with (
        PgCluster(name="pgprobe-demo", settings=settings, bindir=build.bindir) as pg,
        tempfile.TemporaryDirectory() as tmp,
    ):
        init = pg.pgbench("-i", "-q", "-s", "2")
        init.communicate()
        with pg.connect() as conn:
            buffers = slru_workload.xact_buffers(conn)
            first, last = slru_workload.burn_xids(
                pg.conninfo, slru_workload.xact_burn_size(conn) * 2
            )
        script = Path(tmp) / "clog_lookups.sql"
        script.write_text(slru_workload.xact_lookup_pgbench_script(first, last))
        print(f"cluster at {pg.root} (port {pg.port}); {buffers} pg_xact buffers; "
              f"burned xids {first}..{last}")  # fmt: skip
        print("load: pgbench -c 8 (TPC-B-like) + pgbench -c 8 looking up old xids", flush=True)
        runtime = str(seconds)
        loads = [
            pg.pgbench("-c", "8", "-j", "1", "-T", runtime),
            pg.pgbench("-n", "-c", "8", "-j", "1", "-T", runtime, "-f", str(script)),
        ]
        try:
            time.sleep(2)
            yield pg
        finally:
            for load in loads:
                load.terminate()
                load.communicate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-d", "--duration", type=int, default=15, help="seconds of triage")
    parser.add_argument("-o", "--output", default="pgprobe-demo-report.html", help="the report")
    parser.add_argument("--pg", default="15-debian", help="the PostgreSQL build (default Debian's)")
    args = parser.parse_args()
    try:
        (build,) = pgbuilds.select(args.pg)
    except ValueError as exc:
        parser.error(str(exc))
    # lwlocks' 5 s, and triage's parts attaching one after the other (time model last)
    with thrashing_cluster(build, args.duration + 120) as pg:
        pgprobe = [sys.executable, "-m", "pgprobe"]
        rc = show([*pgprobe, "lwlocks", *pg.conn_args, "-d", "5"])
        if not build.has_usdt:
            rc = 0  # lwlocks said in one line why it cannot run; the rest can
        rc = rc or show([*pgprobe, "triage", *pg.conn_args, "-d", str(args.duration),
                         "-o", args.output])  # fmt: skip
    print("\ncluster stopped and removed.")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
