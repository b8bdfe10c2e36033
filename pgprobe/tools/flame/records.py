"""What a flame capture is as data: one row per (pid, stack), for ``--json``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgprobe.tools import profiling


@dataclass(frozen=True)
class FlameRow:
    pid: int
    backend_type: str
    application_name: str
    stack: str  # folded, root first, without a backend frame
    samples: int

    def as_json(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "backend_type": self.backend_type,
            "application_name": self.application_name,
            "stack": self.stack,
            "samples": self.samples,
        }


def flame_rows(profile: profiling.Profile) -> list[FlameRow]:
    """Every (pid, stack) of the capture, most samples first, then by pid and stack."""
    rows: list[FlameRow] = []
    for pid, stacks in profile.folded_by_pid().items():
        backend = profile.describe(pid)
        for stack, n in stacks.items():
            rows.append(FlameRow(pid, backend.backend_type, backend.application_name, stack, n))
    rows.sort(key=lambda r: (-r.samples, r.pid, r.stack))
    return rows


def json_rows(profile: profiling.Profile) -> list[dict[str, Any]]:
    return [r.as_json() for r in flame_rows(profile)]
