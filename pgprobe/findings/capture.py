"""Capture quality: what the evidence is worth (sections that could not run, lost events,
unresolved stack frames). These findings are about the capture, not the server
(``Finding.about_capture``).
"""

from __future__ import annotations

from pgprobe.findings import fmt
from pgprobe.findings.base import Doc, Finding, rule
from pgprobe.findings.cpu import CpuProfile, cpu_profile
from pgprobe.findings.document import (
    SECTION_TITLES,
    as_number,
    doc_meta,
    duration_s,
    major_version,
    section,
    section_reason,
    sections_of,
)

# A flame graph with a fifth of its frames unnamed hides where the time goes.
UNRESOLVED_PCT = 20.0


@rule
def capture_sections(doc: Doc) -> list[Finding]:
    out = []
    for name in sections_of(doc):
        reason = section_reason(doc, name)
        if doc.get(name) is None and name == "lwlocks" and "USDT" in reason:
            out.append(
                Finding(
                    id="capture.missing.lwlocks",
                    severity="low",
                    title="No LWLock table: the server has no USDT probes",
                    evidence=f"unavailable: {reason}",
                    next_step="LWLock waits still show as wait events (type LWLock) in the "
                    "wait-event sampling and in `pgprobe waits`; for per-tranche counts and "
                    "times, a build with --enable-dtrace (Debian, Ubuntu and PGDG packages)",
                    section="capture",
                )
            )
        elif doc.get(name) is None:
            out.append(
                Finding(
                    id=f"capture.missing.{name}",
                    severity="low",
                    title=f"No {SECTION_TITLES[name]} in this report",
                    evidence=f"unavailable: {reason}",
                    next_step="run `pgprobe doctor` to see what this machine can trace, fix "
                    "it, and capture again",
                    section="capture",
                )
            )
    return out


@rule
def capture_losses(doc: Doc) -> list[Finding]:
    losses = doc_meta(doc).get("losses")
    if not isinstance(losses, dict):
        return []
    lost = {k: as_number(v) for k, v in losses.items() if as_number(v) > 0}
    if not lost:
        return []
    what = ", ".join(f"{fmt.n(v)} {k}" for k, v in lost.items())
    return [
        Finding(
            id="capture.losses",
            severity="low",
            title=f"The capture lost events ({what}): its counts are lower bounds",
            evidence=f"meta.losses: {what}",
            next_step="capture for a shorter time, with a lower sampling rate (-F), or with "
            "fewer backends targeted (--pid) to stay within the kernel's buffers and maps",
            magnitude=sum(lost.values()),
            section="capture",
        )
    ]


@rule
def capture_server_gone(doc: Doc) -> list[Finding]:
    """The server stopped, crashed or restarted mid-capture: the SQL side is cut short."""
    gone = doc_meta(doc).get("server_went_away")
    if not isinstance(gone, dict):
        return []
    kept = as_number(gone.get("sql_window_s"))
    return [
        Finding(
            id="capture.server_gone",
            severity="medium",
            title=f"{str(gone.get('what', 'the server went away')).capitalize()} during the "
            f"capture, at {gone.get('at', '?')}: the SQL sections stop there",
            evidence=f"{gone.get('reason', '')}; PostgreSQL's statistics and pg_stat_activity "
            f"cover the first {fmt.secs(kept)} of {fmt.secs(duration_s(doc))}, the probes the "
            "whole window",
            next_step="read the server log around that time (a crash, an OOM kill, a shutdown "
            "or restart by an administrator), then capture again once it is back",
            section="capture",
        )
    ]


def _truncated_stacks(profile: CpuProfile) -> dict[str, int]:
    """Samples whose stack ends in '[truncated: why]' (pgprobe.unwind.truncation), per why."""
    out: dict[str, int] = {}
    for frames, n in profile.stacks:
        root = frames[0] if frames else ""
        if root.startswith("[truncated: "):
            why = root.removeprefix("[truncated: ").removesuffix("]")
            out[why] = out.get(why, 0) + n
    return out


