"""What a flame capture is as data: one row per (pid, stack), for ``--json`` (with
``--by query``, per (pid, statement, stack))."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pgprobe.stacks import fold
from pgprobe.symbolize import UNKNOWN
from pgprobe.tools import profiling


@dataclass(frozen=True)
class FlameRow:
    pid: int
    backend_type: str
    application_name: str
    stack: str  # folded, root first, without a backend frame
    samples: int
    part: tuple[str, int | None, str] | None = None  # --by query: kind, query id, its name

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "pid": self.pid,
            "backend_type": self.backend_type,
            "application_name": self.application_name,
        }
        if self.part is not None:
            row.update(kind=self.part[0], query_id=self.part[1], statement=self.part[2])
        row.update(stack=self.stack, samples=self.samples)
        return row


def flame_rows(profile: profiling.Profile, by_query: bool = False) -> list[FlameRow]:
    """Every (pid, [statement,] stack) of the capture, most samples first, then by pid and
    stack."""
    counts: dict[tuple[int, tuple[int, int] | None, str], int] = {}
    for s in profile.stacks:
        key = (s.pid, (s.query or (0, 0)) if by_query else None,
               fold(profile.frame_names(s) or [UNKNOWN]))  # fmt: skip
        counts[key] = counts.get(key, 0) + s.count
    rows: list[FlameRow] = []
    for (pid, query, stack), n in counts.items():
        backend = profile.describe(pid)
        part = None
        if query is not None:
            p = profile.parts[query]
            part = (p.kind, p.query_id, profile.part_names.get(query, ""))
        rows.append(FlameRow(pid, backend.backend_type, backend.application_name, stack, n, part))
    rows.sort(key=lambda r: (-r.samples, r.pid, r.stack, str(r.part)))
    return rows


def json_rows(profile: profiling.Profile, by_query: bool = False) -> list[dict[str, Any]]:
    return [r.as_json() for r in flame_rows(profile, by_query)]
