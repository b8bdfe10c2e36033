"""What each section of the report shows, as data for its template (templates/<section>.html).

One function per section, ``doc -> dict``: the numbers written out, the rows as ``Table``s,
and ``unavailable`` (the reason, from ``meta.warnings``) when the section's data is null.
No markup here; the wording around the numbers is in the templates. Kept in one module
(~400 lines): one short function per section of one report, sharing its column lists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pgprobe import findings
from pgprobe.findings import as_number as num
from pgprobe.render import flamegraph
from pgprobe.render.report.cells import Col, int_text, kv, table
from pgprobe.render.report.templating import Markup, asset, render
from pgprobe.render.report.timeline import timeline_svg

SEVERITY_LABELS = {"high": "High", "medium": "Medium", "low": "Low", "info": "Info"}
SECTION_LINKS = {
    "timemodel": ("timemodel", "the time model"),
    "lwlocks": ("lwlocks", "the LWLock table"),
    "slru": ("slru", "the SLRU reads"),
    "waits": ("waits", "the wait events"),
    "cpu": ("flame", "the flame graph"),
    "sql": ("sql", "the SQL statistics"),
    "capture": ("capture", "the capture details"),
}
SLRU_ROWS_SHOWN = 50


def section(doc: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    value = doc.get(name)
    return value if isinstance(value, dict) else None


def rows_of(sec: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    rows = sec.get("rows") if sec else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def meta_of(sec: Mapping[str, Any] | None) -> dict[str, Any]:
    meta = sec.get("meta") if sec else None
    return meta if isinstance(meta, dict) else {}


def _unavailable(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    return {"unavailable": findings.section_reason(doc, name)}


# ---------------------------------------------------------------------------------------------
# Header and findings.


def _who(meta: Mapping[str, Any]) -> str:
    pids = meta.get("pids") if isinstance(meta.get("pids"), list) else []
    if meta.get("target") == "cluster":
        return f"whole cluster ({len(pids)} processes at start)" if pids else "whole cluster"
    if not pids:
        return "the selected backends"
    shown = ", ".join(str(p) for p in pids[:10]) + (", ..." if len(pids) > 10 else "")
    return f"pid{'s' if len(pids) > 1 else ''} {shown}"


def header(doc: Mapping[str, Any]) -> dict[str, Any]:
    meta = meta_of(doc)
    duration = num(meta.get("duration_s"))
    started = str(meta.get("started_at") or "").replace("T", " ")
    losses = meta.get("losses") if isinstance(meta.get("losses"), dict) else {}
    lost = ", ".join(f"{k} {int_text(v)}" for k, v in losses.items()) if losses else ""
    unresolved = meta.get("unresolved_pct")
    facts = [
        ("host", meta.get("host")),
        ("PostgreSQL", meta.get("postgres_version")),
        ("postmaster", meta.get("postmaster_pid")),
        ("data directory", meta.get("data_directory")),
        ("server binary", meta.get("server_binary")),
        ("started", started),
        ("duration", f"{duration:.1f} s"),
        ("traced", _who(meta)),
        ("engine", f"{meta.get('engine', '?')} {meta.get('engine_version', '')}".strip()),
        ("CPU sampling", f"{int_text(meta.get('hz'))} Hz" if meta.get("hz") else None),
        ("lost events", lost or "none recorded"),
        ("unresolved frames", f"{num(unresolved):.1f} %" if unresolved is not None else None),
        ("max_connections", meta.get("max_connections")),
    ]
    return {
        "host": meta.get("host") or "PostgreSQL",
        "version": str(meta.get("postgres_version") or "?").split(" (")[0],
        "duration": f"{duration:.1f}",
        "started": started or "?",
        "who": _who(meta),
        "facts": [(k, v) for k, v in facts if v is not None and v != ""],
    }


def _findings_of(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    given = doc.get("findings")
    if isinstance(given, list) and given and all(isinstance(f, dict) for f in given):
        return list(given)
    return findings.findings_json(doc)


def _share_text(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return f"{value:.1f} % of DB time"


def findings_section(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The findings ranked by their share of DB time (findings.rank_key), each with its lead."""
    items = []
    counts: dict[str, int] = {}
    for f in sorted(_findings_of(doc), key=findings.rank_key):
        raw = str(f.get("severity", "info"))
        counts[raw] = counts.get(raw, 0) + 1
        sev = raw if raw in SEVERITY_LABELS else "info"
        fid = str(f.get("id") or "")
        items.append(
            {
                "severity": sev,
                "label": SEVERITY_LABELS[sev],
                "id": fid,
                "title": f.get("title", ""),
                "share": _share_text(f.get("share")),
                "share_value": f.get("share") if _share_text(f.get("share")) else None,
                "evidence": f.get("evidence") or "",
                "lead": str(f.get("lead") or "") or findings.lead_of(fid),
                "next_step": f.get("next_step") or "",
                "link": SECTION_LINKS.get(str(f.get("section") or "")),
            }
        )
    return {
        "counts": [
            (counts[s], SEVERITY_LABELS[s].lower()) for s in findings.SEVERITIES if counts.get(s)
        ],
        "entries": items,
    }


