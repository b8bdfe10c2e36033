"""Flame graphs: folded stacks in, one self-contained interactive SVG (or speedscope JSON) out.

Input is the FlameGraph "folded" format, one stack per line, root first::

    postgres;PostgresMain;exec_simple_query;PortalRun;ExecScan 1234

API
---

``parse_folded(lines, *, strip_offsets=True, strict=False) -> dict[tuple[str, ...], int]``
    Parse folded text (a ``str``, or an iterable of lines such as an open file) into
    ``{(root, ..., leaf): count}``, merging identical stacks. Tolerated: blank lines, ``#``
    comments, ``\\r\\n``, tabs or several spaces before the count, decimal counts (rounded),
    perf/stackcollapse annotations (``func_[k]``), bpftrace maps printed one per line
    (``@name[a;b;c]: 12``) and bpftrace's multi-line stack maps
    (``@[\\n  leaf+12\\n  caller+40\\n]: 12``, leaf first, also ``ustack(perf)`` lines
    ``7f12ab sym+0x1a (/path)`` and extra keys such as ``@[comm, ustack]``, which become root
    frames). Malformed lines are skipped, or raise ``ValueError`` with ``strict=True``.
    Frame names are interned, so a profile of many deep stacks costs little memory.

``render_svg(stacks, *, title="Flame Graph", subtitle="", width=1200, minwidth=0.1,
module_of=None, unit="samples", strip_offsets=True) -> str``
    ``stacks`` is any of: folded text (``str``), an iterable of folded lines, a
    ``pathlib.Path`` of a folded file, a mapping ``{tuple_of_frames | "a;b;c": count}`` (what
    ``parse_folded`` returns), or an iterable of ``(tuple_of_frames | "a;b;c", count)`` pairs.
    ``subtitle`` is a line of capture facts, or a mapping ``{"duration": "10 s", "Hz": 99}``
    written as ``duration: 10 s  Hz: 99``. ``minwidth`` is in pixels: frames narrower than that
    are not drawn but their samples stay in their parents' totals. ``module_of(frame) -> str``
    replaces the built-in classifier (``classify_frame``); names it returns other than the
    built-in ones (``MODULE_LABELS``) get palettes of their own and appear in the legend
    as they are. ``unit`` is the word used in tooltips ("samples", "us", ...).

``render_speedscope(profiles, *, name="pgprobe", hz=None, strip_offsets=True) -> str``
    ``profiles`` maps a profile name (e.g. ``"pid 4242"``) to anything ``render_svg`` takes.
    Returns speedscope's file format (https://www.speedscope.app/file-format-schema.json):
    one "sampled" profile per entry, all sharing one frames table; stacks are root first,
    weights are the counts (unit "none"), or seconds when ``hz`` (sampling frequency) is given.

``strip_offset(frame, exe_names=EXE_NAMES) -> str`` and ``classify_frame(frame) -> str``
    are the helpers described below.

Offsets
-------
``strip_offset`` turns ``ExecScan+0x1a`` (perf), ``ExecScan+26`` (bpftrace),
``vfs_read+0x5/0x1a0`` (kernel) and ``postgres`ExecScan+0x1a`` (DTrace) into the function
name, keeping a ``_[k]``-style annotation, so one function is one frame. An offset is *kept*
when there is no symbol to merge on: ``[unknown]+0x..``, ``0x7f..+0x..``, a library
(``libfoo.so+0x1a2``, ``/usr/lib/x.so+0x10``) or the server executable itself
(``postgres+0x4a2f10``, the form in which a stripped binary's static functions appear): those
frames stay distinct per address, since two addresses in a stripped binary are usually two
different functions and merging them would invent one huge fake function. ``exe_names``
(default ``postgres``, ``postmaster``) says which bare names are executables.

Modules and colours
-------------------
``classify_frame`` returns one of ``MODULE_LABELS``: ``kernel`` (a ``_[k]``/``_[kernel]``
annotation, or a DTrace kernel module such as ``genunix`func``), ``libc`` (libc, ld-linux,
libpthread, libm, ...; from ``libc.so.6`func`` or ``libc.so.6+0x..``), ``lib`` (any other
library or extension, ``libfoo.so+0x1a2``, ``pg_stat_statements.so`func``, and perf's JIT
``_[j]`` frames), ``unresolved`` (``[unknown]``, bare addresses, ``postgres+0x..``) and
``postgres`` (everything else: a plain symbol name is taken to be the server's). Each module
has a palette; within it a frame's colour comes from a CRC-32 of its name, so a function
has the same colour in every graph.

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
"""

