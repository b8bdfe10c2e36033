"""How triage is shown on a terminal: the time model, the findings, where the report is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pgprobe import findings
from pgprobe.findings.timemodel import by_class, time_model
from pgprobe.literal import literal
from pgprobe.tools import common

# Lines of the time model shown in the summary (the report has them all).
MODEL_LINES = 8


def time_model_lines(doc: dict[str, Any]) -> list[str]:
    """The client backends' time model in a few lines, or one line saying why there is none."""
    model = time_model(doc)
    if model is None:
        if "waits" not in doc:
            return []
        return [f"time model: unavailable: {findings.section_reason(doc, 'waits')}"]
    head = (
        f"time model (exact): {model.active_s:,.2f} s active, {model.idle_s:,.2f} s idle "
        f"of {model.backend_s:,.1f} backend-seconds over {model.window_s:,.1f} s"
    )
    active = [c for c in model.components if c.active_pct is not None and c.seconds > 0]
    if not active:
        return [head, "  no client backend was active in the window"]
    classes = ", ".join(f"{name} {pct:.1f} %" for name, _, pct in by_class(model))
    lines = [head, f"  DB time by class: {classes}"]
    for c in sorted(active, key=lambda c: -c.seconds)[:MODEL_LINES]:
        sampled = f"   sampled {c.sampled_pct:5.1f} %" if c.sampled_pct is not None else ""
        lines.append(
            f"  {c.name:<34} {c.seconds:9.3f} s {c.active_pct or 0.0:5.1f} % of active{sampled}"
        )
    return lines


def print_summary(doc: dict[str, Any], output: Path | None) -> None:
    """Each line shown as text: findings quote queries, function and application names.
    output: where the report was written (None: it was not)."""
    meta = doc["meta"]
    print(
        literal(
            f"pgprobe triage: {meta['duration_s']:.0f} s of PostgreSQL "
            f"{meta['postgres_version'].split()[0]} (postmaster {meta['postmaster_pid']})"
        )
    )
    model = time_model_lines(doc)
    if model:
        print()
        print("\n".join(literal(line) for line in model))
    for finding in sorted(doc["findings"], key=findings.rank_key):
        print()
        share = finding.get("share")
        of_db = f" ({share:.1f} % of DB time)" if isinstance(share, (int, float)) else ""
        print(literal(f"[{finding['severity'].upper()}]{of_db} {finding['title']}"))
        if finding.get("evidence"):
            print(literal(f"  evidence: {finding['evidence']}"))
        if finding.get("next_step"):
            lead = finding.get("lead") or findings.lead_of(str(finding.get("id") or ""))
            print(literal(f"  next: {lead}"))
            print(literal(f"        {finding['next_step']}"))
    for warning in meta["warnings"]:
        common.warn(warning)
    if output is not None:
        print(f"\nreport: {literal(str(output.resolve()))}")
