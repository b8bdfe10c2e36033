"""Which frames are drawn, and where: the merged tree walked over sorted stack strings.

Geometry in pixels; a frame's place is given in samples (start, count) and depth, so the
browser can redo the layout after a zoom with the same numbers (flamegraph.js).
"""

from __future__ import annotations

from bisect import bisect_left

XPAD = 10  # left and right margin, px
FRAME_H = 16  # height of a row, px
FONT = 12  # label font size, px
CHAR_W = FONT * 0.59  # average label character width, px (flamegraph.pl's estimate)
TEXT_PAD = 3  # space between a frame's edge and its label, px

#: (depth, start sample, sample count, name)
Node = tuple[int, int, int, str]


def frame_tree(keys: list[str], cum: list[int], threshold: float) -> tuple[list[Node], int]:
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
    nodes: list[Node] = [(0, 0, total, "all")]
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


def label(name: str, w: float) -> str:
    """The part of ``name`` that fits in a frame ``w`` px wide (``..`` when cut, as
    flamegraph.pl), or nothing when fewer than three characters fit."""
    chars = int((w - 2 * TEXT_PAD) / CHAR_W)
    if chars < 3:
        return ""
    return name if len(name) <= chars else name[: chars - 2] + ".."
