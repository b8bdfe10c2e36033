"""The demo: a throwaway cluster, a pgbench load, and `pgprobe lwlocks` on it."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time

from pgprobe.sandbox import PgCluster


def show(argv: list[str]) -> int:
    print(f"\n$ {shlex.join(['pgprobe', *argv[3:]])}", flush=True)
    return subprocess.call(argv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-d", "--duration", type=int, default=5, help="seconds to trace")
    args = parser.parse_args()
    print("starting a throwaway PostgreSQL cluster...", flush=True)
    with PgCluster(name="pgprobe-demo") as pg:
        init = pg.pgbench("-i", "-q", "-s", "2")
        init.communicate()
        print(f"cluster at {pg.root} (port {pg.port}); load: pgbench -c 8 -j 2", flush=True)
        bench = pg.pgbench("-c", "8", "-j", "2", "-T", str(args.duration * 3 + 30))
        try:
            time.sleep(2)
            pgprobe = [sys.executable, "-m", "pgprobe"]
            rc = show([*pgprobe, "backends", *pg.conn_args])
            rc = rc or show([*pgprobe, "lwlocks", *pg.conn_args, "-d", str(args.duration)])
        finally:
            bench.terminate()
            bench.communicate()
    print("\ncluster stopped and removed.")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