@rule
def capture_unresolved(doc: Doc) -> list[Finding]:
    pct = as_number(doc_meta(doc).get("unresolved_pct"))
    profile = cpu_profile(doc)
    if pct < UNRESOLVED_PCT or profile is None:
        return []
    cut = _truncated_stacks(profile)
    if sum(cut.values()) >= 0.2 * profile.samples:
        reason, _ = max(cut.items(), key=lambda kv: kv[1])
        share = 100.0 * sum(cut.values()) / profile.samples
        return [
            Finding(
                id="capture.unresolved",
                severity="low",
                title=f"{fmt.pct(share)} of CPU stacks are cut short ({reason}): "
                "the frame-pointer walk cannot pass code built without frame pointers",
                evidence=f"meta.unresolved_pct {fmt.n(pct)}; {fmt.n(sum(cut.values()))} of "
                f"{fmt.n(profile.samples)} CPU samples end in [truncated: ...] frames",
                next_step="profile again with `pgprobe flame --unwind dwarf` (perf copies the "
                "stack and pgprobe unwinds it with .eh_frame): debug symbols would not help",
                magnitude=share,
                section="capture",
            )
        ]
    hot_meta = (section(doc, "hot") or {}).get("meta") or {}
    symbols = str(hot_meta.get("server_symbols", ""))
    if symbols == "symtab" or symbols.startswith("debug file"):
        # Every function of the server has a name: what is unnamed is not the server's code
        # but addresses read by a stack walk of code built without frame pointers.
        return [
            Finding(
                id="capture.unresolved",
                severity="low",
                title=f"{fmt.pct(pct)} of stack frames are unresolved although the server has "
                "full symbols: its stacks were walked without frame pointers",
                evidence=f"meta.unresolved_pct {fmt.n(pct)} over {fmt.n(profile.samples)} CPU "
                f"samples; server symbols: {symbols}; server binary "
                f"{doc_meta(doc).get('server_binary', '?')}",
                next_step="trust the leaf functions (the top functions table), not the call "
                "chains under them; `pgprobe flame --unwind dwarf` gives whole stacks",
                magnitude=pct,
                section="capture",
            )
        ]
    stripped = hot_meta.get("stripped_frames_pct")
    if isinstance(stripped, dict) and stripped:
        return [_stripped_finding(doc, pct, profile, stripped, hot_meta.get("debug_packages"))]
    major = major_version(doc)
    pkgs = (
        f"postgresql-{major}-dbgsym (Debian/Ubuntu, from the debug archive) or "
        f"postgresql{major}-server-debuginfo (RHEL/PGDG)"
        if major
        else "the server's debug symbols package"
    )
    return [
        Finding(
            id="capture.unresolved",
            severity="low",
            title=f"{fmt.pct(pct)} of stack frames are unresolved (postgres+0x...): install the "
            "debug symbols",
            evidence=f"meta.unresolved_pct {fmt.n(pct)} over {fmt.n(profile.samples)} CPU samples; "
            f"server binary {doc_meta(doc).get('server_binary', '?')}",
            next_step=f"install {pkgs} and capture again: the flame graph and the top "
            "functions then name the server's static functions",
            magnitude=pct,
            section="capture",
        )
    ]


def _stripped_finding(
    doc: Doc, pct: float, profile: CpuProfile, stripped: dict[str, object], packages: object
) -> Finding:
    """Unnamed frames that are static functions of stripped files, per file, and the packages."""
    shares = {str(m): as_number(v) for m, v in stripped.items()}
    share = sum(shares.values())
    parts = ", ".join(f"{m} {fmt.pct(v)}" for m, v in shares.items())
    names = [str(p) for p in packages] if isinstance(packages, list) else []
    fix = (
        f"install {', '.join(names)} (Debian/Ubuntu: from the debug archive, debian-debug)"
        if names
        else "install the debug symbols of those files (their -dbgsym or -debuginfo packages)"
    )
    return Finding(
        id="capture.unresolved",
        severity="low",
        title=f"{fmt.pct(share)} of stack frames are static functions of stripped files "
        f"({parts}): install their debug symbols",
        evidence=f"meta.unresolved_pct {fmt.n(pct)} over {fmt.n(profile.samples)} CPU samples; "
        f"server binary {doc_meta(doc).get('server_binary', '?')}",
        next_step=f"{fix} and capture again: the flame graph and the top functions then name "
        "those functions",
        magnitude=share,
        section="capture",
    )