from __future__ import annotations

import json
import re
import sys
import zlib
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import accumulate
from pathlib import Path
from typing import TypeAlias

from pgprobe import __version__
from pgprobe.stacks import EXE_NAMES, strip_offset
from pgprobe.stacks import OFFSET_RE as _OFFSET_RE
from pgprobe.stacks import is_address_base as _is_address_base

__all__ = [
    "EXE_NAMES",
    "MODULE_LABELS",
    "StacksInput",
    "classify_frame",
    "parse_folded",
    "render_speedscope",
    "render_svg",
    "strip_offset",
]

Stack = tuple[str, ...]
StacksInput: TypeAlias = (
    str
    | Path
    | Mapping[Stack, int]
    | Mapping[str, int]
    | Iterable[str]
    | Iterable[tuple[Stack, int]]
    | Iterable[tuple[str, int]]
)

#: Built-in module names (what ``classify_frame`` returns) and their legend labels, in
#: legend order.
MODULE_LABELS: dict[str, str] = {
    "postgres": "postgres",
    "kernel": "kernel",
    "libc": "libc / ld.so",
    "lib": "other libraries / extensions",
    "unresolved": "unresolved",
}

# ---------------------------------------------------------------------------------------------
# Offsets and modules

_ANNOT_RE = re.compile(r"_\[([a-z]+)\]$")
_LIBC_PREFIXES = (
    "libc.",
    "libc-",
    "ld-linux",
    "ld64.",
    "ld.so",
    "libpthread",
    "libm.",
    "libm-",
    "libdl",
    "librt",
    "libresolv",
    "libcrypt.",
)
_KERNEL_MODULES = frozenset({"vmlinux", "kernel", "genunix", "unix", "[kernel.kallsyms]"})


def _module_kind(module: str) -> str:
    name = module.rpartition("/")[2]
    if name in _KERNEL_MODULES:
        return "kernel"
    if name.startswith(_LIBC_PREFIXES):
        return "libc"
    if name in EXE_NAMES or name.startswith("postgres"):
        return "postgres"
    return "lib"


def classify_frame(frame: str) -> str:
    """The module a frame belongs to: one of the keys of ``MODULE_LABELS``."""
    m = _ANNOT_RE.search(frame)
    if m is not None:
        ann = m.group(1)
        if ann in ("k", "kernel"):
            return "kernel"
        if ann == "j":
            return "lib"
        frame = frame[: m.start()]
    if not frame or frame[0] == "[" or frame.startswith(("0x", "0X")):
        return "unresolved"
    module, tick, func = frame.rpartition("`")
    if tick:
        if not func or func[0] == "[" or func.startswith(("0x", "0X")):
            return "unresolved"
        return _module_kind(module)
    om = _OFFSET_RE.match(frame)
    if om is not None:
        base = om.group("base")
        if "/" in base or ".so" in base:
            return _module_kind(base)
        if _is_address_base(base, EXE_NAMES):
            return "unresolved"
    return "postgres"


# ---------------------------------------------------------------------------------------------
# Parsing

_TAIL_RE = re.compile(r"^(.*?)\s+([0-9]+(?:\.[0-9]*)?)$")
_BPF_LINE_RE = re.compile(r"^@\w*\[(.*)\]:\s*([0-9]+(?:\.[0-9]*)?)$")
_BPF_OPEN_RE = re.compile(r"^@\w*\[(.*)$")
_BPF_CLOSE_RE = re.compile(r"^\]:\s*([0-9]+(?:\.[0-9]*)?)$")
_PERF_FRAME_RE = re.compile(r"^(?:0x)?[0-9a-fA-F]+\s+(.+?)(?:\s+\([^()]*\))?$")


_SPECIAL_START = frozenset(["", "#", "@", "]", " ", "\t", "\r", "\n", "\f", "\v"])


def _normalize(stack: str, strip_offsets: bool) -> str:
    if strip_offsets and "+" in stack:
        stack = ";".join([strip_offset(f) for f in stack.split(";")])
    return stack


