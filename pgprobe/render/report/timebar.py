"""The picture at the top of the report: where the DB time went, one stacked bar by wait class.

DB time is the client backends' active time over the window (on CPU, runqueue, and the wait
events they slept in while active: pgprobe.findings.timemodel); each class of
``timemodel.CLASSES`` with time is one segment, its width its share of the DB time. Idle
time (waiting for the client between transactions, Activity:*) is not DB time: the caption
gives it beside the bar, and so does the time not accounted. The geometry is here, the markup
in templates/overview.html (inline SVG, no script); every name is autoescaped text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgprobe.findings.timemodel import by_class, time_model

WIDTH, HEIGHT = 1160, 34
COLORS = {
    "on CPU": "#4caf50",
    "runqueue": "#c0ca33",
    "IO": "#1e88e5",
    "Lock": "#fb8c00",
    "LWLock": "#e53935",
    "BufferPin": "#6d4c41",
    "IPC": "#8e24aa",
    "Client": "#78909c",
    "Timeout": "#00897b",
    "other": "#9e9e9e",
}
LABELS = {
    "on CPU": "on CPU",
    "runqueue": "waiting for a CPU (runqueue)",
    "Client": "Client (active or in a transaction)",
    "other": "other (no wait event, Extension, ...)",
}


def time_bar(doc: Mapping[str, Any], width: int = WIDTH) -> dict[str, Any] | None:
    """The bar's segments and legend, or None when the document has no time model."""
    model = time_model(doc)
    if model is None:
        return None
    segments = []
    x = 0.0
    for name, seconds, pct in by_class(model):
        w = width * pct / 100
        segments.append(
            {
                "cls": name,
                "label": LABELS.get(name, name),
                "color": COLORS[name],
                "x": round(x, 2),
                "w": round(w, 2),
                "pct": round(pct, 2),
                "pct_text": f"{pct:.1f} %" if pct >= 0.05 else "< 0.05 %",
                "seconds": f"{seconds:,.2f}",
            }
        )
        x += w
    unknown = sum(c.seconds for c in model.components if c.category not in ("idle",)
                  and c.active_pct is None)  # fmt: skip
    return {
        "width": width,
        "height": HEIGHT,
        "segments": segments,
        "active_s": f"{model.active_s:,.2f}",
        "avg_active": f"{model.active_s / model.window_s:,.2f}" if model.window_s else "0",
        "idle_s": f"{model.idle_s:,.2f}",
        "unknown_s": f"{unknown:,.2f}" if unknown >= 0.005 else None,
        "window_s": f"{model.window_s:,.1f}",
    }
