"""top --json's line writer (tools/top/jsonline.py) against json.dumps of the same rows:
the same text, byte for byte, at a first refresh and at a later one whose sessions' parts
are kept, with names that need escaping (quotes, backslashes, control characters, non-ASCII
text)."""

from __future__ import annotations

import json

from pgprobe.tools.top import jsonline, records
from pgprobe.tools.top.records import BackendRow, Frame, Session, WaitRow

NAMES = ["plain", 'quo"te', "back\\slash", "new\nline\ttab\x01", "übergröße ✓ 名前", ""]


def frame(shift: int) -> Frame:
    rows = []
    for i, name in enumerate(NAMES):
        session = Session(100 + i, "client backend", name, "10.0.0.1" if i % 2 else "local",
                          "idle in transaction" if i % 3 == 0 else "idle",
                          None if i % 2 else 12.5 + i, "Client:ClientRead" if i else "",
                          f"SELECT '{name}'", "db" + name, "user")  # fmt: skip
        by_class = {"CPU": 1234567 + shift * i, "idle": 2_000_000_000 - 7 * i}
        if i % 2:
            by_class["Lock"] = 999 + shift
        rows.append(BackendRow(100 + i, 2_000_000_001 + shift, by_class,
                               "Lock:transactionid" if i % 2 else "", session, i == 4))  # fmt: skip
    waits = [WaitRow("Lock:transactionid", "Lock", 5_000 + shift, 3, {101, 103})]
    return Frame(1_000, 2_000_001_000 + shift, 1_700_000_000.25, 2, {"CPU": 5, "idle": 7}, 11,
                 rows, waits, [], [], lambda row: "", [], 15)  # fmt: skip


def test_lines_are_what_json_dumps_writes() -> None:
    writer = jsonline.Writer()
    for shift in (0, 1, 1, 12345):
        meta = {"window_s": 2.0 + shift, "note": 'a "quoted" name', "lost": []}
        f = frame(shift)
        expected = json.dumps({"tool": "top", "meta": meta, "rows": records.rows(f)})
        assert writer.line("top", meta, f) == expected