def _parse_lines(
    lines: Iterable[str], acc: dict[str, int], strip_offsets: bool, strict: bool
) -> None:
    """Add the stacks of folded ``lines`` to ``acc``, keyed ``"root;...;leaf;"``.

    The common line takes the first branch (one rpartition, one int, one concatenation);
    anything else goes to the tolerant path.
    """
    get = acc.get
    block: list[str] | None = None  # frames of a bpftrace multi-line stack, leaf first
    block_keys: list[str] = []
    special = _SPECIAL_START
    for lineno, raw in enumerate(lines, 1):
        if block is None and raw[:1] not in special:
            # the common line, "a;b;c 12\n": no copy but the key, int() ignores the newline
            stack, _, cnt = raw.rpartition(" ")
            try:
                n = int(cnt)
            except ValueError:
                pass  # the tolerant path below
            else:
                if stack[-1:] in (" ", "\t"):
                    stack = stack.rstrip()
                if n > 0 and stack:
                    if strip_offsets and "+" in stack:
                        stack = _normalize(stack, True)
                    key = stack + ";"
                    acc[key] = get(key, 0) + n
                continue
        line = raw.strip()
        if not line:
            continue
        if block is None:
            c0 = line[0]
            if c0 != "#" and c0 != "@" and c0 != "]":
                stack, _, cnt = line.rpartition(" ")
                try:
                    n = int(cnt)
                except ValueError:
                    m = _TAIL_RE.match(line)
                    if m is None:
                        if strict:
                            msg = f"line {lineno}: not a folded stack: {line!r}"
                            raise ValueError(msg) from None
                        continue
                    stack, n = m.group(1), round(float(m.group(2)))
                stack = stack.rstrip()
                if n > 0 and stack:
                    key = _normalize(stack, strip_offsets) + ";"
                    acc[key] = get(key, 0) + n
                continue
            if c0 == "#":
                continue
            if c0 == "@":
                m = _BPF_LINE_RE.match(line)
                if m is not None:
                    n = round(float(m.group(2)))
                    stack = m.group(1).strip()
                    if n > 0 and stack:
                        key = _normalize(stack, strip_offsets) + ";"
                        acc[key] = get(key, 0) + n
                    continue
                m = _BPF_OPEN_RE.match(line)
                if m is not None:
                    block = []
                    block_keys = [k.strip() for k in m.group(1).split(",") if k.strip()]
                    continue
            if strict:
                raise ValueError(f"line {lineno}: not a folded stack: {line!r}")
            continue
        # inside a bpftrace multi-line stack
        m = _BPF_CLOSE_RE.match(line)
        if m is None:
            pm = _PERF_FRAME_RE.match(line)
            frame = pm.group(1) if pm is not None else line
            if frame.endswith(","):  # end of one key of several: "leaf+12,"
                frame = frame[:-1].rstrip()
            if frame:
                block.append(frame.replace(";", ":"))
            continue
        n = round(float(m.group(1)))
        frames = block_keys + block[::-1]
        block = None
        if n > 0 and frames:
            key = _normalize(";".join(frames), strip_offsets) + ";"
            acc[key] = get(key, 0) + n
    if block is not None and strict:
        raise ValueError("unterminated bpftrace stack at end of input")


def _join_stack(frames: Stack | str) -> str:
    if isinstance(frames, str):
        return frames
    s = ";".join(frames)
    if s.count(";") != len(frames) - 1:  # a ";" inside a name would split it
        s = ";".join([f.replace(";", ":") for f in frames])
    return s


def _parse_pairs(
    pairs: Iterable[tuple[Stack | str, int]], acc: dict[str, int], strip_offsets: bool
) -> None:
    get = acc.get
    for frames, n in pairs:
        if n <= 0 or not frames:
            continue
        key = _normalize(_join_stack(frames), strip_offsets) + ";"
        acc[key] = get(key, 0) + int(n)


def _fold(stacks: StacksInput, strip_offsets: bool) -> dict[str, int]:
    """Any accepted input -> ``{"root;...;leaf;": count}`` (note the trailing separator)."""
    acc: dict[str, int] = {}
    if isinstance(stacks, str):
        _parse_lines(stacks.splitlines(), acc, strip_offsets, False)
    elif isinstance(stacks, Path):
        with stacks.open(encoding="utf-8", errors="replace") as f:
            _parse_lines(f, acc, strip_offsets, False)
    elif isinstance(stacks, Mapping):
        _parse_pairs(stacks.items(), acc, strip_offsets)
    else:
        it: Iterator[object] = iter(stacks)
        first = next(it, None)
        if first is None:
            return acc
        rest: Iterator[object] = _chain1(first, it)
        if isinstance(first, str):
            _parse_lines(rest, acc, strip_offsets, False)  # type: ignore[arg-type]
        else:
            _parse_pairs(rest, acc, strip_offsets)  # type: ignore[arg-type]
    return acc


