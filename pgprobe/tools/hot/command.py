"""``pgprobe hot``: options, and the run: capture -> rows -> table or JSON."""

from __future__ import annotations

import argparse
from typing import Any

from pgprobe.tools import bystatement, common, profiling
from pgprobe.tools.hot.records import NAME, PartRows, hot_rows, part_rows
from pgprobe.tools.hot.view import show, show_parts

DEFAULT_TOP = 25
MAX_PARTS = 20  # statements shown with --by query (the rest said in one line)


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
    bystatement.add_arguments(parser, by=())
    parser.set_defaults(run=run)


def run(ns: argparse.Namespace) -> int:
    profile = profiling.collect(ns)
    if ns.by == "query":
        return run_by_query(ns, profile)
    rows = hot_rows(profile.stacks, by_module=ns.lib, sort=ns.sort)
    shown = rows[: ns.top] if ns.top else rows
    meta = profile.meta(group="module" if ns.lib else "function", sort=ns.sort, top=ns.top)
    if ns.json:
        common.print_json(NAME, meta, [r.as_json() for r in shown])
    else:
        show(profile, meta, rows, shown, by_module=ns.lib, sort=ns.sort)
    profiling.print_warnings(profile)
    return 0


def run_by_query(ns: argparse.Namespace, profile: profiling.Profile) -> int:
    """--by query: each statement's functions, the statement with most samples first."""
    parts = part_rows(profile, by_module=ns.lib, sort=ns.sort)
    meta = profile.meta(group="module" if ns.lib else "function", sort=ns.sort, top=ns.top,
                        by="query", statements=len(parts))  # fmt: skip
    shown = parts[:MAX_PARTS]
    if ns.json:
        common.print_json(NAME, meta, [row for p in shown for row in part_json(p, ns.top)])
    else:
        show_parts(profile, meta, shown, top=ns.top, by_module=ns.lib, sort=ns.sort)
    if len(parts) > len(shown):
        rest = parts[len(shown) :]
        common.warn(
            f"{len(rest)} statements with fewer samples left out "
            f"({sum(p.samples for p in rest):,} samples): --query-id ID shows one"
        )
    profiling.print_warnings(profile)
    return 0


def part_json(part: PartRows, top: int) -> list[dict[str, Any]]:
    rows = part.rows[:top] if top else part.rows
    head = {"kind": part.kind, "query_id": part.query_id, "statement": part.name,
            "statement_samples": part.samples}  # fmt: skip
    return [{**head, **r.as_json()} for r in rows]
