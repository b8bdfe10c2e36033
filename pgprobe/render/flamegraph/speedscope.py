"""speedscope's file format (https://www.speedscope.app/file-format-schema.json) out."""

from __future__ import annotations

import json
from collections.abc import Mapping

from pgprobe import __version__
from pgprobe.render.flamegraph.folded import StacksInput, fold


def render_speedscope(
    profiles: Mapping[str, StacksInput],
    *,
    name: str = "pgprobe",
    hz: float | None = None,
    strip_offsets: bool = True,
) -> str:
    """speedscope JSON: one "sampled" profile per entry of ``profiles``, one shared frames table.

    Stacks are root first. Weights are sample counts (unit "none"), or seconds
    (count / ``hz``) when ``hz`` (the sampling frequency) is given.
    """
    frame_index: dict[str, int] = {}
    frames: list[dict[str, str]] = []
    out_profiles: list[dict[str, object]] = []
    for pname, stacks in profiles.items():
        folded = fold(stacks, strip_offsets)
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