def _chain1(first: object, it: Iterator[object]) -> Iterator[object]:
    yield first
    yield from it


def parse_folded(
    lines: str | Iterable[str], *, strip_offsets: bool = True, strict: bool = False
) -> dict[Stack, int]:
    """Folded text or lines -> ``{(root, ..., leaf): count}`` (see the module docstring)."""
    acc: dict[str, int] = {}
    _parse_lines(
        lines.splitlines() if isinstance(lines, str) else lines, acc, strip_offsets, strict
    )
    intern = sys.intern
    return {tuple(map(intern, k[:-1].split(";"))): n for k, n in acc.items()}


# ---------------------------------------------------------------------------------------------
# The tree


def _frame_tree(
    keys: list[str], cum: list[int], threshold: float
) -> tuple[list[tuple[int, int, int, str]], int]:
    """Frames of the merged tree whose count is at least ``threshold``.

    ``keys`` are the sorted ``"a;b;c;"`` stacks, ``cum`` their running totals (``cum[0]`` is
    0). All stacks below one frame share a string prefix ``"a;b;"``, so they are one
    contiguous run of ``keys``: a frame's count is ``cum[end] - cum[start]`` and its run ends
    where ``"a;b<"`` would sort (``<`` follows ``;``). Only frames that are drawn are visited,
    so the cost follows the size of the picture, not of the input.

    Returns ``[(depth, start_sample, count, name)]`` with the root ``all`` first, and the
    deepest depth drawn.
    """
    total = cum[-1]
    nodes: list[tuple[int, int, int, str]] = [(0, 0, total, "all")]
    maxdepth = 0
    todo = [(0, len(keys), 0, 1)]  # key range, prefix length, depth of the children
    pop, push, add = todo.pop, todo.append, nodes.append
    while todo:
        lo, hi, plen, depth = pop()
        i = lo
        while i < hi:
            s = keys[i]
            if len(s) == plen:  # the stack ends at the parent: its self time
                i += 1
                continue
            j = s.find(";", plen)
            end = bisect_left(keys, s[:j] + "<", i + 1, hi)
            n = cum[end] - cum[i]
            if n >= threshold:
                add((depth, cum[i], n, s[plen:j]))
                if depth > maxdepth:
                    maxdepth = depth
                push((i, end, j + 1, depth + 1))
            i = end
    return nodes, maxdepth


# ---------------------------------------------------------------------------------------------
# Colours

# (red lo, red span, green lo, green span, blue lo, blue span), spans scaled by three
# fractions taken from the name's CRC-32.
_PALETTES: dict[str, tuple[int, int, int, int, int, int]] = {
    "postgres": (205, 50, 50, 170, 0, 55),  # red .. orange .. yellow
    "kernel": (100, 60, 150, 50, 225, 30),  # blue
    "libc": (100, 60, 190, 45, 80, 50),  # green
    "lib": (180, 40, 145, 35, 225, 30),  # lavender
    "unresolved": (165, 0, 165, 0, 165, 0),  # grey (span via the shared fraction below)
}
_EXTRA_PALETTES: list[tuple[int, int, int, int, int, int]] = [
    (60, 50, 195, 35, 195, 35),  # teal
    (230, 25, 140, 50, 170, 50),  # pink
    (180, 40, 140, 40, 80, 40),  # tan
    (150, 50, 180, 40, 40, 40),  # olive
    (80, 40, 215, 40, 235, 20),  # cyan
]
_HIGHLIGHT = "#e600e6"
_ROOT_FILL = "#d9d9d9"
_HINT = "Click a frame to zoom in, Ctrl-F to search."


def _palette(module: str) -> tuple[int, int, int, int, int, int]:
    p = _PALETTES.get(module)
    if p is None:
        p = _EXTRA_PALETTES[zlib.crc32(module.encode("utf-8", "surrogatepass")) % 5]
    return p


