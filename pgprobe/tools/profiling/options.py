"""The capture options of flame and hot (-F, --kernel, --unwind) and their limits."""

from __future__ import annotations

import argparse

from pgprobe.engines.base import (
    MapSpec,
)
from pgprobe.tools import aliases, common
from pgprobe.unwind import choose

SCRIPT = "profile"  # bpf/profile.bt
DEFAULT_HZ = 99
MAX_HZ = 10_000
DEFAULT_DURATION_S = 10.0
MAPS = (
    MapSpec("stacks", ("int", "stack")),
    MapSpec("kstacks", ("int", "stack", "stack")),
    MapSpec("samples", ()),
    # with --by query / --query-id: the backend's st_state and st_query_id beside the pid
    MapSpec("qstacks", ("int", "int", "int", "stack")),
    MapSpec("qkstacks", ("int", "int", "int", "stack", "stack")),
)
# Distinct (pid, stack) keys the map may hold: at most one per sample, so
# duration x Hz x CPUs (with headroom) loses nothing; bounded because bpftrace
# preallocates the map.
MIN_MAP_KEYS = 16_384
MAX_MAP_KEYS = 1_048_576
# Above this share of unresolved frames in the server binary, say how to fix it.
UNRESOLVED_WARN_PCT = 5.0
# New children of the postmaster are looked for this often (at least).
SCAN_INTERVAL_S = 0.5


hz_value = common.bounded(int, 1, MAX_HZ, unit="Hz")


def add_profile_arguments(parser: argparse.ArgumentParser) -> None:
    """Connection, targets, -d, --json, --engine, and -F / --kernel."""
    common.add_tracing_arguments(parser, default_duration=DEFAULT_DURATION_S)
    parser.add_argument(
        "-F",
        "--frequency",
        dest="hz",
        type=hz_value,
        default=DEFAULT_HZ,
        metavar="HZ",
        help=f"samples per second per CPU (default {DEFAULT_HZ}; 1-{MAX_HZ})",
    )
    add_hz_alias(parser)
    parser.add_argument(
        "--kernel", action="store_true", help="kernel stacks too (frames named from kallsyms)"
    )
    add_unwind_argument(parser)


def add_hz_alias(parser: argparse.ArgumentParser) -> None:
    """--hz, the old spelling of -F/--frequency (hidden)."""
    aliases.add_alias(parser, "--hz", dest="hz", type=hz_value, metavar="HZ")


def add_unwind_argument(parser: argparse.ArgumentParser) -> None:
    """--unwind fp|dwarf|auto (flame, hot, and triage's CPU part)."""
    parser.add_argument(
        "--unwind",
        choices=choose.MODES,
        default="auto",
        help="how user stacks are walked: fp (frame pointers, in the kernel: cheapest), "
        "dwarf (perf copies the stack, pgprobe unwinds it with .eh_frame: whole stacks "
        "on builds without frame pointers), auto (default: dwarf when the server or a "
        "library it uses lacks frame pointers)",
    )