# ---------------------------------------------------------------------------------------------
# Flame graph: its own document inside an <iframe srcdoc> (see the package docstring).

_SVG_SIZE_RX = re.compile(r"<svg\b[^>]*?\bwidth=\"([\d.]+)\"[^>]*?\bheight=\"([\d.]+)\"", re.S)


def flame(doc: Mapping[str, Any], flame_svg: str | None) -> dict[str, Any]:
    sec = section(doc, "flame")
    if flame_svg is None and sec is not None and isinstance(sec.get("folded"), dict):
        facts = {
            "duration": f"{num(meta_of(doc).get('duration_s')):.1f} s",
            "Hz": meta_of(doc).get("hz", "?"),
            "samples": f"{int_text(sec.get('samples'))}",
        }
        flame_svg = flamegraph.render_svg(sec["folded"], title="On-CPU flame graph", subtitle=facts)
    if flame_svg is None:
        return _unavailable(doc, "flame")
    body = flame_svg
    if body.lstrip().startswith("<?xml"):
        body = body[body.index("?>") + 2 :]
    m = _SVG_SIZE_RX.search(body)
    width, height = (float(m.group(1)), float(m.group(2))) if m else (1200.0, 600.0)
    samples = num(sec.get("samples")) if sec else 0
    page = render("flame_frame.html", css=asset("flame_frame.css"), svg=Markup(body))
    return {
        "unavailable": None,
        "samples": int_text(samples) if samples else "",
        "aspect": f"{width:g} / {height:g}",
        "page": page,  # a plain string: escaped once more as the srcdoc attribute value
    }


# ---------------------------------------------------------------------------------------------
# LWLocks, SLRU reads, wait events, top functions.

LWLOCK_COLS = [
    Col("tranche", "Tranche"),
    Col("mode", "Mode"),
    Col("waits", "Waits", "int"),
    Col("total_ms", "Total ms", "dec"),
    Col("avg_us", "Avg us", "dec"),
    Col("p50_us", "P50 us", "dec"),
    Col("p95_us", "P95 us", "dec"),
    Col("p99_us", "P99 us", "dec"),
    Col("max_us", "Max us", "dec"),
    Col("share_pct", "Share", "share"),
]


def lwlocks(doc: Mapping[str, Any]) -> dict[str, Any]:
    sec = section(doc, "lwlocks")
    if sec is None:
        return _unavailable(doc, "lwlocks")
    rows = rows_of(sec)
    meta = meta_of(sec)
    total_s = sum(num(r.get("total_us")) for r in rows) / 1e6
    duration = num(meta.get("duration_s")) or num(meta_of(doc).get("duration_s"))
    lost = num(meta.get("lost_events")) + num(meta.get("failed_map_updates"))
    view = [{**r, "total_ms": num(r.get("total_us")) / 1000} for r in rows]
    return {
        "unavailable": None,
        "title": str(meta.get("title") or ""),  # the scheduler's: what it measured
        "waits": int_text(sum(num(r.get("waits")) for r in rows)),
        "total_s": f"{total_s:,.3f}",
        "duration": f"{duration:.1f}",
        "backends": f"{total_s / duration:,.2f}" if duration else "",
        "lost": int_text(lost) if lost else "",
        "table": table(LWLOCK_COLS, view, empty="no LWLock waits in the window"),
    }


