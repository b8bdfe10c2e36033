"""pgprobe.literal's helpers on their own (the outputs are checked end to end in
test_security_names.py)."""

from __future__ import annotations

from pgprobe.literal import literal, one_line


def test_one_line_flattens_whitespace_and_cuts_at_the_width() -> None:
    text = "SELECT a,\n\t b\r\n  FROM  t"
    assert one_line(text, 80) == "SELECT a, b FROM t"
    assert one_line(text, 10) == "SELECT a,…"
    assert len(one_line("x" * 200, 100)) == 100
    assert one_line("", 5) == ""


def test_one_line_leaves_control_characters_to_literal() -> None:
    cut = one_line("SELECT '\x1b[31m'", 40)
    assert "\x1b" in cut  # a cell's text is made literal where it is drawn
    assert literal(cut) == "SELECT '\\x1b[31m'"
