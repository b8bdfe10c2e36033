"""`pgprobe top --json`: one refresh as one JSON line, the same text json.dumps makes of
{"tool", "meta", "rows": records.rows(frame)}.

With 1,000 backends the backends' rows were a sixth of a refresh's CPU (a dict each, then
json.dumps: 7 ms a refresh on a slow day, docs/benchmarks.md), and most of each row is its
session, the same from one refresh to the next. Each session's part is written by
json.dumps once and kept while the session is seen; a row's numbers are floats, written as
json writes them (repr). Every other row goes through json.dumps as before.
"""

from __future__ import annotations

import json
from typing import Any

from pgprobe.tools.top import records
from pgprobe.tools.top.records import BackendRow, Frame, Session

# a row's numbers after its session's head: floats, written as json writes them (repr)
_NUMBERS = ", ".join(f'"{key}": %r' for key in records.NUMBER_KEYS)


class Writer:
    """The JSON lines of one `top --json` run: the sessions' parts kept between refreshes."""

    def __init__(self) -> None:
        self._parts: dict[Session, tuple[str, str]] = {}  # session -> (head, its query's tail)
        self._strings: dict[str, str] = {}  # top_wait -> its JSON

    def line(self, tool: str, meta: dict[str, Any], frame: Frame) -> str:
        rows = [self._backend(r) for r in frame.backends]
        rows += [json.dumps(row) for row in records.rows(frame, backends=False)]
        seen = {r.session for r in frame.backends}
        self._parts = {s: part for s, part in self._parts.items() if s in seen}
        head = json.dumps({"tool": tool, "meta": meta})[:-1]
        return f'{head}, "rows": [{", ".join(rows)}]}}'

    def _backend(self, row: BackendRow) -> str:
        parts = self._parts.get(row.session)
        if parts is None:
            parts = self._parts[row.session] = _session_parts(row)
        top = self._strings.get(row.top_wait)
        if top is None:
            top = self._strings[row.top_wait] = json.dumps(row.top_wait)
        numbers = _NUMBERS % records.row_numbers(row)
        exited = "true" if row.exited else "false"
        return f'{parts[0]}, {numbers}, "top_wait": {top}, "exited": {exited}{parts[1]}'


def _session_parts(row: BackendRow) -> tuple[str, str]:
    """A row's session keys as JSON: its head (up to wait_event_now, no closing brace) and
    its tail (the query, the closing brace)."""
    whole = row.as_json()
    keys = list(whole)
    head = {key: whole[key] for key in keys[: keys.index("wall_us")]}
    return json.dumps(head)[:-1], f', "query": {json.dumps(whole["query"])}}}'
