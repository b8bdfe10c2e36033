"""Run pgprobe exactly as `python -m pgprobe ARGS` does, and write its resource usage at exit.

The benchmark runs tools as `python -m bench.runtool TOOL ...` so that it learns
pgprobe's own peak RSS: os.wait4() on the pgprobe process reports the larger of
pgprobe's and bpftrace's (a waited-for child's) peaks, but getrusage(RUSAGE_SELF)
inside the process is pgprobe's alone, and RUSAGE_CHILDREN's peak is bpftrace's.
The usage goes, as JSON, to the file named by $PGPROBE_BENCH_RUSAGE.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys

ENV = "PGPROBE_BENCH_RUSAGE"


def _report() -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    usage = {
        "self_maxrss_kib": me.ru_maxrss,
        "self_cpu_s": me.ru_utime + me.ru_stime,
        "children_maxrss_kib": kids.ru_maxrss,
        "children_cpu_s": kids.ru_utime + kids.ru_stime,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(usage, f)


def main() -> None:
    atexit.register(_report)
    from pgprobe.cli import main as pgprobe_main

    raise SystemExit(pgprobe_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
