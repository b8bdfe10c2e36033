"""Reading a triage document: sections, rows, durations, activity samples.

Every accessor treats missing keys, null sections and malformed values as "no data", never
as an error, so that a rule sees an empty list or 0 rather than raising. ``section_reason``
says why a section is null, from the free-text ``meta.warnings``.
"""

from __future__ import annotations

import re
from typing import Any

from pgprobe.findings.base import Doc

SECTIONS = ("lwlocks", "clog_reads", "hot", "flame", "activity", "stats")
# The time model came later: a document without the key predates it (nothing is missing).
LATER_SECTIONS = ("waits",)
SECTION_TITLES = {
    "waits": "time model (exact)",
    "lwlocks": "LWLock waits",
    "clog_reads": "SLRU reads",
    "hot": "top functions (CPU)",
    "flame": "flame graph (CPU)",
    "activity": "wait-event sampling",
    "stats": "statistics deltas",
}
# What a warning about a section is likely to say (warnings are free text): whole words.
_SECTION_WORDS = {
    "waits": re.compile(r"^waits\b|\btime model\b|\bmy_wait_event_info\b", re.I),
    "lwlocks": re.compile(r"\b(lwlocks?|lwlock__wait\w*|usdt)\b", re.I),
    "clog_reads": re.compile(r"\b(clog[_-]reads?|clog|slru|pg_xact)\b", re.I),
    "hot": re.compile(r"\b(hot|profile|profiling|cpu sampl\w*|perf_event\w*)\b", re.I),
    "flame": re.compile(r"\b(flame|profile|profiling|cpu sampl\w*|perf_event\w*)\b", re.I),
    "activity": re.compile(r"\b(pg_stat_activity|activity|sampler)\b", re.I),
    "stats": re.compile(
        r"\b(stats|statistics|counters|pg_stat_(database|bgwriter|checkpointer|wal|slru|"
        r"statements))\b",
        re.I,
    ),
}


def sections_of(doc: Doc) -> tuple[str, ...]:
    """The sections `doc` should have: SECTIONS, and the later ones its triage knew of."""
    return tuple(n for n in LATER_SECTIONS if n in doc) + SECTIONS


# ---------------------------------------------------------------------------------------------
# Reading the document: missing keys and null sections are "no data", never an error.


def section(doc: Doc, name: str) -> dict[str, Any] | None:
    value = doc.get(name)
    return value if isinstance(value, dict) else None


def section_rows(doc: Doc, name: str) -> list[dict[str, Any]]:
    sec = section(doc, name)
    rows = sec.get("rows") if sec else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def as_number(value: Any) -> float:
    """A number from a document field of any type (missing or malformed: 0)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def doc_meta(doc: Doc) -> dict[str, Any]:
    meta = doc.get("meta")
    return meta if isinstance(meta, dict) else {}


def duration_s(doc: Doc, part: str | None = None) -> float:
    """Seconds the section (or the whole capture) covered; 0 when unknown."""
    if part:
        sec = section(doc, part)
        smeta = sec.get("meta") if sec else None
        if isinstance(smeta, dict) and as_number(smeta.get("duration_s")) > 0:
            return as_number(smeta["duration_s"])
    return as_number(doc_meta(doc).get("duration_s"))


def stats_view(doc: Doc, name: str) -> dict[str, Any] | None:
    stats = section(doc, "stats")
    value = stats.get(name) if stats else None
    return value if isinstance(value, dict) else None


def activity_samples(doc: Doc) -> list[dict[str, Any]]:
    act = section(doc, "activity")
    samples = act.get("samples") if act else None
    return [s for s in samples if isinstance(s, dict)] if isinstance(samples, list) else []


def avg_active(doc: Doc) -> float | None:
    samples = activity_samples(doc)
    if not samples:
        return None
    return sum(as_number(s.get("active")) for s in samples) / len(samples)


def max_clients(doc: Doc) -> int | None:
    samples = activity_samples(doc)
    return max(int(as_number(s.get("total"))) for s in samples) if samples else None


def major_version(doc: Doc) -> int:
    num = int(as_number(doc_meta(doc).get("postgres_version_num")))
    return num // 10000 if num >= 100000 else num // 100


def section_reason(doc: Doc, name: str) -> str:
    """Why section `name` is null: the warnings that mention it, or a plain default."""
    warnings = [str(w) for w in doc_meta(doc).get("warnings") or [] if w]
    rx = _SECTION_WORDS.get(name) or re.compile(rf"\b{re.escape(name)}\b", re.I)
    hits = [w for w in warnings if rx.search(w)]
    return "; ".join(hits) if hits else "no reason was recorded (meta.warnings says nothing)"