def _color(name: str, module: str) -> str:
    h = zlib.crc32(name.encode("utf-8", "surrogatepass"))
    a, b, c = (h & 1023) / 1023, ((h >> 10) & 1023) / 1023, ((h >> 20) & 1023) / 1023
    r0, rs, g0, gs, b0, bs = _palette(module)
    if module == "unresolved":
        v = round(165 + 45 * a)
        return f"#{v:02x}{v:02x}{v:02x}"
    return f"#{round(r0 + rs * c):02x}{round(g0 + gs * a):02x}{round(b0 + bs * b):02x}"


def _legend_color(module: str) -> str:
    r0, rs, g0, gs, b0, bs = _palette(module)
    return f"#{r0 + rs // 2:02x}{g0 + gs // 2:02x}{b0 + bs // 2:02x}"


# ---------------------------------------------------------------------------------------------
# SVG

_XML_ESC = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        '"': "&quot;",
        "'": "&#39;",
        **{chr(c): "\ufffd" for c in range(32) if chr(c) not in "\t\n\r"},
        "\ufffe": "\ufffd",
        "\uffff": "\ufffd",
    }
)


def _esc(s: str) -> str:
    """XML-escape text or an attribute value; characters XML 1.0 forbids become U+FFFD."""
    s = s.translate(_XML_ESC)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from a badly decoded input
        s = s.encode("utf-8", "replace").decode("utf-8")
    return s


XPAD = 10  # left and right margin, px
FRAME_H = 16  # height of a row, px
FONT = 12  # label font size, px
CHAR_W = FONT * 0.59  # average label character width, px (flamegraph.pl's estimate)
TEXT_PAD = 3  # space between a frame's edge and its label, px


def _label(name: str, w: float) -> str:
    chars = int((w - 2 * TEXT_PAD) / CHAR_W)
    if chars < 3:
        return ""
    return name if len(name) <= chars else name[: chars - 2] + ".."


_CSS = """
text{font-family:Verdana,"DejaVu Sans",sans-serif;font-size:12px;fill:#000}
#frames text{pointer-events:none}
.f{cursor:pointer}
.f:hover rect{stroke:#000;stroke-width:.6}
.p{opacity:.5}
.h{display:none}
.ti{font-size:17px;text-anchor:middle}
.st{fill:#555;text-anchor:middle}
.b{cursor:pointer;fill:#1a4f9c}
.b:hover{text-decoration:underline}
.dis{opacity:.15;pointer-events:none}
.on{font-weight:bold;fill:#c00000}
#matched{text-anchor:end}
.empty{font-size:16px;fill:#777;text-anchor:middle}
"""

