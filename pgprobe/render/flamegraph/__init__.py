"""Flame graphs: folded stacks in, one self-contained interactive SVG (or speedscope JSON) out.

Input is the FlameGraph "folded" format, one stack per line, root first::

    postgres;PostgresMain;exec_simple_query;PortalRun;ExecScan 1234

Modules, in the order the data flows:

- ``folded``: the input dialects read (FlameGraph folded, stackcollapse/perf annotations,
  bpftrace maps one per line and multi-line), merged into one dict;
- ``frames``: offsets stripped (one function, one frame) and the module of a frame;
- ``layout``: which frames are drawn and where (the merged tree over sorted stack strings);
- ``colours``: a palette per module, a shade per name;
- ``svg``: the document, with ``flamegraph.css`` and ``flamegraph.js`` (package data) inline;
- ``speedscope``: speedscope's JSON.

API
---

``parse_folded(lines, *, strip_offsets=True, strict=False) -> dict[tuple[str, ...], int]``
    Parse folded text (a ``str``, or an iterable of lines such as an open file) into
    ``{(root, ..., leaf): count}``, merging identical stacks (dialects: see ``folded``).
    Malformed lines are skipped, or raise ``ValueError`` with ``strict=True``.

``read_folded(text, *, strip_offsets=True) -> FoldedProfile``
    The same parser, for a caller that reports bad input: ``.skipped.lines`` is how many
    lines were not stacks, ``.skipped.first_line`` the first of them, ``.stacks()`` the
    tuples, ``.samples`` the total; ``render_svg`` and ``render_speedscope`` take the profile
    itself (the fast path: nothing is parsed twice).

``render_svg(stacks, *, title="Flame Graph", subtitle="", width=1200, minwidth=0.1,
module_of=None, unit="samples", strip_offsets=True, module_colours=None) -> str``
    ``stacks`` is any of: a ``FoldedProfile``, folded text (``str``), an iterable of folded lines, a
    ``pathlib.Path`` of a folded file, a mapping ``{tuple_of_frames | "a;b;c": count}`` (what
    ``parse_folded`` returns), or an iterable of ``(tuple_of_frames | "a;b;c", count)`` pairs.
    ``subtitle`` is a line of capture facts, or a mapping ``{"duration": "10 s", "Hz": 99}``
    written as ``duration: 10 s  Hz: 99``. ``minwidth`` is in pixels: frames narrower than that
    are not drawn but their samples stay in their parents' totals. ``module_of(frame) -> str``
    replaces the built-in classifier (``classify_frame``); names it returns other than the
    built-in ones (``MODULE_LABELS``) get palettes of their own and appear in the legend
    as they are; ``module_colours`` gives some of them a fixed ``#rrggbb`` (frames and
    legend). ``unit`` is the word used in tooltips ("samples", "us", ...).

``render_speedscope(profiles, *, name="pgprobe", hz=None, strip_offsets=True) -> str``
    ``profiles`` maps a profile name (e.g. ``"pid 4242"``) to anything ``render_svg`` takes.
    Returns speedscope's file format: one "sampled" profile per entry, all sharing one
    frames table; weights are the counts (unit "none"), or seconds when ``hz`` is given.

``folded_file(lines) -> str``
    pgprobe's folded output: ``stack count`` lines (as ``pgprobe.stacks.format_folded``
    makes them) as the file's text, control characters in names written as ``\\xNN``.

``strip_offset(frame, exe_names=EXE_NAMES) -> str`` and ``classify_frame(frame) -> str``
    are described in ``frames``.

Layout and behaviour (flamegraph.pl conventions)
------------------------------------------------
Siblings are sorted by name (code point order, comparing ``name;`` with the separator, as
flamegraph.pl's sort of whole lines does) so identical stacks merge; the root is ``all``.
The SVG works opened directly in a browser (inline CSS and JS, nothing fetched): hovering a
frame shows name, count and percent in the status line (and a ``<title>`` tooltip); a click
zooms into it (its ancestors stay, dimmed; "Reset Zoom" undoes it); "Search" or Ctrl-F
(also F3) asks for a regular expression, highlights the matching frames and shows the
matched percent of all samples (a frame inside a matched frame adds nothing); "ic" (or
Ctrl-I) toggles case-insensitive search; Esc clears the search. The view is kept in the URL
fragment: ``#x=<sample offset>&y=<depth>`` is the zoomed frame (depth 0 is ``all``; the
offset is in samples, so the link survives a change of width), ``q=<regex>`` the search and
``i=1`` case-insensitive, so a link reproduces the view. Page functions for scripting:
``zoomTo(x, y)``, ``unzoom()``, ``search(regex)`` (returns the matched percent),
``resetSearch()``, ``toggleIc()``.

Limits: frames under ``minwidth`` are not in the SVG at all, so zooming does not reveal them
and the search percent counts only drawn frames (as with flamegraph.pl); a ``;`` inside a
frame name given as a tuple is replaced by ``:``.

Names (frames, title, subtitle, legend) are shown as text: control and bidi characters are
written as ``\\xNN`` / ``\\uNNNN`` (pgprobe.literal), then XML-escaped, so that any
name gives a well-formed SVG that reads as it is stored.
"""

from pgprobe.render.flamegraph.folded import (
    FoldedProfile,
    StacksInput,
    folded_file,
    parse_folded,
    read_folded,
)
from pgprobe.render.flamegraph.frames import EXE_NAMES, MODULE_LABELS, classify_frame, strip_offset
from pgprobe.render.flamegraph.layout import XPAD
from pgprobe.render.flamegraph.speedscope import render_speedscope
from pgprobe.render.flamegraph.svg import render_svg

__all__ = [
    "EXE_NAMES",
    "FoldedProfile",
    "MODULE_LABELS",
    "XPAD",
    "StacksInput",
    "classify_frame",
    "folded_file",
    "parse_folded",
    "read_folded",
    "render_speedscope",
    "render_svg",
    "strip_offset",
]
