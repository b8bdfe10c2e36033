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

``timeline_svg(activity) -> str`` (the wait-event chart) and ``esc(value) -> str`` (the
escaping of every value) are public for tests and other renderers.

Sections, in order: the capture facts (header), where the DB time went (``overview``: the
client backends' active time as one stacked bar by wait class, inline SVG with a legend;
``timebar``), the findings (ranked by their share of DB time, then by severity; each with its
evidence, its next step's lead in bold and the longer advice folded), the time model (the
client backends' exact active time per wait event with a bar each and pg_stat_activity's
sampled share beside it, the lines under 0.05 % folded, idle time apart, the whole cluster's
model folded; ``timemodel``), the flame graph, the LWLock table, the SLRU tables (reads per backend
and segment file from the probe, and the pg_stat_slru deltas), the wait events (a stacked bar
chart of active backends per pg_stat_activity sample, drawn as inline SVG, and the wait profile
table), the top functions, the SQL statistics deltas (database, bgwriter/checkpointer, WAL,
statements), and the warnings with the capture details folded. A section whose data is null says
``unavailable: <reason>``, the reason taken from ``meta.warnings``.

Where things are: ``sections`` and ``sql`` shape each section's data (numbers written out,
rows as ``cells.Table``); ``timeline`` computes the chart's geometry, ``timebar`` the DB time
bar's; ``templating`` holds
the Jinja2 environment and the escaping; the markup is in ``templates/`` (``report.html``
includes one template per section; ``macros.html`` draws tables, notes and details) and the
stylesheets in ``assets/``, read when a report is rendered.

How the flame graph is embedded: inside an ``<iframe srcdoc>``, as its own document. Inlined
straight into the page its JavaScript works, but its stylesheet (``text{...}``, ``.h``,
``.p``) restyles the rest of the page, its Ctrl-F handler takes the browser's find away from
the whole report, and its zoom state rewrites the report's URL; in the frame, hover, click to
zoom, search and the ``#x=..&y=..`` state work as in the standalone SVG and touch nothing
else. The frame keeps the SVG's aspect ratio and takes the page's width.

Escaping: every string from the document (queries, application names, frame names,
warnings) goes through ``esc`` (see pgprobe.render.report.templating): control and bidi
characters written visibly (pgprobe.literal), HTML-escaped, and ``://`` written as
``&#58;//`` so that the file holds no literal URL anywhere (the browser shows the text
unchanged); the flame graph document is escaped once more as the srcdoc attribute value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgprobe import __version__
from pgprobe.render.report import sections
from pgprobe.render.report.locks import locks_section
from pgprobe.render.report.sql import sql
from pgprobe.render.report.statements import statements_section
from pgprobe.render.report.templating import Markup, asset, esc, render, warm
from pgprobe.render.report.timebar import time_bar
from pgprobe.render.report.timeline import timeline_svg
from pgprobe.render.report.timemodel import time_model_section

__all__ = ["CSP", "esc", "render_html", "timeline_svg", "warm"]

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "img-src data:; font-src 'none'; connect-src 'none'; form-action 'none'; "
    "base-uri 'none'"
)
NAV = [
    ("overview", "DB time"),
    ("findings", "Findings"),
    ("timemodel", "Time model"),
    ("statements", "Statements"),
    ("locks", "Lock waits"),
    ("flame", "Flame graph"),
    ("lwlocks", "LWLocks"),
    ("slru", "SLRU reads"),
    ("waits", "Wait events"),
    ("cpu", "Top functions"),
    ("sql", "SQL statistics"),
    ("capture", "Capture"),
]


def render_html(doc: Mapping[str, Any], flame_svg: str | None) -> str:
    """The whole report: one self-contained HTML document."""
    meta = sections.meta_of(doc)
    title = f"pgprobe triage: {meta.get('host') or 'PostgreSQL'} {meta.get('started_at') or ''}"
    return render(
        "report.html",
        csp=Markup(CSP),
        version=__version__,
        title=title.strip(),
        css=asset("report.css"),
        nav=NAV,
        header=sections.header(doc),
        overview=time_bar(doc),
        findings=sections.findings_section(doc),
        timemodel=time_model_section(doc),
        statements=statements_section(doc),
        locks=locks_section(doc),
        flame=sections.flame(doc, flame_svg),
        lwlocks=sections.lwlocks(doc),
        slru=sections.slru(doc),
        waits=sections.waits(doc),
        cpu=sections.cpu(doc),
        sql=sql(doc),
        capture=sections.capture(doc),
    )