_BACKEND_COLS = [
    Col("pid", "PID", "id"),
    Col("backend_type", "Backend type"),
    Col("application_name", "Application"),
]
_READ_COUNT_COLS = [Col("reads", "Reads", "int"), Col("rate", "Reads/s", "rate")]
SLRU_READ_COLS = [
    *_BACKEND_COLS,
    Col("file", "File", "code"),
    *_READ_COUNT_COLS,
    Col("bytes", "Bytes", "bytes"),
    Col("avg_us", "Avg us", "dec"),
    Col("p99_us", "P99 us", "dec"),
    Col("max_us", "Max us", "dec"),
]
# Counted by the uprobe (clog-reads' default source): no files, sizes or latencies, the
# SLRU's directory instead of a file.
SLRU_COUNT_COLS = [*_BACKEND_COLS, Col("directory", "SLRU directory", "code"), *_READ_COUNT_COLS]
SLRU_STAT_COLS = [
    Col("slru", "SLRU", "code"),
    Col("name", "pg_stat_slru name"),
    Col("blks_hit", "Blocks hit", "int"),
    Col("blks_read", "Blocks read", "int"),
    Col("rate", "Reads/s", "rate"),
    Col("hit_pct", "Hit %", "dec"),
]


def slru(doc: Mapping[str, Any]) -> dict[str, Any]:
    sec = section(doc, "clog_reads")
    duration = num(meta_of(doc).get("duration_s"))
    probe: dict[str, Any] = _unavailable(doc, "clog_reads")
    if sec is not None:
        rows = rows_of(sec)
        cdur = num(meta_of(sec).get("duration_s")) or duration
        reads = sum(num(r.get("reads")) for r in rows)
        view = [
            {
                **r,
                "rate": num(r.get("reads")) / cdur if cdur else None,
                "directory": f"{r.get('slru')}/",
            }
            for r in rows
        ]
        view.sort(key=lambda r: -num(r.get("reads")))
        timed = any("file" in r for r in rows)
        probe = {
            "unavailable": None,
            "reads": int_text(reads),
            "pids": len({r.get("pid") for r in rows}),
            "duration": f"{cdur:.1f}",
            "rate": f"{reads / cdur:,.1f}" if cdur else "",
            "table": table(
                SLRU_READ_COLS if timed else SLRU_COUNT_COLS,
                view[:SLRU_ROWS_SHOWN],
                empty="no SLRU page was read from disk in the window",
            ),
            "more": f"{len(view) - SLRU_ROWS_SHOWN:,}" if len(view) > SLRU_ROWS_SHOWN else "",
        }
    stats = section(doc, "stats")
    slru_rows: list[dict[str, Any]] = []
    if stats and isinstance(stats.get("slru"), list):
        slru_rows = [r for r in stats["slru"] if isinstance(r, dict)]
    elif sec and isinstance(meta_of(sec).get("slru_stats"), list):
        slru_rows = [r for r in meta_of(sec)["slru_stats"] if isinstance(r, dict)]
    if not slru_rows:
        reason = (
            findings.section_reason(doc, "stats")
            if stats is None
            else "pg_stat_slru was not read (PostgreSQL before 13 has no pg_stat_slru)"
        )
        return {"probe": probe, "stats": {"unavailable": reason}}
    view = [
        {**r, "rate": num(r.get("blks_read")) / duration if duration else None} for r in slru_rows
    ]
    view.sort(key=lambda r: (-num(r.get("blks_read")), -num(r.get("blks_hit"))))
    return {"probe": probe, "stats": {"unavailable": None, "table": table(SLRU_STAT_COLS, view)}}


