"""The Finding type and the rule registry.

A rule is a function ``doc -> list[Finding]`` registered with ``@rule``; ``RULES`` holds
them all once the area modules are imported (pgprobe.findings imports them). Rules grade
a value against their thresholds with ``severity_of`` and cap it with ``at_most``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

SEVERITIES = ("high", "medium", "low", "info")
RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what, the numbers that show it, and what to do next."""

    id: str
    severity: str
    title: str
    evidence: str
    next_step: str
    magnitude: float = 0.0
    section: str = ""

    def __post_init__(self) -> None:
        if self.severity not in RANK:
            raise ValueError(f"severity must be one of {SEVERITIES}: {self.severity!r}")

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["magnitude"] = round(self.magnitude, 2)
        return data

    @property
    def about_capture(self) -> bool:
        """A note on the capture itself rather than on the server."""
        return self.id.startswith("capture.") or self.id.startswith("rule-error.")


Doc = Mapping[str, Any]
Rule = Callable[[Doc], list[Finding]]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    """Register a rule (decorator)."""
    RULES.append(fn)
    return fn


def severity_of(value: float, high: float, medium: float, low: float | None = None) -> str | None:
    """The severity of a value against its thresholds (None: below them all)."""
    if value >= high:
        return "high"
    if value >= medium:
        return "medium"
    if low is not None and value >= low:
        return "low"
    return None


def at_most(severity: str, cap: str) -> str:
    return severity if RANK[severity] >= RANK[cap] else cap
