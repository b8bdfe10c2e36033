"""Findings: the rules that turn a triage document into plain advice a DBA can act on.

Input is the document `pgprobe triage --json` prints (see the README of `pgprobe triage`):
``meta``, ``waits`` (the time model; absent from documents older than it), ``lwlocks``,
``clog_reads``, ``hot``, ``flame``, ``activity`` and ``stats``, any of which may be null when
that part could not run (``meta.warnings`` then says why).

Where things are
----------------
- ``base``: the ``Finding`` type, ``SEVERITIES``, the ``RULES`` registry and ``@rule``;
- ``document``: reading the document (missing keys and null sections are "no data"), the
  section names and titles, ``section_reason``;
- ``fmt``: numbers in the words of a finding (one style for all rules);
- ``timemodel``: the client backends' exact time model, read from ``doc["waits"]``;
- one module per area, each holding its rules, their thresholds (named constants with the
  reason for the value) and their advice: ``locks`` (LWLock tranches), ``slru`` (SLRU reads),
  ``cpu`` (on-CPU samples), ``waits`` (wait events: exact time from the time model, else
  pg_stat_activity samples), ``server_stats``
  (pg_stat_database, bgwriter/checkpointer, WAL, statements, connections), ``capture``
  (what the evidence is worth).

A new rule is a function ``doc -> list[Finding]`` decorated with ``@rule`` in the module of its
area (a new area is a new module imported below), with a test named ``test_<rule>_...`` in
tests/test_findings.py on recorded data.

API
---

``evaluate(doc) -> list[Finding]``
    Run every rule of ``RULES`` on ``doc`` and return the findings ranked by ``rank_key``: the
    largest share of DB time first, then those without a share, most severe first (then by
    magnitude). A rule that raises on unexpected data becomes an "info" finding naming the rule
    instead of failing the report. When no rule finds anything about the server (capture
    quality aside), the list holds one "info" finding saying that nothing stands out.

``Finding(id, severity, title, evidence, next_step, magnitude=0.0, section="", share=None,
lead="")``
    ``severity`` is one of ``SEVERITIES`` ("high", "medium", "low", "info"); ``title`` is the
    one-line diagnosis, ``evidence`` the numbers behind it, ``next_step`` what to check or
    change. ``magnitude`` orders findings of equal severity (a percent-like size of the
    problem); ``section`` names the report section holding the data ("timemodel",
    "lwlocks", "slru", "waits", "cpu", "sql", "capture"). ``share`` is the percent of DB time
    (the client backends' active time) the finding explains, None when it explains no measured
    part of it; ``lead`` the next step in at most twelve words (``leads.lead_of(id)`` unless
    given). ``as_json()`` gives the dict stored in ``doc["findings"]``.

``findings(doc) -> list[Finding]``
    The same as ``evaluate(doc)``.

``findings_json(doc) -> list[dict]``
    ``[f.as_json() for f in evaluate(doc)]``: what goes into the document's ``findings``.

``render_text(findings) -> str``
    The findings as plain text for a terminal, one block each. It stays here rather than in
    pgprobe.render: it is ten lines over the ``Finding`` fields, and findings must not import
    the render layer (the HTML report, which does, imports findings).

``section_reason(doc, name) -> str``
    Why the section ``name`` of ``doc`` is null: the warnings of ``meta.warnings`` that mention
    it, or "no reason was recorded".

``rank_key(finding_dict)``
    The order of findings: largest share first, then by severity, magnitude and id (the
    report sorts a document's findings with it too).

``RULES`` order does not matter: ``evaluate`` sorts with ``rank_key``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# The area modules register their rules in RULES when imported.
from pgprobe.findings import capture, cpu, fmt, locks, server_stats, slru, waits  # noqa: F401
from pgprobe.findings.base import (
    LEAD_MAX_WORDS,
    RULES,
    SEVERITIES,
    Doc,
    Finding,
    Rule,
    rank_key,
    rule,
)
from pgprobe.findings.document import (
    SECTION_TITLES,
    SECTIONS,
    as_number,
    avg_active,
    duration_s,
    section,
    section_reason,
    section_rows,
    sections_of,
    stats_view,
)
from pgprobe.findings.leads import lead_of

__all__ = [
    "LEAD_MAX_WORDS",
    "RULES",
    "SECTION_TITLES",
    "SECTIONS",
    "SEVERITIES",
    "Doc",
    "Finding",
    "Rule",
    "as_number",
    "evaluate",
    "findings",
    "rank_key",
    "findings_json",
    "lead_of",
    "render_text",
    "rule",
    "section_reason",
    "sections_of",
]


def _nothing_stands_out(doc: Doc) -> Finding:
    facts = []
    active = avg_active(doc)
    if active is not None:
        facts.append(f"{fmt.n(active)} backends active on average")
    lw = section_rows(doc, "lwlocks")
    if lw or doc.get("lwlocks") is not None:
        total = sum(as_number(r.get("total_us")) for r in lw) / 1e6
        facts.append(f"{fmt.secs(total)} of LWLock waits")
    flame = section(doc, "flame")
    if flame:
        facts.append(f"{fmt.n(as_number(flame.get('samples')))} CPU samples")
    db = stats_view(doc, "database")
    duration = duration_s(doc)
    if db and duration:
        facts.append(f"{fmt.n(as_number(db.get('xact_commit')) / duration)} commits/s")
    return Finding(
        id="nothing",
        severity="info",
        title="Nothing stands out in this window",
        evidence=fmt.join([*facts, f"in {fmt.secs(duration)}" if duration else ""]),
        next_step="if users still see slowness, capture again while it happens, target the "
        "slow sessions (--pid), and check the client side (network, connection pool)",
        section="",
    )


def evaluate(doc: Doc) -> list[Finding]:
    """Every rule on `doc`; most severe first, then largest first."""
    found: list[Finding] = []
    for fn in RULES:
        try:
            found.extend(fn(doc))
        except Exception as exc:  # one odd value must not cost the whole report
            found.append(
                Finding(
                    id=f"rule-error.{fn.__name__}",
                    severity="info",
                    title=f"The rule {fn.__name__} could not read this document",
                    evidence=f"{type(exc).__name__}: {exc}",
                    next_step="report this to pgprobe's maintainers with the --json document",
                    section="capture",
                )
            )
    if not any(not f.about_capture for f in found):
        found.append(_nothing_stands_out(doc))
    found.sort(key=lambda f: rank_key(f.as_json()))
    return found


def findings(doc: Doc) -> list[Finding]:
    """The same as evaluate(doc)."""
    return evaluate(doc)


def findings_json(doc: Doc) -> list[dict[str, Any]]:
    """What goes into the document's `findings`."""
    return [f.as_json() for f in evaluate(doc)]


def render_text(findings: Iterable[Finding]) -> str:
    """Findings as plain text for a terminal."""
    out = []
    for f in findings:
        out.append(f"[{f.severity.upper()}] {f.title}")
        if f.evidence:
            out.append(f"    evidence:  {f.evidence}")
        if f.next_step:
            out.append(f"    next step: {f.lead}")
            out.append(f"    details:   {f.next_step}")
    return "\n".join(out) + ("\n" if out else "")
