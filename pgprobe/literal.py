"""Names shown as text, never interpreted: the one rule for every table, title and message.

Anything a client, a local user or a binary names can hold any character: an
``application_name``, a query, a role or database name, a function name from an ELF file
or a /tmp/perf-PID.map, a process title from /proc, a path. Printed as it is, ESC starts
a terminal escape (window title, colours, OSC 8 links), CR and bidi overrides hide or
reorder text, a newline forges a line, and XML refuses most C0 characters outright.
``literal(text)`` writes those characters visibly, as PostgreSQL does (pg_clean_ascii):

- C0 controls (tab and newline too), DEL and the C1 controls U+0080-U+009F: ``\\xNN``;
- bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), the line and
  paragraph separators U+2028/U+2029, and U+FFFE/U+FFFF (not characters: XML refuses
  them): ``\\uNNNN``;
- a lone surrogate (an undecodable byte kept by ``surrogateescape``): ``\\xNN`` of that byte
  (U+DC80-U+DCFF), ``\\uNNNN`` for any other.

Everything else (accents, CJK, a backslash) is left as it is, so the result only differs
from the input where the input was not text, and ``literal(literal(s)) == literal(s)``.
``one_line(text, width)`` flattens and cuts a statement's text for a cell.
``literal_lines(text)`` keeps tab and newline: for text that is several lines on purpose
(a table title of two lines, a query text in the HTML report's preformatted cells).

Which outputs use it: tables (pgprobe.render.table: rich gets a ``rich.text.Text``, never
markup), titles, warnings and errors on stderr, triage's summary, clog-reads' stacks, the
flame graph SVG and folded stacks, the HTML report. JSON, speedscope and pprof keep the
raw values: they are data for programs, and their encoders escape what must be.

A leaf module of the base layer (it imports nothing of pgprobe): tools, findings and
renderers all print with it.
"""

from __future__ import annotations

import re

# What is not text; each character replaced by _shown.
_NOT_TEXT = r"\x00-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069\ufffe\uffff\ud800-\udfff"
_ONE_LINE = re.compile(f"[{_NOT_TEXT}]")
_LINES = re.compile(f"(?![\\t\\n])[{_NOT_TEXT}]")


def _shown(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def literal(text: str) -> str:
    """``text`` on one line, every character that is not text written as ``\\xNN``/``\\uNNNN``."""
    return _ONE_LINE.sub(_shown, text)


def one_line(text: str, width: int) -> str:
    """A statement's text in a cell: its whitespace runs as one space, cut to ``width``
    characters with an ellipsis (not made literal: the table or the frame does that)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: max(width - 1, 0)] + "…"


def literal_lines(text: str) -> str:
    """As ``literal``, but tab and newline are kept (text meant to be several lines)."""
    return _LINES.sub(_shown, text)