# Kept free of "]]>" (it sits in a CDATA section) and of anything fetched from elsewhere.
_JS = r"""
"use strict";
var frames = [], byEl = new Map(), zoomed = null, query = null, ic = false;
var st, matched, unzoomBtn, searchBtn, icBtn, defStatus = "";

function txt(el, s) { if (el.textContent !== s) el.textContent = s; }
function fmt(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }

function init() {
  st = document.getElementById("status");
  matched = document.getElementById("matched");
  unzoomBtn = document.getElementById("unzoom");
  searchBtn = document.getElementById("search");
  icBtn = document.getElementById("ic");
  defStatus = st.textContent;
  var gs = document.querySelectorAll("g.f");
  for (var i = 0; i < gs.length; i++) {
    var g = gs[i], t = g.querySelector("title").textContent;
    var f = {g: g, r: g.querySelector("rect"), t: g.querySelector("text"), tip: t,
             name: t.slice(0, t.lastIndexOf(" (")),
             s: +g.getAttribute("data-s"), n: +g.getAttribute("data-n"),
             d: +g.getAttribute("data-d"), m: false};
    f.fill = f.r.getAttribute("fill");
    frames.push(f);
    byEl.set(g, f);
  }
  var fg = document.getElementById("frames");
  fg.addEventListener("click", function (e) {
    var f = frameOf(e.target);
    if (f) { zoomFrame(f); writeHash(); }
  });
  fg.addEventListener("mouseover", function (e) {
    var f = frameOf(e.target);
    if (f) txt(st, f.tip);
  });
  fg.addEventListener("mouseout", function () { txt(st, defStatus); });
  unzoomBtn.addEventListener("click", function () { unzoom(); });
  searchBtn.addEventListener("click", function () {
    if (query !== null) resetSearch(); else searchPrompt();
  });
  icBtn.addEventListener("click", function () { toggleIc(); });
  window.addEventListener("keydown", function (e) {
    var k = e.key;
    if (k === "F3" || ((e.ctrlKey || e.metaKey) && (k === "f" || k === "F"))) {
      e.preventDefault(); searchPrompt();
    } else if ((e.ctrlKey || e.metaKey) && (k === "i" || k === "I")) {
      e.preventDefault(); toggleIc();
    } else if (k === "Escape") {
      resetSearch();
    }
  });
  window.addEventListener("hashchange", readHash);
  window.addEventListener("popstate", readHash);
  readHash();
  document.documentElement.setAttribute("data-ready", "1");
}

function frameOf(el) {
  var g = el && el.closest ? el.closest("g.f") : null;
  return g ? byEl.get(g) : null;
}

function label(f, w) {
  var c = Math.floor((w - 2 * P.tp) / P.cw), s = "";
  if (c >= 3) s = f.name.length <= c ? f.name : f.name.slice(0, c - 2) + "..";
  txt(f.t, s);
}

function layout() {
  var zs = 0, zn = P.total, zd = 0;
  if (zoomed) { zs = zoomed.s; zn = zoomed.n; zd = zoomed.d; }
  var ze = zs + zn, k = P.plotw / zn;
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i], x, w, anc = false;
    if (f.d >= zd && f.s >= zs && f.s + f.n <= ze) {
      x = P.xpad + (f.s - zs) * k; w = f.n * k;
    } else if (f.d < zd && f.s <= zs && f.s + f.n >= ze) {
      x = P.xpad; w = P.plotw; anc = true;
    } else {
      f.g.classList.add("h");
      continue;
    }
    f.g.classList.remove("h");
    f.g.classList.toggle("p", anc);
    f.r.setAttribute("x", x.toFixed(2));
    f.r.setAttribute("width", w.toFixed(2));
    f.t.setAttribute("x", (x + P.tp).toFixed(2));
    label(f, w);
  }
  unzoomBtn.classList.toggle("dis", !zoomed);
}

function zoomFrame(f) {
  zoomed = (f && f.d > 0) ? f : null;
  layout();
}

function zoomTo(x, y) {
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i];
    if (f.d === y && f.s <= x && x < f.s + f.n) { zoomFrame(f); writeHash(); return true; }
  }
  return false;
}

function unzoom() { zoomFrame(null); writeHash(); }

function doSearch(term) {
  var re;
  try { re = new RegExp(term, ic ? "i" : ""); }
  catch (e) { txt(st, "Invalid regular expression: " + term); return -1; }
  query = term;
  var iv = [];
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i], hit = f.d > 0 && re.test(f.name);
    if (hit) iv.push(f);
    if (hit !== f.m) { f.m = hit; f.r.setAttribute("fill", hit ? P.hl : f.fill); }
  }
  // nested matches count once: a frame inside the last counted one adds nothing
  iv.sort(function (a, b) { return a.s - b.s || b.n - a.n; });
  var sum = 0, end = -1;
  for (var j = 0; j < iv.length; j++) {
    var s = iv[j].s, e2 = s + iv[j].n;
    if (s >= end) { sum += iv[j].n; end = e2; }
    else if (e2 > end) { sum += e2 - end; end = e2; }
  }
  var pct = 100 * sum / P.total;
  txt(matched, "Matched: " + pct.toFixed(2) + "% (" + fmt(sum) + " " + P.unit + ")");
  txt(searchBtn, "Reset Search");
  searchBtn.classList.add("on");
  return pct;
}

function search(term) {
  if (term === undefined || term === null || term === "") { resetSearch(); return 0; }
  var pct = doSearch(String(term));
  writeHash();
  return pct;
}

function clearSearch() {
  query = null;
  for (var i = 0; i < frames.length; i++) {
    var f = frames[i];
    if (f.m) { f.m = false; f.r.setAttribute("fill", f.fill); }
  }
  txt(matched, "");
  txt(searchBtn, "Search");
  searchBtn.classList.remove("on");
}

function resetSearch() { clearSearch(); writeHash(); }

function searchPrompt() {
  var t = window.prompt("Search for a regular expression (" +
                        (ic ? "case-insensitive" : "case-sensitive") + "):", query || "");
  if (t !== null && t !== "") search(t);
}

function setIc(v) {
  ic = v;
  icBtn.classList.toggle("on", ic);
}

function toggleIc() {
  setIc(!ic);
  if (query !== null) doSearch(query);
  writeHash();
}

function writeHash() {
  var p = [];
  if (zoomed) p.push("x=" + zoomed.s, "y=" + zoomed.d);
  if (query !== null) p.push("q=" + encodeURIComponent(query));
  if (ic) p.push("i=1");
  var h = p.length ? "#" + p.join("&") : "";
  if (h === location.hash || (h === "" && location.hash === "#")) return;
  try {
    history.pushState(null, "", h === "" ? location.pathname + location.search : h);
  } catch (e) {
    location.hash = h;
  }
}

function readHash() {
  var h = location.hash.replace(/^#/, ""), a = {};
  h.split("&").forEach(function (kv) {
    var i = kv.indexOf("=");
    if (i > 0) {
      try { a[kv.slice(0, i)] = decodeURIComponent(kv.slice(i + 1)); } catch (e) { }
    }
  });
  setIc(a.i === "1");
  var target = null;
  if (a.x !== undefined && a.y !== undefined) {
    var x = +a.x, y = +a.y;
    for (var i = 0; i < frames.length; i++) {
      var f = frames[i];
      if (f.d === y && f.s <= x && x < f.s + f.n) { target = f; break; }
    }
  }
  zoomFrame(target);
  if (a.q !== undefined && a.q !== "") doSearch(a.q); else clearSearch();
}

window.addEventListener("load", init);
"""


