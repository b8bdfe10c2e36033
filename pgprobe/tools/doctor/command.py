"""`pgprobe doctor` on the command line: run the checks, print them, exit 0 when ready."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from pgprobe import discover
from pgprobe.tools import common
from pgprobe.tools.doctor import view
from pgprobe.tools.doctor.machine import (
    check_bpftrace,
    check_btf,
    check_compiled_lwlocks,
    check_compiled_sampler,
    check_compiled_slru,
    check_compiled_waits,
    check_root,
    check_tracefs,
    try_probe_types,
)
from pgprobe.tools.doctor.records import NEEDS, Check, assess, spare
from pgprobe.tools.doctor.server import (
    check_backend_state_address,
    check_binary,
    check_version,
    check_wait_event_address,
    default_binary,
    find_cluster,
)

NAME = "doctor"
EXIT_NOT_READY = 1


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="check that tracing works here, with the fix for what does not",
        description="Check privileges, bpftrace, kernel features (tried for real), the "
        "server binary (USDT probes, frame pointers, symbols), the PostgreSQL version and "
        "the connection. Exit 0 when every tool can run.",
    )
    common.add_connection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    checks = diagnose(common.conn_options(ns))
    blocked, partial = assess(checks)
    if ns.json:
        meta = {"ready": not blocked, "blocked_tools": blocked, "partial_tools": sorted(partial)}
        print(json.dumps({"tool": NAME, "meta": meta, "rows": [asdict(c) for c in checks]}))
    else:
        view.show(checks, blocked, partial)
    return EXIT_NOT_READY if blocked else 0


def diagnose(opts: discover.ConnOptions) -> list[Check]:
    checks = [check_root(), *check_bpftrace(), check_btf(), check_tracefs(),
              check_compiled_waits(), check_compiled_sampler(),
              check_compiled_slru(), check_compiled_lwlocks()]  # fmt: skip
    cluster, conn_check = find_cluster(opts)
    binary = cluster.binary if cluster else default_binary()
    root_ok = checks[0].status == "ok"
    tracer_ok = root_ok and checks[1].status == "ok"
    checks += try_probe_types(binary, tracer_ok)
    checks += check_binary(binary)
    checks.append(check_version(cluster, binary))
    checks.append(check_wait_event_address(cluster))
    checks.append(check_backend_state_address(cluster))
    checks.append(conn_check)
    for c in checks:
        if c.status == "fail" and not c.affects:
            c.affects = list(NEEDS.get(c.check, ()))
    spare(checks)
    return checks
