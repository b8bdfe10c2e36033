"""Frame colours: a palette per module, a shade within it from a CRC-32 of the frame's name.

A function has the same colour in every graph. Modules other than the built-in ones
(``frames.MODULE_LABELS``) get one of five extra palettes, also chosen by CRC-32.
"""

from __future__ import annotations

import zlib

Palette = tuple[int, int, int, int, int, int]

# (red lo, red span, green lo, green span, blue lo, blue span), spans scaled by three
# fractions taken from the name's CRC-32.
_PALETTES: dict[str, Palette] = {
    "postgres": (205, 50, 50, 170, 0, 55),  # red .. orange .. yellow
    "kernel": (100, 60, 150, 50, 225, 30),  # blue
    "libc": (100, 60, 190, 45, 80, 50),  # green
    "lib": (180, 40, 145, 35, 225, 30),  # lavender
    "unresolved": (165, 0, 165, 0, 165, 0),  # grey (span via the shared fraction below)
}
_EXTRA_PALETTES: list[Palette] = [
    (60, 50, 195, 35, 195, 35),  # teal
    (230, 25, 140, 50, 170, 50),  # pink
    (180, 40, 140, 40, 80, 40),  # tan
    (150, 50, 180, 40, 40, 40),  # olive
    (80, 40, 215, 40, 235, 20),  # cyan
]
HIGHLIGHT = "#e600e6"  # frames matched by a search
ROOT_FILL = "#d9d9d9"  # the "all" frame


def _palette(module: str) -> Palette:
    p = _PALETTES.get(module)
    if p is None:
        p = _EXTRA_PALETTES[zlib.crc32(module.encode("utf-8", "surrogatepass")) % 5]
    return p


def frame_color(name: str, module: str) -> str:
    """``#rrggbb`` of a frame named ``name`` in ``module``."""
    h = zlib.crc32(name.encode("utf-8", "surrogatepass"))
    a, b, c = (h & 1023) / 1023, ((h >> 10) & 1023) / 1023, ((h >> 20) & 1023) / 1023
    r0, rs, g0, gs, b0, bs = _palette(module)
    if module == "unresolved":
        v = round(165 + 45 * a)
        return f"#{v:02x}{v:02x}{v:02x}"
    return f"#{round(r0 + rs * c):02x}{round(g0 + gs * a):02x}{round(b0 + bs * b):02x}"


def legend_color(module: str) -> str:
    """The middle of a module's palette, for its legend swatch."""
    r0, rs, g0, gs, b0, bs = _palette(module)
    return f"#{r0 + rs // 2:02x}{g0 + gs // 2:02x}{b0 + bs // 2:02x}"