PROFILE_COLS = [
    Col("wait_event_type", "Wait event type"),
    Col("wait_event", "Wait event"),
    Col("samples", "Samples", "int"),
    Col("pct", "Share", "share"),
]


def waits(doc: Mapping[str, Any]) -> dict[str, Any]:
    act = section(doc, "activity")
    if act is None:
        return _unavailable(doc, "activity")
    samples = [s for s in act.get("samples") or [] if isinstance(s, dict)]
    chart = None
    if samples:
        active = [num(s.get("active")) for s in samples]
        totals = [num(s.get("total")) for s in samples]
        chart = {
            "svg": Markup(timeline_svg(act)),
            "samples": len(samples),
            "interval": f"{num(act.get('interval_s')) or 1.0:g}",
            "avg_active": f"{sum(active) / len(active):,.1f}",
            "max_active": f"{max(active):g}",
            "min_clients": f"{min(totals):g}",
            "max_clients": f"{max(totals):g}",
        }
    profile = [p for p in act.get("wait_profile") or [] if isinstance(p, dict)]
    return {
        "unavailable": None,
        "chart": chart,
        "table": table(
            PROFILE_COLS,
            profile,
            empty="no active backend was seen in any sample (the server was idle)",
        ),
    }


HOT_COLS = [
    Col("self_samples", "Self", "int"),
    Col("self_pct", "Self %", "share"),
    Col("total_samples", "Total", "int"),
    Col("total_pct", "Total %", "dec"),
    Col("function", "Function", "code"),
    Col("module", "Module"),
]


def cpu(doc: Mapping[str, Any]) -> dict[str, Any]:
    sec = section(doc, "hot")
    if sec is None:
        return _unavailable(doc, "hot")
    meta = meta_of(sec)
    parts = []
    if meta.get("samples") is not None:
        parts.append(f"{int_text(meta.get('samples'))} samples")
    if meta.get("hz"):
        parts.append(f"at {int_text(meta.get('hz'))} Hz")
    if meta.get("lost_samples"):
        parts.append(f"{int_text(meta.get('lost_samples'))} lost")
    if meta.get("unresolved_frames_pct") is not None:
        parts.append(f"{num(meta.get('unresolved_frames_pct')):.1f} % of frames unresolved")
    return {
        "unavailable": None,
        "facts": ", ".join(parts),
        "table": table(HOT_COLS, rows_of(sec), empty="no CPU samples (the targets were idle)"),
    }


# ---------------------------------------------------------------------------------------------
# Capture details and warnings.

_META_SKIP = {"warnings", "slru_stats"}
# Each part's own "interrupted" is triage asking it to stop at the window's end: only the
# document's (Ctrl-C or SIGTERM) says whether the capture was interrupted.
_PART_SKIP = _META_SKIP | {"interrupted"}


def capture(doc: Mapping[str, Any]) -> dict[str, Any]:
    meta = meta_of(doc)
    warnings = [str(w) for w in meta.get("warnings") or []]
    for name in findings.sections_of(doc):
        for w in meta_of(section(doc, name)).get("warnings") or []:
            text = f"{name}: {w}"
            if str(w) not in warnings and text not in warnings:
                warnings.append(text)
    parts = []
    for name in ("lwlocks", "clog_reads", "hot"):
        sec_meta = meta_of(section(doc, name))
        if sec_meta:
            pairs = kv((k, v) for k, v in sec_meta.items() if k not in _PART_SKIP)
            parts.append((findings.SECTION_TITLES[name], pairs))
    pairs = kv(
        (k, v)
        for k, v in meta.items()
        if k not in _META_SKIP and not (k == "interrupted" and not v)
    )
    return {
        "warnings": warnings,
        "missing": [
            (findings.SECTION_TITLES[n], findings.section_reason(doc, n))
            for n in findings.sections_of(doc)
            if doc.get(n) is None
        ],
        "meta": pairs,
        "parts": parts,
        "interrupted": meta.get("interrupted") is True,
        "count": len(pairs) + sum(len(p) for _, p in parts),
    }
