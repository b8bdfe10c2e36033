"""The triage report: one self-contained HTML file from a triage document.

API
---

``render_html(doc, flame_svg) -> str``
    ``doc`` is the document `pgprobe triage --json` prints; ``flame_svg`` the flame graph as
    pgprobe.render.flamegraph.render_svg made it (None: rendered here from
    ``doc["flame"]["folded"]`` when there is one). Returns one HTML document that needs
    nothing else: no external CSS, JavaScript, fonts or images, and a Content-Security-Policy
    that forbids the browser to fetch anything, so a report opened offline, attached to a
    ticket or archived looks the same. The findings are ``doc["findings"]`` when the
    document carries them, else they are computed with pgprobe.findings.evaluate.

Sections, in order: the capture facts (header), the findings (severity-coloured, with
evidence and next step), the flame graph, the LWLock table, the SLRU tables (reads per
backend and segment file from the probe, and the pg_stat_slru deltas), the wait events (a
stacked bar chart of active backends per pg_stat_activity sample, drawn here as inline SVG,
and the wait profile table), the top functions, the SQL statistics deltas (database,
bgwriter/checkpointer, WAL, statements), and the capture details and warnings. A section
whose data is null says ``unavailable: <reason>``, the reason taken from ``meta.warnings``.

How the flame graph is embedded: inside an ``<iframe srcdoc>``, as its own document. Inlined
straight into the page its JavaScript works, but its stylesheet (``text{...}``, ``.h``,
``.p``) restyles the rest of the page, its Ctrl-F handler takes the browser's find away from
the whole report, and its zoom state rewrites the report's URL; in the frame, hover, click to
zoom, search and the ``#x=..&y=..`` state work as in the standalone SVG and touch nothing
else. The frame keeps the SVG's aspect ratio and takes the page's width.

Escaping: every string from the document (queries, application names, frame names,
warnings) goes through ``esc``: HTML-escaped, and ``://`` written as ``&#58;//`` so that the
file holds no literal URL anywhere (the browser shows the text unchanged); the flame graph
document is escaped once more as the srcdoc attribute value.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pgprobe import __version__, findings
from pgprobe.render import flamegraph

__all__ = ["esc", "render_html", "timeline_svg"]

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:; font-src 'none'; connect-src 'none'; form-action 'none'; "
    "base-uri 'none'"
)

# Wait event types in the timeline, in stacking order (bottom first), with their colours.
WAIT_COLORS: dict[str, str] = {
    "CPU": "#4caf50",
    "LWLock": "#e53935",
    "Lock": "#fb8c00",
    "IO": "#1e88e5",
    "IPC": "#8e24aa",
    "BufferPin": "#6d4c41",
    "Timeout": "#00897b",
    "Extension": "#d81b60",
    "Client": "#b0bec5",
}
OTHER_COLOR = "#757575"
WAIT_LABELS = {
    "CPU": "CPU (no wait event)",
    "Client": "Client (active, talking to the client)",
}
SEVERITY_LABELS = {"high": "High", "medium": "Medium", "low": "Low", "info": "Info"}
SECTION_LINKS = {
    "lwlocks": ("lwlocks", "the LWLock table"),
    "slru": ("slru", "the SLRU reads"),
    "waits": ("waits", "the wait events"),
    "cpu": ("flame", "the flame graph"),
    "sql": ("sql", "the SQL statistics"),
    "capture": ("capture", "the capture details"),
}
SLRU_ROWS_SHOWN = 50

_CSS = """
:root{color-scheme:light;--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--bg:#fff;--soft:#f6f8fa;
--high:#c62828;--medium:#e65100;--low:#1565c0;--info:#546e7a}
*{box-sizing:border-box}
html{background:var(--bg);color:var(--fg)}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",
"Liberation Sans",Arial,sans-serif}
main{max-width:1240px;margin:0 auto;padding:0 20px 40px}
header.top{background:#24292f;color:#fff;padding:18px 0 14px}
header.top .in{max-width:1240px;margin:0 auto;padding:0 20px}
header.top h1{margin:0 0 4px;font-size:22px;font-weight:600}
header.top .sub{color:#d0d7de}
dl.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(270px,1fr));gap:4px 18px;
margin:12px 0 0}
dl.facts div{display:flex;gap:8px;min-width:0}
dl.facts dt{color:#9da7b3;flex:none}
dl.facts dd{margin:0;overflow-wrap:anywhere}
nav.toc{position:sticky;top:0;z-index:2;background:rgba(255,255,255,.96);
border-bottom:1px solid var(--line);margin:0 -20px;padding:8px 20px}
nav.toc a{margin-right:16px;color:var(--low);text-decoration:none;white-space:nowrap}
nav.toc a:hover{text-decoration:underline}
section{margin-top:28px;scroll-margin-top:44px}
h2{font-size:19px;margin:0 0 10px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:16px 0 6px}
p.note,p.caption{color:var(--muted);margin:4px 0 8px}
p.unavailable{background:#fff8e1;border:1px solid #ffe082;border-radius:6px;padding:8px 12px;
color:#6d4c00}
.finding{border:1px solid var(--line);border-left:6px solid var(--info);border-radius:6px;
padding:10px 14px;margin:0 0 10px;background:#fff}
.finding h3{margin:0 0 6px;font-size:15.5px;line-height:1.35}
.finding p{margin:3px 0}
.finding .k{font-weight:600;color:var(--muted);margin-right:4px}
.badge{display:inline-block;min-width:58px;text-align:center;border-radius:10px;color:#fff;
font-size:11.5px;font-weight:700;padding:1px 8px;margin-right:8px;vertical-align:2px;
text-transform:uppercase;letter-spacing:.03em;background:var(--info)}
.sev-high{border-left-color:var(--high)}.sev-high .badge{background:var(--high)}
.sev-medium{border-left-color:var(--medium)}.sev-medium .badge{background:var(--medium)}
.sev-low{border-left-color:var(--low)}.sev-low .badge{background:var(--low)}
.finding.sev-high{background:#fffafa}
.finding a{color:var(--low)}
.counts{margin:0 0 10px;color:var(--muted)}
.counts span{margin-right:14px}
table{border-collapse:collapse;margin:4px 0 12px;font-size:13px;max-width:100%}
th,td{padding:4px 10px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:var(--soft);font-weight:600;white-space:nowrap;position:relative}
tbody tr:nth-child(even){background:#fafbfc}
tbody tr:hover{background:#eef4fb}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.code{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12px}
td.q{max-width:640px}
td.q pre{margin:0;white-space:pre-wrap;overflow-wrap:anywhere;
font:12px/1.35 ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace}
.share{display:flex;align-items:center;justify-content:flex-end;gap:6px}
.share i{display:inline-block;height:9px;background:#90caf9;border-radius:2px}
.tables{display:flex;flex-wrap:wrap;gap:0 32px;align-items:flex-start}
.flame{border:1px solid var(--line);border-radius:6px;overflow:hidden;background:#f8f8f4}
.flame iframe{display:block;width:100%;border:0}
figure.chart{margin:6px 0 10px}
figure.chart svg{display:block;width:100%;height:auto;max-width:1200px}
figure.chart figcaption{color:var(--muted)}
ul.warnings{margin:4px 0 12px;padding-left:20px}
ul.warnings li{margin:2px 0;overflow-wrap:anywhere}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:4px 0 14px;
font-size:13px}
dl.kv dt{color:var(--muted)}
dl.kv dd{margin:0;overflow-wrap:anywhere;font-variant-numeric:tabular-nums}
footer{margin-top:30px;color:var(--muted);font-size:12px}
"""


# ---------------------------------------------------------------------------------------------
# Small helpers.


def esc(value: Any) -> str:
    """HTML-escape any value (quotes too), with '://' as '&#58;//': no literal URL survives."""
    return html.escape(str(value), quote=True).replace("://", "&#58;//")


_num = findings.as_number


def _int(value: Any) -> str:
    return f"{_num(value):,.0f}"


def _dec(value: Any, places: int = 1) -> str:
    return f"{_num(value):,.{places}f}"


def _fmt(value: Any) -> str:
    """A table cell's number: integers with separators, others with sensible decimals."""
    if value is None:
        return "&ndash;"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return esc(value)
    if float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:,.3f}".rstrip("0").rstrip(".")


def _bytes(value: Any) -> str:
    v = _num(value)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(v) < 1024 or unit == "TB":
            return f"{v:,.0f} {unit}" if unit == "B" else f"{v:,.1f} {unit}"
        v /= 1024
    return f"{v:,.1f} TB"  # unreachable


def _section(doc: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    value = doc.get(name)
    return value if isinstance(value, dict) else None


def _rows(sec: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    rows = sec.get("rows") if sec else None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _meta(sec: Mapping[str, Any] | None) -> dict[str, Any]:
    meta = sec.get("meta") if sec else None
    return meta if isinstance(meta, dict) else {}


def _unavailable(reason: str) -> str:
    return f'<p class="unavailable">unavailable: {esc(reason)}</p>\n'


def _share_cell(pct: Any) -> str:
    p = max(0.0, min(100.0, _num(pct)))
    return (
        f'<td class="num"><span class="share"><i style="width:{p * 0.6:.1f}px"></i>'
        f"{_num(pct):.1f}%</span></td>"
    )


class _Col:
    def __init__(self, key: str, head: str, kind: str = "text") -> None:
        self.key, self.head, self.kind = key, head, kind

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "dec", "num", "share", "bytes", "rate", "id")


def _table(
    cols: Sequence[_Col], rows: Iterable[Mapping[str, Any]], cls: str = "", empty: str = ""
) -> str:
    rows = list(rows)
    if not rows:
        return f'<p class="note">{esc(empty or "no rows")}</p>\n'
    out = [f'<table class="{cls}"><thead><tr>' if cls else "<table><thead><tr>"]
    for c in cols:
        out.append(
            f'<th class="num">{esc(c.head)}</th>' if c.numeric else f"<th>{esc(c.head)}</th>"
        )
    out.append("</tr></thead><tbody>\n")
    for r in rows:
        out.append("<tr>")
        for c in cols:
            v = r.get(c.key)
            if c.kind == "share":
                out.append(_share_cell(v))
            elif c.kind == "int":
                out.append(f'<td class="num">{_int(v) if v is not None else "&ndash;"}</td>')
            elif c.kind == "dec" or c.kind == "rate":
                out.append(f'<td class="num">{_dec(v) if v is not None else "&ndash;"}</td>')
            elif c.kind == "num":
                out.append(f'<td class="num">{_fmt(v)}</td>')
            elif c.kind == "id":
                out.append(f'<td class="num">{esc(v if v is not None else "")}</td>')
            elif c.kind == "bytes":
                out.append(f'<td class="num">{_bytes(v)}</td>')
            elif c.kind == "query":
                out.append(f'<td class="q"><pre>{esc(v if v is not None else "")}</pre></td>')
            elif c.kind == "code":
                out.append(f'<td class="code">{esc(v if v is not None else "")}</td>')
            else:
                out.append(f"<td>{esc(v if v is not None else '')}</td>")
        out.append("</tr>\n")
    out.append("</tbody></table>\n")
    return "".join(out)


def _kv(pairs: Iterable[tuple[str, Any]]) -> str:
    out = ['<dl class="kv">']
    for k, v in pairs:
        plain = isinstance(v, int) and any(w in k for w in ("pid", "version", "port"))
        out.append(f"<dt>{esc(k)}</dt><dd>{esc(v) if plain else _value_text(v)}</dd>")
    out.append("</dl>\n")
    return "".join(out)


def _value_text(v: Any) -> str:
    if isinstance(v, list):
        if len(v) > 12:
            return f"{len(v):,} items: " + esc(", ".join(str(x) for x in v[:12])) + ", ..."
        return esc(", ".join(str(x) for x in v)) if v else "&ndash;"
    if isinstance(v, dict):
        return esc(", ".join(f"{k} {x}" for k, x in v.items())) if v else "&ndash;"
    if v is None or v == "":
        return "&ndash;"
    return _fmt(v)


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


def _header(doc: Mapping[str, Any]) -> str:
    meta = _meta(doc)
    version = str(meta.get("postgres_version") or "?").split(" (")[0]
    duration = _num(meta.get("duration_s"))
    started = str(meta.get("started_at") or "")
    losses = meta.get("losses") if isinstance(meta.get("losses"), dict) else {}
    lost = ", ".join(f"{k} {_int(v)}" for k, v in losses.items()) if losses else "none recorded"
    facts = [
        ("host", meta.get("host")),
        ("PostgreSQL", meta.get("postgres_version")),
        ("postmaster", meta.get("postmaster_pid")),
        ("data directory", meta.get("data_directory")),
        ("server binary", meta.get("server_binary")),
        ("started", started.replace("T", " ")),
        ("duration", f"{duration:.1f} s"),
        ("traced", _who(meta)),
        ("engine", f"{meta.get('engine', '?')} {meta.get('engine_version', '')}".strip()),
        ("CPU sampling", f"{_int(meta.get('hz'))} Hz" if meta.get("hz") else None),
        ("lost events", lost),
        (
            "unresolved frames",
            f"{_num(meta.get('unresolved_pct')):.1f} %"
            if meta.get("unresolved_pct") is not None
            else None,
        ),
        ("max_connections", meta.get("max_connections")),
    ]
    items = "".join(
        f"<div><dt>{esc(k)}</dt><dd>{esc(v)}</dd></div>"
        for k, v in facts
        if v is not None and v != ""
    )
    return (
        '<header class="top"><div class="in">'
        f"<h1>pgprobe triage: {esc(meta.get('host') or 'PostgreSQL')}</h1>"
        f'<div class="sub">PostgreSQL {esc(version)} &middot; {duration:.1f} s from '
        f"{esc(started.replace('T', ' ') or '?')} &middot; {esc(_who(meta))}</div>"
        f'<dl class="facts">{items}</dl>'
        "</div></header>\n"
    )


def _nav() -> str:
    links = [
        ("findings", "Findings"),
        ("flame", "Flame graph"),
        ("lwlocks", "LWLocks"),
        ("slru", "SLRU reads"),
        ("waits", "Wait events"),
        ("cpu", "Top functions"),
        ("sql", "SQL statistics"),
        ("capture", "Capture"),
    ]
    return (
        '<nav class="toc">' + "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in links) + "</nav>\n"
    )


def _findings_of(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    given = doc.get("findings")
    if isinstance(given, list) and given and all(isinstance(f, dict) for f in given):
        return list(given)
    return [f.as_json() for f in findings.evaluate(doc)]


def _findings_section(doc: Mapping[str, Any]) -> str:
    items = _findings_of(doc)
    counts: dict[str, int] = {}
    for f in items:
        sev = str(f.get("severity", "info"))
        counts[sev] = counts.get(sev, 0) + 1
    out = ['<section id="findings"><h2>Findings</h2>\n<p class="counts">']
    for sev in findings.SEVERITIES:
        if counts.get(sev):
            out.append(f"<span>{counts[sev]} {esc(SEVERITY_LABELS[sev].lower())}</span>")
    out.append("</p>\n")
    for f in items:
        sev = str(f.get("severity", "info"))
        sev = sev if sev in SEVERITY_LABELS else "info"
        link = SECTION_LINKS.get(str(f.get("section") or ""))
        out.append(
            f'<article class="finding sev-{sev}" data-id="{esc(f.get("id", ""))}">'
            f'<h3><span class="badge">{SEVERITY_LABELS[sev]}</span>{esc(f.get("title", ""))}</h3>'
        )
        if f.get("evidence"):
            out.append(f'<p><span class="k">Evidence:</span>{esc(f["evidence"])}</p>')
        if f.get("next_step"):
            out.append(f'<p><span class="k">Next step:</span>{esc(f["next_step"])}</p>')
        if link:
            out.append(f'<p><a href="#{link[0]}">See {esc(link[1])}</a></p>')
        out.append("</article>\n")
    out.append("</section>\n")
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Flame graph.

_SVG_SIZE_RX = re.compile(r"<svg\b[^>]*?\bwidth=\"([\d.]+)\"[^>]*?\bheight=\"([\d.]+)\"", re.S)


def _flame_section(doc: Mapping[str, Any], flame_svg: str | None) -> str:
    out = ['<section id="flame"><h2>CPU flame graph</h2>\n']
    flame = _section(doc, "flame")
    meta = _meta(doc)
    if flame_svg is None and flame is not None and isinstance(flame.get("folded"), dict):
        facts = {
            "duration": f"{_num(meta.get('duration_s')):.1f} s",
            "Hz": meta.get("hz", "?"),
            "samples": f"{_int(flame.get('samples'))}",
        }
        flame_svg = flamegraph.render_svg(
            flame["folded"], title="On-CPU flame graph", subtitle=facts
        )
    if flame_svg is None:
        out.append(_unavailable(findings.section_reason(doc, "flame")))
        out.append("</section>\n")
        return "".join(out)
    samples = _num(flame.get("samples")) if flame else 0
    out.append(
        '<p class="note">Each box is a function; its width is its share of the CPU samples, '
        "its callers are below it. Hover for the numbers, click to zoom (Reset Zoom to go "
        "back), Search (or Ctrl-F with the graph focused) highlights frames matching a regular "
        "expression." + (f" {_int(samples)} samples." if samples else "") + "</p>\n"
    )
    body = flame_svg
    if body.lstrip().startswith("<?xml"):
        body = body[body.index("?>") + 2 :]
    m = _SVG_SIZE_RX.search(body)
    width, height = (float(m.group(1)), float(m.group(2))) if m else (1200.0, 600.0)
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        "<style>html,body{margin:0;background:#f8f8f4}"
        "svg{display:block;width:100%;height:auto}</style></head><body>"
        f"{body}</body></html>"
    )
    out.append(
        f'<div class="flame"><iframe id="flamegraph" title="CPU flame graph" '
        f'style="aspect-ratio:{width:g} / {height:g}" srcdoc="{esc(page)}"></iframe></div>\n'
    )
    out.append("</section>\n")
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# LWLocks.

LWLOCK_COLS = [
    _Col("tranche", "Tranche"),
    _Col("mode", "Mode"),
    _Col("waits", "Waits", "int"),
    _Col("total_ms", "Total ms", "dec"),
    _Col("avg_us", "Avg us", "dec"),
    _Col("p50_us", "P50 us", "dec"),
    _Col("p95_us", "P95 us", "dec"),
    _Col("p99_us", "P99 us", "dec"),
    _Col("max_us", "Max us", "dec"),
    _Col("share_pct", "Share", "share"),
]


def _lwlocks_section(doc: Mapping[str, Any]) -> str:
    out = ['<section id="lwlocks"><h2>LWLock waits</h2>\n']
    sec = _section(doc, "lwlocks")
    if sec is None:
        out.append(_unavailable(findings.section_reason(doc, "lwlocks")))
        return "".join(out) + "</section>\n"
    rows = _rows(sec)
    meta = _meta(sec)
    total = sum(_num(r.get("total_us")) for r in rows)
    waits = sum(_num(r.get("waits")) for r in rows)
    duration = _num(meta.get("duration_s")) or _num(_meta(doc).get("duration_s"))
    lost = _num(meta.get("lost_events")) + _num(meta.get("failed_map_updates"))
    out.append(
        f'<p class="caption">{_int(waits)} waits, {total / 1e6:,.3f} s of wait time in '
        f"{duration:.1f} s traced"
        + (f" ({total / 1e6 / duration:,.2f} backends waiting on average)" if duration else "")
        + (f"; {_int(lost)} events lost" if lost else "")
        + ". Sorted by total wait time; percentiles are estimated from log2 histograms.</p>\n"
    )
    view = [{**r, "total_ms": _num(r.get("total_us")) / 1000} for r in rows]
    out.append(_table(LWLOCK_COLS, view, empty="no LWLock waits in the window"))
    return "".join(out) + "</section>\n"


# ---------------------------------------------------------------------------------------------
# SLRU.

SLRU_READ_COLS = [
    _Col("pid", "PID", "id"),
    _Col("backend_type", "Backend type"),
    _Col("application_name", "Application"),
    _Col("file", "File", "code"),
    _Col("reads", "Reads", "int"),
    _Col("rate", "Reads/s", "rate"),
    _Col("bytes", "Bytes", "bytes"),
    _Col("avg_us", "Avg us", "dec"),
    _Col("p99_us", "P99 us", "dec"),
    _Col("max_us", "Max us", "dec"),
]
SLRU_STAT_COLS = [
    _Col("slru", "SLRU", "code"),
    _Col("name", "pg_stat_slru name"),
    _Col("blks_hit", "Blocks hit", "int"),
    _Col("blks_read", "Blocks read", "int"),
    _Col("rate", "Reads/s", "rate"),
    _Col("hit_pct", "Hit %", "dec"),
]


def _slru_section(doc: Mapping[str, Any]) -> str:
    out = ['<section id="slru"><h2>SLRU reads (pg_xact, pg_subtrans, pg_multixact, ...)</h2>\n']
    sec = _section(doc, "clog_reads")
    duration = _num(_meta(doc).get("duration_s"))
    out.append("<h3>Physical reads per backend and segment file (probe)</h3>\n")
    if sec is None:
        out.append(_unavailable(findings.section_reason(doc, "clog_reads")))
    else:
        rows = _rows(sec)
        cdur = _num(_meta(sec).get("duration_s")) or duration
        reads = sum(_num(r.get("reads")) for r in rows)
        pids = len({r.get("pid") for r in rows})
        out.append(
            f'<p class="caption">{_int(reads)} reads by {pids} process'
            f"{'es' if pids != 1 else ''} in {cdur:.1f} s"
            + (f" ({reads / cdur:,.1f}/s)" if cdur else "")
            + ". Each read is one SLRU page missing from the SLRU's buffers, read from the "
            "segment file.</p>\n"
        )
        view = [{**r, "rate": _num(r.get("reads")) / cdur if cdur else None} for r in rows]
        view.sort(key=lambda r: -_num(r.get("reads")))
        out.append(
            _table(
                SLRU_READ_COLS,
                view[:SLRU_ROWS_SHOWN],
                empty="no SLRU page was read from disk in the window",
            )
        )
        if len(view) > SLRU_ROWS_SHOWN:
            out.append(
                f'<p class="note">and {len(view) - SLRU_ROWS_SHOWN:,} more rows (all are in '
                "the JSON document)</p>\n"
            )
    out.append("<h3>pg_stat_slru over the window</h3>\n")
    stats = _section(doc, "stats")
    slru_rows: list[dict[str, Any]] = []
    if stats and isinstance(stats.get("slru"), list):
        slru_rows = [r for r in stats["slru"] if isinstance(r, dict)]
    elif sec and isinstance(_meta(sec).get("slru_stats"), list):
        slru_rows = [r for r in _meta(sec)["slru_stats"] if isinstance(r, dict)]
    if not slru_rows:
        reason = (
            findings.section_reason(doc, "stats")
            if stats is None
            else "pg_stat_slru was not read (PostgreSQL before 13 has no pg_stat_slru)"
        )
        out.append(_unavailable(reason))
    else:
        view = [
            {**r, "rate": _num(r.get("blks_read")) / duration if duration else None}
            for r in slru_rows
        ]
        view.sort(key=lambda r: (-_num(r.get("blks_read")), -_num(r.get("blks_hit"))))
        out.append(_table(SLRU_STAT_COLS, view))
    return "".join(out) + "</section>\n"


# ---------------------------------------------------------------------------------------------
# Wait events: the timeline chart and the profile.


def _wait_type(key: str) -> str:
    return "CPU" if key == "CPU" else key.split(":", 1)[0] or "other"


def _nice_ceiling(value: float) -> tuple[float, float]:
    """(top of the axis, tick step) for a maximum value: integers, at most ~6 ticks."""
    if value <= 0:
        return 1.0, 1.0
    raw = value / 5
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    step = max(1.0, step)
    return math.ceil(value / step) * step, step


def timeline_svg(activity: Mapping[str, Any], width: int = 1160, height: int = 300) -> str:
    """Stacked bars of active backends per sample, by wait event type, as inline SVG."""
    samples = [s for s in activity.get("samples") or [] if isinstance(s, dict)]
    interval = _num(activity.get("interval_s")) or 1.0
    stacks: list[tuple[float, dict[str, float], dict[str, float]]] = []
    types_seen: dict[str, None] = {}
    for s in samples:
        raw = s.get("waits")
        waits: dict[str, float] = (
            {str(k): _num(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        )
        by_type: dict[str, float] = {}
        for key, n in waits.items():
            typ = _wait_type(key)
            by_type[typ] = by_type.get(typ, 0.0) + n
        rest = _num(s.get("active")) - sum(by_type.values())
        if rest > 0:
            by_type["Client"] = by_type.get("Client", 0.0) + rest
        for typ in by_type:
            types_seen[typ] = None
        stacks.append((_num(s.get("t")), by_type, waits))
    order = [t for t in WAIT_COLORS if t in types_seen] + sorted(
        t for t in types_seen if t not in WAIT_COLORS
    )
    top, step = _nice_ceiling(max((sum(b.values()) for _, b, _ in stacks), default=0.0))
    left, right, top_pad, bottom = 56, 16, 40, 46
    plot_w, plot_h = width - left - right, height - top_pad - bottom
    span = max((t for t, _, _ in stacks), default=0.0) + interval
    slot = plot_w * interval / span  # one sample's share of the time axis
    bar_w = max(1.0, slot * 0.78)
    out = [
        f'<svg class="timeline" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="Active backends by wait event type over time" '
        'font-family="system-ui,DejaVu Sans,sans-serif" font-size="12">'
    ]
    # legend
    lx = float(left)
    for t in order:
        label = WAIT_LABELS.get(t, t)
        color = WAIT_COLORS.get(t, OTHER_COLOR)
        out.append(
            f'<g class="legend-item"><rect x="{lx:.1f}" y="10" width="12" height="12" '
            f'fill="{color}"/><text x="{lx + 17:.1f}" y="20.5">{esc(label)}</text></g>'
        )
        lx += 17 + len(label) * 6.8 + 18
    # grid and y axis
    y0 = top_pad + plot_h
    v = 0.0
    while v <= top + 1e-9:
        y = y0 - plot_h * v / top
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
            f'stroke="{"#8c959f" if v == 0 else "#e1e4e8"}" stroke-width="1"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#57606a">'
            f"{v:g}</text>"
        )
        v += step
    out.append(
        f'<text transform="translate(14 {top_pad + plot_h / 2:.1f}) rotate(-90)" '
        'text-anchor="middle" fill="#24292f">active backends</text>'
    )
    # bars
    for t_s, by_type, waits in stacks:
        x = left + plot_w * t_s / span + (slot - bar_w) / 2
        y = float(y0)
        total = sum(by_type.values())
        for typ in order:
            n = by_type.get(typ, 0.0)
            if n <= 0:
                continue
            h = plot_h * n / top
            y -= h
            events = sorted(
                ((k, c) for k, c in waits.items() if _wait_type(k) == typ), key=lambda kc: -kc[1]
            )
            detail = ", ".join(f"{k.split(':', 1)[-1]} {c:g}" for k, c in events if ":" in k)
            tip = f"{t_s:.1f} s: {WAIT_LABELS.get(typ, typ)} {n:g} of {total:g} active" + (
                f" ({detail})" if detail else ""
            )
            out.append(
                f'<rect class="bar" data-type="{esc(typ)}" x="{x:.2f}" y="{y:.2f}" '
                f'width="{bar_w:.2f}" height="{h:.2f}" '
                f'fill="{WAIT_COLORS.get(typ, OTHER_COLOR)}"><title>{esc(tip)}</title></rect>'
            )
    # x axis: about ten labels, on whole seconds
    xstep = _nice_ceiling(span * 5 / 10)[1] if span > 10 else 1.0
    xv = 0.0
    while xv <= span + 1e-9:
        x = left + plot_w * xv / span
        out.append(
            f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 4}" stroke="#8c959f"/>'
            f'<text x="{x:.1f}" y="{y0 + 17}" text-anchor="middle" fill="#57606a">'
            f"{xv:g}</text>"
        )
        xv += xstep
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" '
        'fill="#24292f">seconds since the start of the capture</text>'
    )
    if not any(sum(b.values()) for _, b, _ in stacks):
        out.append(
            f'<text x="{left + plot_w / 2:.1f}" y="{top_pad + plot_h / 2:.1f}" '
            'text-anchor="middle" fill="#8c959f" font-size="15">no active backends in any '
            "sample</text>"
        )
    out.append("</svg>")
    return "".join(out)


PROFILE_COLS = [
    _Col("wait_event_type", "Wait event type"),
    _Col("wait_event", "Wait event"),
    _Col("samples", "Samples", "int"),
    _Col("pct", "Share", "share"),
]


def _waits_section(doc: Mapping[str, Any]) -> str:
    out = ['<section id="waits"><h2>Wait events (pg_stat_activity, sampled)</h2>\n']
    act = _section(doc, "activity")
    if act is None:
        out.append(_unavailable(findings.section_reason(doc, "activity")))
        return "".join(out) + "</section>\n"
    samples = [s for s in act.get("samples") or [] if isinstance(s, dict)]
    interval = _num(act.get("interval_s")) or 1.0
    if samples:
        active = [_num(s.get("active")) for s in samples]
        totals = [_num(s.get("total")) for s in samples]
        caption = (
            f"{len(samples)} samples, {interval:g} s apart: {sum(active) / len(active):,.1f} "
            f"active backends on average (at most {max(active):g}), "
            + (
                f"{max(totals):g} client backends"
                if min(totals) == max(totals)
                else f"{min(totals):g}&ndash;{max(totals):g} client backends"
            )
            + ". Each bar is one sample "
            "of pg_stat_activity: its active client backends by what they waited on (idle and "
            "Client/Activity waits are left out; 'Client' is the rest of the active ones)."
        )
        out.append(
            f'<figure class="chart">{timeline_svg(act)}<figcaption>{caption}</figcaption>'
            "</figure>\n"
        )
    else:
        out.append('<p class="note">no pg_stat_activity samples were taken</p>\n')
    profile = [p for p in act.get("wait_profile") or [] if isinstance(p, dict)]
    out.append("<h3>Wait profile</h3>\n")
    out.append(
        _table(
            PROFILE_COLS,
            profile,
            empty="no active backend was seen in any sample (the server was idle)",
        )
    )
    return "".join(out) + "</section>\n"


# ---------------------------------------------------------------------------------------------
# CPU: the top functions.

HOT_COLS = [
    _Col("self_samples", "Self", "int"),
    _Col("self_pct", "Self %", "share"),
    _Col("total_samples", "Total", "int"),
    _Col("total_pct", "Total %", "dec"),
    _Col("function", "Function", "code"),
    _Col("module", "Module"),
]


def _cpu_section(doc: Mapping[str, Any]) -> str:
    out = ['<section id="cpu"><h2>Top functions (on-CPU samples)</h2>\n']
    sec = _section(doc, "hot")
    if sec is None:
        out.append(_unavailable(findings.section_reason(doc, "hot")))
        return "".join(out) + "</section>\n"
    meta = _meta(sec)
    rows = _rows(sec)
    parts = []
    if meta.get("samples") is not None:
        parts.append(f"{_int(meta.get('samples'))} samples")
    if meta.get("hz"):
        parts.append(f"at {_int(meta.get('hz'))} Hz")
    if meta.get("lost_samples"):
        parts.append(f"{_int(meta.get('lost_samples'))} lost")
    if meta.get("unresolved_frames_pct") is not None:
        parts.append(f"{_num(meta.get('unresolved_frames_pct')):.1f} % of frames unresolved")
    out.append(
        f'<p class="caption">{esc(", ".join(parts))}. Self: the function was on CPU itself; '
        "total: it or its callees were.</p>\n"
    )
    out.append(_table(HOT_COLS, rows, empty="no CPU samples (the targets were idle)"))
    return "".join(out) + "</section>\n"


# ---------------------------------------------------------------------------------------------
# SQL statistics deltas.

STATEMENT_COLS = [
    _Col("query", "Query", "query"),
    _Col("calls", "Calls", "int"),
    _Col("total_ms", "Total ms", "dec"),
    _Col("mean_ms", "Mean ms", "num"),
    _Col("rows", "Rows", "int"),
    _Col("shared_blks_read", "Shared blocks read", "int"),
]
DELTA_COLS = [_Col("name", "Counter", "code"), _Col("delta", "Delta", "num")]
DELTA_RATE_COLS = [*DELTA_COLS, _Col("rate", "Per second", "rate")]


def _delta_table(values: Mapping[str, Any], duration: float, units: Mapping[str, str]) -> str:
    rows = []
    for k, v in values.items():
        row: dict[str, Any] = {"name": k, "delta": v}
        if duration and isinstance(v, (int, float)) and not k.endswith("_time"):
            row["rate"] = v / duration
        if units.get(k) == "bytes":
            row["delta"] = f"{_bytes(v)}"
            row["rate"] = None
        rows.append(row)
    return _table(DELTA_RATE_COLS if duration else DELTA_COLS, rows, cls="delta")


def _sql_section(doc: Mapping[str, Any]) -> str:
    out = ['<section id="sql"><h2>SQL statistics over the window (deltas)</h2>\n']
    stats = _section(doc, "stats")
    if stats is None:
        out.append(_unavailable(findings.section_reason(doc, "stats")))
        return "".join(out) + "</section>\n"
    duration = _num(_meta(doc).get("duration_s"))
    db = stats.get("database") if isinstance(stats.get("database"), dict) else None
    out.append('<div class="tables">')
    out.append("<div><h3>pg_stat_database (all databases)</h3>\n")
    if db is None:
        out.append(_unavailable("pg_stat_database was not read"))
    else:
        hit, read = _num(db.get("blks_hit")), _num(db.get("blks_read"))
        commits = _num(db.get("xact_commit"))
        facts = []
        if duration:
            facts.append(f"{commits / duration:,.1f} commits/s")
        if hit + read:
            facts.append(f"cache hit ratio {100 * hit / (hit + read):.2f} %")
        if facts:
            out.append(f'<p class="caption">{esc("; ".join(facts))}</p>\n')
        out.append(_delta_table(db, duration, {"temp_bytes": "bytes"}))
    out.append("</div>")
    for key, title in (
        ("bgwriter", "pg_stat_bgwriter"),
        ("checkpointer", "pg_stat_checkpointer"),
        ("wal", "pg_stat_wal"),
    ):
        values = stats.get(key)
        if isinstance(values, dict):
            out.append(f"<div><h3>{esc(title)}</h3>\n")
            out.append(_delta_table(values, duration, {"wal_bytes": "bytes"}))
            out.append("</div>")
        elif key == "wal":
            major = int(_num(_meta(doc).get("postgres_version_num"))) // 10000
            out.append(f"<div><h3>{esc(title)}</h3>\n")
            out.append(
                _unavailable(
                    "pg_stat_wal does not exist before PostgreSQL 14"
                    if major and major < 14
                    else "pg_stat_wal was not read"
                )
            )
            out.append("</div>")
    out.append("</div>\n")
    out.append("<h3>Top statements by time in the window (pg_stat_statements)</h3>\n")
    statements = stats.get("statements")
    if not isinstance(statements, list):
        out.append(
            _unavailable(
                "pg_stat_statements is not installed (CREATE EXTENSION pg_stat_statements, "
                "with shared_preload_libraries = 'pg_stat_statements')"
            )
        )
    else:
        out.append(
            _table(
                STATEMENT_COLS,
                [s for s in statements if isinstance(s, dict)],
                cls="statements",
                empty="no statement ran in the window",
            )
        )
    return "".join(out) + "</section>\n"


# ---------------------------------------------------------------------------------------------
# Capture details and warnings.

_META_SKIP = {"warnings", "slru_stats"}


def _capture_section(doc: Mapping[str, Any]) -> str:
    meta = _meta(doc)
    out = ['<section id="capture"><h2>Capture details and warnings</h2>\n']
    warnings = [str(w) for w in meta.get("warnings") or []]
    for name in findings.SECTIONS:
        sec = _section(doc, name)
        for w in _meta(sec).get("warnings") or []:
            text = f"{name}: {w}"
            if str(w) not in warnings and text not in warnings:
                warnings.append(text)
    out.append("<h3>Warnings</h3>\n")
    if warnings:
        out.append(
            '<ul class="warnings">' + "".join(f"<li>{esc(w)}</li>" for w in warnings) + "</ul>\n"
        )
    else:
        out.append('<p class="note">none</p>\n')
    missing = [n for n in findings.SECTIONS if doc.get(n) is None]
    if missing:
        out.append('<h3>Sections that could not run</h3>\n<ul class="warnings">')
        for n in missing:
            out.append(
                f"<li>{esc(findings.SECTION_TITLES[n])}: {esc(findings.section_reason(doc, n))}"
                "</li>"
            )
        out.append("</ul>\n")
    out.append("<h3>Capture</h3>\n")
    out.append(_kv((k, v) for k, v in meta.items() if k not in _META_SKIP))
    for name in ("lwlocks", "clog_reads", "hot"):
        sec_meta = _meta(_section(doc, name))
        if sec_meta:
            out.append(f"<h3>{esc(findings.SECTION_TITLES[name])}</h3>\n")
            out.append(_kv((k, v) for k, v in sec_meta.items() if k not in _META_SKIP))
    return "".join(out) + "</section>\n"


# ---------------------------------------------------------------------------------------------


def render_html(doc: Mapping[str, Any], flame_svg: str | None) -> str:
    """The whole report: one self-contained HTML document."""
    meta = _meta(doc)
    title = f"pgprobe triage: {meta.get('host') or 'PostgreSQL'} {meta.get('started_at') or ''}"
    parts = [
        "<!DOCTYPE html>\n",
        '<html lang="en"><head><meta charset="utf-8">\n',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n',
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
        f'<meta name="generator" content="pgprobe {esc(__version__)}">\n',
        f"<title>{esc(title.strip())}</title>\n",
        f"<style>{_CSS}</style>\n",
        "</head><body>\n",
        _header(doc),
        "<main>\n",
        _nav(),
        _findings_section(doc),
        _flame_section(doc, flame_svg),
        _lwlocks_section(doc),
        _slru_section(doc),
        _waits_section(doc),
        _cpu_section(doc),
        _sql_section(doc),
        _capture_section(doc),
        f"<footer>Made by pgprobe {esc(__version__)} (pgprobe triage). This file is "
        "self-contained: it loads nothing from the network.</footer>\n",
        "</main>\n</body></html>\n",
    ]
    return "".join(parts)
