"""``pgprobe hot``: options, and the run: capture -> rows -> table or JSON."""

from __future__ import annotations

import argparse
from typing import Any

from pgprobe.tools import common, profiling
from pgprobe.tools.hot.records import NAME, hot_rows
from pgprobe.tools.hot.view import show

DEFAULT_TOP = 25


top_value = common.bounded(int, 0)  # 0: all rows


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        NAME,
        help="the functions backends spend their CPU in (self and total samples)",
        description="Sample the on-CPU stacks of PostgreSQL processes and rank the "
        "functions by self samples (on CPU themselves) and total samples (on the stack).",
    )
    profiling.add_profile_arguments(parser)
    parser.add_argument("--lib", action="store_true", help="one row per module (library)")
    parser.add_argument(
        "--top",
        type=top_value,
        default=DEFAULT_TOP,
        metavar="N",
        help=f"show the first N rows (default {DEFAULT_TOP}; 0: all)",
    )
    parser.add_argument(
        "--sort",
        choices=["self", "total"],
        default="self",
        help="rank by self samples (default) or by total samples",
    )
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    profile = profiling.collect(ns)
    rows = hot_rows(profile.stacks, by_module=ns.lib, sort=ns.sort)
    shown = rows[: ns.top] if ns.top else rows
    meta = profile.meta(group="module" if ns.lib else "function", sort=ns.sort, top=ns.top)
    if ns.json:
        common.print_json(NAME, meta, [r.as_json() for r in shown])
    else:
        show(profile, meta, rows, shown, by_module=ns.lib, sort=ns.sort)
    profiling.print_warnings(profile)
    return 0