def _subtitle_text(subtitle: str | Mapping[str, object]) -> str:
    if isinstance(subtitle, str):
        return subtitle
    return "   ".join(f"{k}: {v}" for k, v in subtitle.items())


def render_svg(
    stacks: StacksInput,
    *,
    title: str = "Flame Graph",
    subtitle: str | Mapping[str, object] = "",
    width: int = 1200,
    minwidth: float = 0.1,
    module_of: Callable[[str], str] | None = None,
    unit: str = "samples",
    strip_offsets: bool = True,
) -> str:
    """Render folded stacks as one self-contained interactive SVG document."""
    folded = _fold(stacks, strip_offsets)
    keys = sorted(folded)
    cum = [0, *accumulate(map(folded.__getitem__, keys))]
    del folded
    total = cum[-1]
    width = max(int(width), 2 * XPAD + 100)
    plotw = width - 2 * XPAD
    scale = plotw / total if total else 0.0
    if total:
        nodes, maxdepth = _frame_tree(keys, cum, max(minwidth, 0.0) / scale)
    else:
        nodes, maxdepth = [], 0
    del keys, cum

    sub = _subtitle_text(subtitle)
    top = 24  # baseline of the title
    sub_y = top + 20
    ctl_y = (sub_y if sub else top) + 22  # buttons row
    plot_top = ctl_y + 12
    rows = maxdepth + 1 if total else 3
    plot_bottom = plot_top + rows * FRAME_H
    status_y = plot_bottom + 20
    legend_y = status_y + 22
    height = legend_y + 14

    classify = module_of or classify_frame
    out: list[str] = []
    ap = out.append
    ap(
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n'
        f'<svg version="1.1" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">\n'
        f"<title>{_esc(title)}</title>\n"
        f"<style>{_CSS}</style>\n"
    )
    cfg = {
        "total": total,
        "plotw": plotw,
        "xpad": XPAD,
        "tp": TEXT_PAD,
        "cw": CHAR_W,
        "hl": _HIGHLIGHT,
        "unit": unit,
    }
    cfg_js = json.dumps(cfg).replace("<", "\\u003c").replace("]]>", "]]\\u003e")
    ap(f"<script><![CDATA[\nvar P = {cfg_js};\n{_JS}]]></script>\n")
    ap(f'<rect x="0" y="0" width="{width}" height="{height}" fill="#f8f8f4"/>\n')
    ap(f'<text class="ti" x="{width / 2:.1f}" y="{top}">{_esc(title)}</text>\n')
    if sub:
        ap(f'<text class="st" x="{width / 2:.1f}" y="{sub_y}">{_esc(sub)}</text>\n')
    ap(
        f'<text id="unzoom" class="b dis" x="{XPAD}" y="{ctl_y}">Reset Zoom</text>\n'
        f'<text id="search" class="b" x="{width - XPAD - 130}" y="{ctl_y}">Search'
        "<title>Search frames by regular expression (Ctrl-F)</title></text>\n"
        f'<text id="ic" class="b" x="{width - XPAD - 20}" y="{ctl_y}">ic'
        "<title>Ignore case in searches (Ctrl-I)</title></text>\n"
    )

    ap('<g id="frames">\n')
    modules_seen: dict[str, None] = {}
    if total:
        base_y = plot_bottom - FRAME_H  # top edge of the root row
        cache: dict[str, tuple[str, str]] = {}
        rect_h = FRAME_H - 1
        unit_x = _esc(unit)
        text_dy = FRAME_H - 4.5
        for depth, start, n, name in nodes:
            x = XPAD + start * scale
            w = n * scale
            y = base_y - depth * FRAME_H
            ent = cache.get(name)
            if ent is None:
                if depth == 0:
                    fill = _ROOT_FILL
                else:
                    mod = classify(name)
                    modules_seen[mod] = None
                    fill = _color(name, mod)
                ent = cache[name] = (_esc(name), fill)
            lab = _label(name, w)
            ap(
                f'<g class="f" data-s="{start}" data-n="{n}" data-d="{depth}"><title>{ent[0]} '
                f"({n:,} {unit_x}, {100 * n / total:.2f}%)</title>"
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{rect_h}" fill="{ent[1]}"/>'
                f'<text x="{x + TEXT_PAD:.2f}" y="{y + text_dy}">'
                f"{_esc(lab) if lab else ''}</text></g>\n"
            )
    else:
        ap(
            f'<text class="empty" x="{width / 2:.1f}" y="{plot_top + FRAME_H * 2}">'
            "no samples</text>\n"
        )
    ap("</g>\n")

    ap(
        f'<text id="status" x="{XPAD}" y="{status_y}">{_HINT}</text>\n'
        f'<text id="matched" x="{width - XPAD}" y="{status_y}"></text>\n'
    )
    # legend: built-in modules in their order, then the caller's own, by name
    mods = [m for m in MODULE_LABELS if m in modules_seen]
    mods += sorted(m for m in modules_seen if m not in MODULE_LABELS)
    ap('<g id="legend">\n')
    lx = float(XPAD)
    for mod in mods:
        text = MODULE_LABELS.get(mod, mod)
        ap(
            f'<rect x="{lx:.1f}" y="{legend_y - 10}" width="12" height="12" '
            f'fill="{_legend_color(mod)}" stroke="#666" stroke-width=".5"/>'
            f'<text x="{lx + 17:.1f}" y="{legend_y}">{_esc(text)}</text>\n'
        )
        lx += 17 + len(text) * 6.6 + 24
    ap("</g>\n</svg>\n")
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# speedscope


