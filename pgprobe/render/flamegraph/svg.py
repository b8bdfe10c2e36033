"""The SVG document: frames, buttons, status line and legend, with the page's CSS and
JavaScript (flamegraph.css, flamegraph.js, package data) inline, so that the file is
self-contained: opened directly in a browser, it fetches nothing.

The JavaScript reads its settings from ``var P = {...}`` written before it (total samples,
plot width, margins, label character width, highlight colour, unit) and each frame's place
from the ``data-s`` (start sample), ``data-n`` (samples) and ``data-d`` (depth) attributes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import cache
from importlib import resources
from itertools import accumulate

from pgprobe.literal import literal
from pgprobe.render.flamegraph.colours import HIGHLIGHT, ROOT_FILL, frame_color, legend_color
from pgprobe.render.flamegraph.folded import StacksInput, fold
from pgprobe.render.flamegraph.frames import MODULE_LABELS, classify_frame
from pgprobe.render.flamegraph.layout import CHAR_W, FRAME_H, TEXT_PAD, XPAD, frame_tree, label

_HINT = "Click a frame to zoom in, Ctrl-F to search."

_XML_ESC = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})


def _xml(s: str) -> str:
    """XML-escape text already shown as text (pgprobe.literal)."""
    return s.translate(_XML_ESC)


def _esc(s: str) -> str:
    """A name as XML text or attribute value: control and bidi characters (which XML 1.0
    forbids, or which reorder what is read) written visibly as \\xNN / \\uNNNN, then escaped."""
    return _xml(literal(s))


@cache
def page_asset(name: str) -> str:
    """The text of flamegraph.css or flamegraph.js, as shipped in the package.

    The script sits in a CDATA section: a "]]>" in it would end that early, so it is refused.
    """
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    if "]]>" in text:
        raise ValueError(f"{name} contains ']]>', which would end its CDATA section")
    return text


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
    module_colours: Mapping[str, str] | None = None,
) -> str:
    """Render folded stacks as one self-contained interactive SVG document.

    module_colours: a fixed ``#rrggbb`` for some of module_of's modules (every frame
    of the module and its legend swatch), instead of a palette shade per name.
    """
    fixed = module_colours or {}
    folded = fold(stacks, strip_offsets)
    keys = sorted(folded)
    cum = [0, *accumulate(map(folded.__getitem__, keys))]
    del folded
    total = cum[-1]
    width = max(int(width), 2 * XPAD + 100)
    plotw = width - 2 * XPAD
    scale = plotw / total if total else 0.0
    if total:
        nodes, maxdepth = frame_tree(keys, cum, max(minwidth, 0.0) / scale)
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
        f"<style>\n{page_asset('flamegraph.css')}</style>\n"
    )
    cfg = {
        "total": total,
        "plotw": plotw,
        "xpad": XPAD,
        "tp": TEXT_PAD,
        "cw": CHAR_W,
        "hl": HIGHLIGHT,
        "unit": unit,
    }
    cfg_js = json.dumps(cfg).replace("<", "\\u003c").replace("]]>", "]]\\u003e")
    ap(f"<script><![CDATA[\nvar P = {cfg_js};\n\n{page_asset('flamegraph.js')}]]></script>\n")
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
        cache: dict[str, tuple[str, str, str]] = {}  # name -> (shown, escaped, fill)
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
                    fill = ROOT_FILL
                else:
                    mod = classify(name)
                    modules_seen[mod] = None
                    fill = fixed.get(mod) or frame_color(name, mod)
                shown = literal(name)  # the label is cut from what is shown
                ent = cache[name] = (shown, _xml(shown), fill)
            lab = label(ent[0], w)
            ap(
                f'<g class="f" data-s="{start}" data-n="{n}" data-d="{depth}"><title>{ent[1]} '
                f"({n:,} {unit_x}, {100 * n / total:.2f}%)</title>"
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{rect_h}" fill="{ent[2]}"/>'
                f'<text x="{x + TEXT_PAD:.2f}" y="{y + text_dy}">'
                f"{_xml(lab) if lab else ''}</text></g>\n"
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
        text = literal(MODULE_LABELS.get(mod, mod))  # measured as it is shown
        ap(
            f'<rect x="{lx:.1f}" y="{legend_y - 10}" width="12" height="12" '
            f'fill="{fixed.get(mod) or legend_color(mod)}" stroke="#666" stroke-width=".5"/>'
            f'<text x="{lx + 17:.1f}" y="{legend_y}">{_xml(text)}</text>\n'
        )
        lx += 17 + len(text) * 6.6 + 24
    ap("</g>\n</svg>\n")
    return "".join(out)
