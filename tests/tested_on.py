"""docs/support.md's "Tested on" table, filled from what the test run showed, never by hand.

During a run (conftest.py hooks): a test parametrized by `pg_build` calls
tested_on(tool, verdict) with what it showed on that build ("exact",
"refused: no USDT probes"), usually as its last step; when the test passes the
verdict goes into the matrix, when it fails after recording the cell says
FAILED, before recording "not run" (and the run has failed anyway, so CI stops
before the table's check). At the end of the session, with
PGPROBE_TESTED_ON=FILE set (.ci/run sets it), the matrix is written to FILE
as JSON: the builds (version, source; probes, symbols, frame pointers as
readelf, nm and objdump read them: binfacts.py) and the cells. The terminal
summary also prints the time spent per build.

Then, as a script:
    python tests/tested_on.py --check FILE   exit 1 when docs/support.md's table differs
    python tests/tested_on.py --write FILE   rewrite docs/support.md's table from FILE
The table sits between the markers <!-- tested-on:begin --> and <!-- tested-on:end -->.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

PAGE = Path(__file__).resolve().parent.parent / "docs" / "support.md"
BEGIN, END = "<!-- tested-on:begin -->", "<!-- tested-on:end -->"
TOOLS = (
    "doctor",
    "lwlocks",
    "waits",
    "clog-reads",
    "flame",
    "flame --unwind dwarf",
    "hot",
    "triage",
)

_cells: dict[str, dict[str, str]] = defaultdict(dict)
_seconds: dict[str, float] = defaultdict(float)
_builds: list[Any] = []


def configure(config: pytest.Config, builds: list[Any]) -> None:
    _builds[:] = builds
    config.pluginmanager.register(_Summary(), "tested_on_summary")


def collect(report: pytest.TestReport) -> None:
    props = dict(report.user_properties)
    _seconds[str(props.get("pg_build", "once"))] += report.duration
    if report.when != "call":
        return
    for key, value in report.user_properties:
        if key == "tested_on":
            build_id, tool, verdict = value
            if report.failed:
                _cells[build_id][tool] = "FAILED"
            else:
                _cells[build_id].setdefault(tool, verdict)


def write(config: pytest.Config) -> None:
    target = os.environ.get("PGPROBE_TESTED_ON")
    if not target or not _cells:
        return
    from binfacts import binary_facts  # binutils' reading, not pgbuilds' (test_doctor)

    builds = []
    for build in _builds:
        if build.id not in _cells:
            continue
        facts = binary_facts(str(build.postgres))
        builds.append({"id": build.id, "version": build.version, "source": build.source,
                       "usdt": facts.usdt, "stripped": facts.stripped,
                       "frame_pointers": facts.frame_pointers})  # fmt: skip
    doc = {"builds": builds, "cells": _cells, "seconds": _seconds}
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    Path(target).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


class _Summary:
    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if _seconds:
            parts = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(_seconds.items()))
            terminalreporter.write_line(f"time per PostgreSQL build (tests + fixtures): {parts}")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def render(doc: dict[str, Any]) -> str:
    """The markdown table: one row per build, one column per tool."""
    head = ["Build", "Version", "From", "USDT probes", "Stripped", "Frame pointers", *TOOLS]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for b in doc["builds"]:
        cells = doc["cells"].get(b["id"], {})
        row = [f"`{b['id']}`", b["version"], b["source"], _yes(b["usdt"]), _yes(b["stripped"]),
               _yes(b["frame_pointers"]), *(cells.get(t, "not run") for t in TOOLS)]  # fmt: skip
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _split_page(text: str) -> tuple[str, str, str]:
    try:
        start = text.index(BEGIN) + len(BEGIN) + 1
        end = text.index(END)
    except ValueError:
        raise SystemExit(f"docs/support.md has no {BEGIN} ... {END} section") from None
    return text[:start], text[start:end], text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail if docs/support.md differs")
    mode.add_argument("--write", action="store_true", help="rewrite docs/support.md's table")
    parser.add_argument("matrix", type=Path, help="the JSON a test run wrote (PGPROBE_TESTED_ON)")
    ns = parser.parse_args(argv)
    table = render(json.loads(ns.matrix.read_text()))
    before, current, after = _split_page(PAGE.read_text())
    if ns.write:
        PAGE.write_text(before + table + after)
        return 0
    if current != table:
        print("docs/support.md's 'Tested on' table is not what this run found; this run found:\n")
        print(table)
        print(f"update it: python tests/tested_on.py --write {ns.matrix}")
        return 1
    print("docs/support.md's 'Tested on' table matches this run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