def render_speedscope(
    profiles: Mapping[str, StacksInput],
    *,
    name: str = "pgprobe",
    hz: float | None = None,
    strip_offsets: bool = True,
) -> str:
    """speedscope JSON: one "sampled" profile per entry of ``profiles``, one shared frames table.

    Weights are sample counts (unit "none"), or seconds (count / ``hz``) when ``hz`` is given.
    """
    frame_index: dict[str, int] = {}
    frames: list[dict[str, str]] = []
    out_profiles: list[dict[str, object]] = []
    for pname, stacks in profiles.items():
        folded = _fold(stacks, strip_offsets)
        samples: list[list[int]] = []
        weights: list[float] = []
        for key in sorted(folded):
            idx: list[int] = []
            for fr in key[:-1].split(";"):
                i = frame_index.get(fr)
                if i is None:
                    i = frame_index[fr] = len(frames)
                    frames.append({"name": fr})
                idx.append(i)
            samples.append(idx)
            weights.append(folded[key] / hz if hz else folded[key])
        out_profiles.append(
            {
                "type": "sampled",
                "name": str(pname),
                "unit": "seconds" if hz else "none",
                "startValue": 0,
                "endValue": sum(weights),
                "samples": samples,
                "weights": weights,
            }
        )
    doc = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": frames},
        "profiles": out_profiles,
        "name": name,
        "activeProfileIndex": 0,
        "exporter": f"pgprobe {__version__}",
    }
    return json.dumps(doc, separators=(",", ":"))
