"""The Finding type and the rule registry.

A rule is a function ``doc -> list[Finding]`` registered with ``@rule``; ``RULES`` holds
them all once the area modules are imported (pgprobe.findings imports them). Rules grade
a value against their thresholds with ``severity_of`` and cap it with ``at_most``.

A finding's ``share`` is the share of DB time (the client backends' active time: on CPU,
runqueue and wait events) it explains, in percent; None when it explains no measured part
of it (server counters, capture notes). ``rank_key`` orders findings by it: the largest
share first, then those without one, most severe first. ``lead`` is the next step in at most
``LEAD_MAX_WORDS`` words, from pgprobe.findings.leads by the finding's id unless given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pgprobe.findings.leads import lead_of

SEVERITIES = ("high", "medium", "low", "info")
RANK = {s: i for i, s in enumerate(SEVERITIES)}
LEAD_MAX_WORDS = 12


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
    share: float | None = None  # percent of DB time (client backends' active time) explained
    lead: str = ""  # the next step in a few words (default: pgprobe.findings.leads)

    def __post_init__(self) -> None:
        if self.severity not in RANK:
            raise ValueError(f"severity must be one of {SEVERITIES}: {self.severity!r}")
        if not self.lead:
            object.__setattr__(self, "lead", lead_of(self.id))

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["magnitude"] = round(self.magnitude, 2)
        data["share"] = None if self.share is None else round(self.share, 2)
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


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def rank_key(f: Mapping[str, Any]) -> tuple[int, float, int, float, str]:
    """The order of findings (as_json dicts): largest share of DB time first, then those
    without a share, most severe first, then by magnitude and id."""
    share = f.get("share")
    has = isinstance(share, (int, float)) and not isinstance(share, bool)
    return (
        0 if has else 1,
        -_number(share),
        RANK.get(str(f.get("severity")), len(RANK)),
        -_number(f.get("magnitude")),
        str(f.get("id") or ""),
    )
