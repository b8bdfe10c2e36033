"""The wait-event timeline: stacked bars of active backends per pg_stat_activity sample.

``timeline_svg(activity, width=1160, height=300) -> str`` computes the geometry here (axis
ticks, bar positions, legend, tooltips) and draws it with templates/timeline.svg. Each bar is
one sample: its active client backends by wait event type, bottom first in ``WAIT_COLORS``
order; what the active backends did not wait on is "Client" (talking to their client).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pgprobe.findings import as_number as num
from pgprobe.render.report.templating import render

# Wait event types in the timeline, in stacking order (bottom first), with their colours.
WAIT_COLORS: dict[str, str] = {
    "CPU": "#4caf50",
    "LWLock": "#e53935",
    "Lock": "#fb8c00",
    "IO": "#1e88e5",
    "IPC": "#8e24aa",
    "BufferPin": "#6d4c41",
    "Timeout": "#00897b",
    "Extension": "#d81b60",
    "Client": "#b0bec5",
}
OTHER_COLOR = "#757575"
WAIT_LABELS = {
    "CPU": "CPU (no wait event)",
    "Client": "Client (active, talking to the client)",
}
LEFT, RIGHT, TOP_PAD, BOTTOM = 56, 16, 40, 46


def _wait_type(key: str) -> str:
    return "CPU" if key == "CPU" else key.split(":", 1)[0] or "other"


def _nice_ceiling(value: float) -> tuple[float, float]:
    """(top of the axis, tick step) for a maximum value: integers, at most ~6 ticks."""
    if value <= 0:
        return 1.0, 1.0
    raw = value / 5
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    step = max(1.0, step)
    return math.ceil(value / step) * step, step


Sample = tuple[float, dict[str, float], dict[str, float]]  # (t, by type, by event)


def _samples(activity: Mapping[str, Any]) -> list[Sample]:
    """Each sample's active backends by wait event type (and by event, for the tooltips)."""
    out: list[Sample] = []
    for s in activity.get("samples") or []:
        if not isinstance(s, dict):
            continue
        raw = s.get("waits")
        waits = {str(k): num(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        by_type: dict[str, float] = {}
        for key, n in waits.items():
            typ = _wait_type(key)
            by_type[typ] = by_type.get(typ, 0.0) + n
        rest = num(s.get("active")) - sum(by_type.values())
        if rest > 0:
            by_type["Client"] = by_type.get("Client", 0.0) + rest
        out.append((num(s.get("t")), by_type, waits))
    return out


@dataclass(frozen=True)
class _Plot:
    """Where the plot area is, and how values map onto it."""

    width: int
    height: int
    span: float  # seconds on the x axis
    top: float  # backends at the top of the y axis

    @property
    def w(self) -> int:
        return self.width - LEFT - RIGHT

    @property
    def h(self) -> int:
        return self.height - TOP_PAD - BOTTOM

    @property
    def y0(self) -> int:
        return TOP_PAD + self.h

    def x(self, t: float) -> float:
        return LEFT + self.w * t / self.span


def _bars(plot: _Plot, samples: list[Sample], order: list[str], slot: float) -> list[Any]:
    bar_w = max(1.0, slot * 0.78)
    bars = []
    for t_s, by_type, waits in samples:
        x = plot.x(t_s) + (slot - bar_w) / 2
        y = float(plot.y0)
        total = sum(by_type.values())
        for typ in order:
            n = by_type.get(typ, 0.0)
            if n <= 0:
                continue
            h = plot.h * n / plot.top
            y -= h
            events = sorted(
                ((k, c) for k, c in waits.items() if _wait_type(k) == typ), key=lambda kc: -kc[1]
            )
            detail = ", ".join(f"{k.split(':', 1)[-1]} {c:g}" for k, c in events if ":" in k)
            tip = f"{t_s:.1f} s: {WAIT_LABELS.get(typ, typ)} {n:g} of {total:g} active" + (
                f" ({detail})" if detail else ""
            )
            bars.append(
                {
                    "type": typ,
                    "x": f"{x:.2f}",
                    "y": f"{y:.2f}",
                    "w": f"{bar_w:.2f}",
                    "h": f"{h:.2f}",
                    "color": WAIT_COLORS.get(typ, OTHER_COLOR),
                    "tip": tip,
                }
            )
    return bars


def timeline_svg(activity: Mapping[str, Any], width: int = 1160, height: int = 300) -> str:
    """Stacked bars of active backends per sample, by wait event type, as inline SVG."""
    samples = _samples(activity)
    interval = num(activity.get("interval_s")) or 1.0
    seen = {t: None for _, by_type, _ in samples for t in by_type}
    order = [t for t in WAIT_COLORS if t in seen] + sorted(t for t in seen if t not in WAIT_COLORS)
    top, step = _nice_ceiling(max((sum(b.values()) for _, b, _ in samples), default=0.0))
    span = max((t for t, _, _ in samples), default=0.0) + interval
    plot = _Plot(width, height, span, top)
    legend, lx = [], float(LEFT)
    for t in order:
        label = WAIT_LABELS.get(t, t)
        color = WAIT_COLORS.get(t, OTHER_COLOR)
        legend.append({"x": f"{lx:.1f}", "tx": f"{lx + 17:.1f}", "color": color, "label": label})
        lx += 17 + len(label) * 6.8 + 18
    yticks, v = [], 0.0
    while v <= top + 1e-9:
        y = plot.y0 - plot.h * v / top
        yticks.append({"y": f"{y:.1f}", "ty": f"{y + 4:.1f}", "base": v == 0, "label": f"{v:g}"})
        v += step
    # x axis: about ten labels, on whole seconds
    xticks, xstep, xv = [], _nice_ceiling(span * 5 / 10)[1] if span > 10 else 1.0, 0.0
    while xv <= span + 1e-9:
        xticks.append({"x": f"{plot.x(xv):.1f}", "label": f"{xv:g}"})
        xv += xstep
    return render(
        "timeline.svg",
        width=width,
        height=height,
        left=LEFT,
        right_x=LEFT + plot.w,
        y0=plot.y0,
        tick_y=plot.y0 + 4,
        tick_label_y=plot.y0 + 17,
        mid_x=f"{LEFT + plot.w / 2:.1f}",
        mid_y=f"{TOP_PAD + plot.h / 2:.1f}",
        label_x=LEFT - 6,
        xlabel_y=height - 6,
        legend=legend,
        yticks=yticks,
        xticks=xticks,
        bars=_bars(plot, samples, order, plot.w * interval / span),
        empty=not any(sum(b.values()) for _, b, _ in samples),
    ).rstrip("\n")
