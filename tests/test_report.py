"""The triage report (pgprobe.render.report.render_html) on the recorded triage documents.

Long because it holds every report test (page, sections, browser) in one place.

Parsing: the page must be well-formed (every element closed, in order), hold every section
with the recorded data, escape what comes from the database, reference nothing on the
network, and say "unavailable: <reason>" for sections that are null. The SVG parts (the wait
timeline, and the flame graph inside its iframe) must parse as XML.

Browser: Debian's headless Chromium through selenium, set up as in
tests/test_flamegraph_browser.py (/usr/bin/chromedriver, selenium-manager never runs, the
network-quiet flags). Missing browser: skipped, but under CI=true a failure. The report must
load without console errors (its Content-Security-Policy forbids any fetch, so a fetch would
show up as one), the flame graph must render, zoom on click and search inside its iframe,
and the timeline must have bars. Screenshots go to tests/artifacts/ for a person to look at.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from browser import ARTIFACTS, headless_chromium
from helpers import load_triage

from pgprobe import findings as findings_mod
from pgprobe.findings import LEAD_MAX_WORDS, SECTIONS
from pgprobe.findings.timemodel import time_model
from pgprobe.render.flamegraph import XPAD, render_svg
from pgprobe.render.report import render_html, timeline_svg
from pgprobe.tools.triage import view

FIXTURES = Path(__file__).parent / "fixtures" / "triage"
REPORT_SECTIONS = [
    "overview",
    "findings",
    "timemodel",
    "statements",
    "locks",
    "flame",
    "lwlocks",
    "slru",
    "waits",
    "cpu",
    "sql",
    "capture",
]
EVIL_TABLE = 'public."<img src=y onerror=alert(4)>"'
VOID = {"meta", "link", "br", "hr", "img", "input", "col", "area", "base", "wbr", "source"}
EVIL_QUERY = (
    "SELECT '<script>alert(1)</script>' AS x, 'a&b' FROM \"t\" WHERE u = 'http://x.example/'"
)


load = load_triage


class Page(HTMLParser):
    """A strict walk over the page: tag balance, ids, attributes, text per section."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text_by_section: dict[str, list[str]] = {}
        self.section: str | None = None
        self.feed(text)
        self.close()
        if self.stack:
            self.errors.append(f"unclosed: {self.stack}")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if a.get("id"):
            self.ids.append(str(a["id"]))
        if tag == "section":
            self.section = a.get("id")
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))  # <rect .../> in the inline SVG

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
            return
        self.stack.pop()
        if tag == "section":
            self.section = None

    def handle_data(self, data: str) -> None:
        if self.section:
            self.text_by_section.setdefault(self.section, []).append(data)

    def text(self, section: str) -> str:
        return " ".join(" ".join(self.text_by_section.get(section, [])).split())

    def attrs(self, tag: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.tags if t == tag]


def render(name: str, flame_svg: str | None = None, **edits: Any) -> tuple[str, Page]:
    doc = load(name)
    doc.update(edits)
    text = render_html(doc, flame_svg)
    return text, Page(text)


def srcdoc(page: Page) -> str:
    frames = [a for a in page.attrs("iframe") if a.get("id") == "flamegraph"]
    assert len(frames) == 1
    value = frames[0].get("srcdoc")
    assert value
    return value


# ---------------------------------------------------------------------------------------------
# Structure and data.


@pytest.mark.parametrize("name", ["pgbench", "slru", "idle", "timemodel"])
def test_page_parses_and_has_every_section(name: str) -> None:
    text, page = render(name)
    assert text.startswith("<!DOCTYPE html>")
    assert page.errors == []
    for sid in REPORT_SECTIONS:
        assert sid in page.ids, sid
    assert len(page.ids) == len(set(page.ids)), "duplicate ids"
    # the findings come first, then the evidence in the order of the issue
    positions = [text.index(f'<section id="{s}"') for s in REPORT_SECTIONS]
    assert positions == sorted(positions)
    assert "unavailable" not in page.text("findings")


def test_sections_hold_the_recorded_data() -> None:
    doc = load("slru")
    text, page = render("slru")
    findings = page.text("findings")
    assert re.search(r"pg_xact reads: [\d,]+/s from 16 backends", findings)
    assert "Evidence:" in findings and "Next step:" in findings
    lw = page.text("lwlocks")
    for row in doc["lwlocks"]["rows"]:
        assert row["tranche"] in lw
    assert f"{doc['lwlocks']['rows'][0]['waits']:,}" in lw
    slru = page.text("slru")
    assert "pg_xact/0000" in slru
    assert f"{doc['clog_reads']['rows'][0]['reads']:,}" in slru
    assert "Xact" in slru and f"{doc['stats']['slru'][6]['blks_read']:,}" in slru
    cpu = page.text("cpu")
    for row in doc["hot"]["rows"][:5]:
        assert row["function"] in cpu
    sql = page.text("sql")
    assert f"{doc['stats']['database']['xact_commit']:,}" in sql
    assert "buffers_backend" in sql and "wal_records" in sql
    assert "unavailable: pg_stat_statements is not installed" in sql
    waits = page.text("waits")
    assert "transactionid" in waits and "XactBuffer" in waits
    assert doc["meta"]["server_binary"] in page.text("capture")
    # the flame graph: the recorded stacks, inside the iframe's document
    inner = srcdoc(page)
    assert inner.count('<g class="f"') > 100
    assert "PostgresMain" in inner and "base_yyparse" in inner
    assert "<script>" in inner and "function zoomTo" in inner


def test_time_model_section_exact_beside_sampled() -> None:
    """timemodel.json: the client backends' exact seconds per wait event, a bar each, the
    sampled share beside; idle apart; the whole cluster folded below."""
    doc = load("timemodel")
    _, page = render("timemodel")
    assert page.errors == []
    tm = page.text("timemodel")
    rows = {f"{r['wait_event_type']}:{r['wait_event']}": r for r in doc["waits"]["rows"]}
    xid = rows["Lock:transactionid"]
    assert f"Lock:transactionid {xid['total_us'] / 1e6:,.3f}" in tm
    profile = {p["wait_event"]: p for p in doc["activity"]["wait_profile"]}
    assert f"{profile['transactionid']['pct']:.1f} {profile['transactionid']['samples']}" in tm
    active = doc["waits"]["meta"]["active_us"] / 1e6
    assert f"{active:,.2f} s active" in tm
    assert "Idle and unaccounted time" in tm and "Client:ClientRead" in tm
    assert "Every process of the cluster" in tm
    bars = [a for t, a in page.tags if t == "i" and "width" in str(a.get("style"))]
    assert bars, "a bar per wait event"
    assert page.text("findings").count("See the time model") >= 1


def _computed(name: str) -> dict[str, Any]:
    """A recorded document with its findings computed now (the recorded ones predate shares)."""
    doc = load(name)
    doc.pop("findings", None)
    return doc


def _class_shares(doc: dict[str, Any]) -> dict[str, float]:
    """Percent of the client backends' active time per wait class, from the JSON rows."""
    named = ("IO", "Lock", "LWLock", "BufferPin", "IPC", "Client", "Timeout")
    us: dict[str, float] = {}
    for r in doc["waits"]["rows"]:
        if r["category"] in ("on CPU", "runqueue"):
            cls = r["category"]
        elif r["category"] == "wait":
            cls = r["wait_event_type"] if r["wait_event_type"] in named else "other"
        else:
            continue
        us[cls] = us.get(cls, 0.0) + r["total_us"]
    active = sum(us.values())
    return {k: 100 * v / active for k, v in us.items() if v > 0}


def test_db_time_bar_has_a_segment_per_class_in_proportion() -> None:
    """timemodel.json: the picture at the top is one stacked bar of the DB time (active time)
    by wait class: one segment per class with time, its width its share of the JSON's
    seconds (within 1 px of the 1160 px bar, and 0.5 %), side by side, with a legend; idle
    time is outside the bar and said beside it."""
    doc = _computed("timemodel")
    text = render_html(doc, None)
    page = Page(text)
    assert page.errors == []
    assert text.index('<section id="overview"') < text.index('<section id="findings"')
    svg = next(
        a for t, a in page.tags if t == "svg" and a.get("aria-label") == "DB time by wait class"
    )
    width = float(str(svg["width"]))
    segs = [a for t, a in page.tags if t == "rect" and a.get("class") == "seg"]
    expected = _class_shares(doc)
    assert [a["data-class"] for a in segs] == [c for c in CLASS_ORDER if c in expected]
    x = 0.0
    for a in segs:
        share = expected[str(a["data-class"])]
        w = float(str(a["width"]))
        assert w == pytest.approx(width * share / 100, abs=1.0), a
        assert 100 * w / width == pytest.approx(share, abs=0.5), a
        assert float(str(a["x"])) == pytest.approx(x, abs=0.02)
        assert float(str(a["data-pct"])) == pytest.approx(share, abs=0.01)
        x += w
    assert x == pytest.approx(width, abs=1.0)
    overview = page.text("overview")
    for cls, share in expected.items():
        assert f"{share:.1f} %" in overview, cls
    assert "Lock 71.9 %" in overview and "waiting for a CPU (runqueue)" in overview
    model = time_model(doc)
    assert model is not None
    assert f"DB time: {model.active_s:,.2f} s" in overview
    assert f"Not in it: {model.idle_s:,.2f} s idle" in overview
    # a document without a time model says so, and the rest of the report is there
    _, old = render("pgbench")
    assert "No time model in this document" in old.text("overview")


CLASS_ORDER = ("on CPU", "runqueue", "IO", "Lock", "LWLock", "BufferPin", "IPC", "Client",
               "Timeout", "other")  # fmt: skip


def test_db_time_bar_names_are_text() -> None:
    """An odd wait event type falls in "other"; no name from the document reaches the SVG
    but as escaped text."""
    doc = _computed("timemodel")
    doc["waits"]["rows"].append(
        {
            "category": "wait",
            "wait_event_type": "<b>x</b>",
            "wait_event": "<i>y</i>",
            "total_us": 5e6,
            "sleeps": 1,
        }  # fmt: skip
    )
    text = render_html(doc, None)
    assert "<b>x</b>" not in text and "<i>y</i>" not in text
    page = Page(text)
    assert page.errors == []
    segs = [a["data-class"] for t, a in page.tags if t == "rect" and a.get("class") == "seg"]
    assert segs[-1] == "other"


@pytest.mark.parametrize("name", ["timemodel", "pgbench", "slru"])
def test_findings_in_descending_share_with_short_leads(name: str) -> None:
    """Findings with a share of DB time first, largest first; the rest after, most severe
    first; each has its lead (<= 12 words, bold) before the longer advice, folded."""
    doc = _computed(name)
    text = render_html(doc, None)
    page = Page(text)
    arts = [a for t, a in page.tags if t == "article"]
    shares = [float(str(a["data-share"])) for a in arts if a.get("data-share") is not None]
    assert shares == sorted(shares, reverse=True)
    flags = [a.get("data-share") is not None for a in arts]
    assert flags == sorted(flags, reverse=True), "a finding with a share after one without"
    expected = findings_mod.evaluate(doc)
    assert [a["data-id"] for a in arts] == [f.id for f in expected]
    leads = re.findall(r'<p class="lead"><span class="k">Next step:</span><b>([^<]*)</b>', text)
    assert len(leads) == len(arts)
    for lead in leads:
        assert 0 < len(lead.split()) <= LEAD_MAX_WORDS, lead
    more = [a for t, a in page.tags if t == "details" and a.get("class") == "more"]
    assert len(more) == len(arts) and not any("open" in a for a in more)
    if name == "timemodel":
        assert shares and "71.9 % of DB time" in page.text("findings")


def test_recorded_findings_are_ranked_too() -> None:
    """A document's own findings (older: no share, no lead) are ranked as evaluate ranks
    (shares first, then by severity) and get the lead of their id."""
    doc = load("idle")
    doc["findings"] = [
        {"id": "stats.cache-hit", "severity": "medium", "title": "t1", "next_step": "n1"},
        {"id": "slru.pg_xact", "severity": "high", "title": "t2", "next_step": "n2"},
        {
            "id": "wait.io-read",
            "severity": "low",
            "title": "t3",
            "next_step": "n3",
            "share": 41.7,
        },  # fmt: skip
    ]
    page = Page(render_html(doc, None))
    arts = [a["data-id"] for t, a in page.tags if t == "article"]
    assert arts == ["wait.io-read", "slru.pg_xact", "stats.cache-hit"]
    text = page.text("findings")
    assert "41.7 % of DB time" in text
    assert "See the SimpleLruReadPage callers in the flame graph." in text


def test_time_model_rows_under_0_05_pct_are_folded() -> None:
    """Lines under 0.05 % of active time (0.0 % shown) are folded into one "N more rows" line
    of a closed <details>; the table above has none of them."""
    doc = _computed("timemodel")
    rows = doc["waits"]["rows"]
    base = next(r for r in rows if r["category"] == "wait")
    for i in range(13):  # tiny waits, as a real capture has many
        rows.append({**base, "wait_event_type": "IO", "wait_event": f"Tiny{i}", "total_us": 1.0})
    model = time_model(doc)
    assert model is not None
    small = [c for c in model.components if c.active_pct is not None and c.active_pct < 0.05]
    assert len(small) >= 14
    text = render_html(doc, None)
    page = Page(text)
    assert page.errors == []
    tm = page.text("timemodel")
    assert f"{len(small)} more rows under 0.05 %" in tm
    folds = [a for t, a in page.tags if t == "details" and a.get("id") == "timemodel-folded"]
    assert len(folds) == 1 and "open" not in folds[0]
    table_html = text[text.index('<section id="timemodel"') :]
    shown = table_html[: table_html.index('id="timemodel-folded"')]
    assert "Tiny0" not in shown and "0.0%" not in shown
    folded = table_html[table_html.index('id="timemodel-folded"') : table_html.index("</details>")]
    assert folded.count("<tr>") == len(small) + 1  # and the head


def test_capture_details_are_folded_and_interrupted_only_when_it_was() -> None:
    doc = _computed("timemodel")
    for part in ("lwlocks", "hot"):
        if isinstance(doc.get(part), dict):
            doc[part]["meta"]["interrupted"] = True  # a part stopped at the window's end
    doc["meta"]["interrupted"] = False
    text = render_html(doc, None)
    page = Page(text)
    details = [a for t, a in page.tags if t == "details" and a.get("id") == "capture-details"]
    assert len(details) == 1 and "open" not in details[0]
    assert "interrupted" not in page.text("capture")
    doc["meta"]["interrupted"] = True
    page = Page(render_html(doc, None))
    assert "The capture was interrupted" in page.text("capture")
    assert "interrupted True" in page.text("capture")


def test_time_model_unavailable_says_why_in_one_line() -> None:
    """A build without the address: one line saying why; the rest of the report is there."""
    warning = "waits left out: /usr/sbin/postgres has no symbol my_wait_event_info"
    doc = load("timemodel")
    doc["waits"] = None
    doc["meta"]["warnings"] = [warning]
    doc["findings"] = []
    page = Page(render_html(doc, None))
    assert page.errors == []
    assert (
        page.text("timemodel") == f"Time model (exact, from the scheduler) unavailable: {warning}"
    )
    assert "transactionid" in page.text("waits") and page.text("lwlocks")
    _, old = render("pgbench")
    assert "predates the time model" in old.text("timemodel")


def test_time_model_of_an_empty_capture() -> None:
    doc = load("timemodel")
    doc["waits"]["rows"] = []
    doc["waits"]["cluster_rows"] = []
    page = Page(render_html(doc, None))
    assert "no client backend was seen in the window" in page.text("timemodel")
    assert "no PostgreSQL process was seen in the window" in page.text("timemodel")


def test_terminal_time_model_lines() -> None:
    """The summary's time model: exact seconds and shares, the sampled share beside."""
    doc = load("timemodel")
    lines = view.time_model_lines(doc)
    assert lines[0].startswith("time model (exact): ")
    xid = next(ln for ln in lines if "Lock:transactionid" in ln)
    rows = {r["wait_event"]: r for r in doc["waits"]["rows"]}
    assert f"{rows['transactionid']['total_us'] / 1e6:.3f} s" in xid and "sampled  75.7 %" in xid
    doc["waits"] = None
    doc["meta"]["warnings"] = ["waits left out: no symbol my_wait_event_info"]
    assert view.time_model_lines(doc) == [
        "time model: unavailable: waits left out: no symbol my_wait_event_info"
    ]
    assert view.time_model_lines(load("pgbench")) == []
    by_class = view.time_model_lines(load("timemodel"))[1]
    assert by_class.startswith("  DB time by class: on CPU ") and "Lock 71.9 %" in by_class


def test_statements_and_checkpoints_of_pgbench() -> None:
    doc = load("pgbench")
    _, page = render("pgbench")
    sql = page.text("sql")
    assert "UPDATE pgbench_branches SET bbalance = bbalance + $1 WHERE bid = $2" in sql
    assert f"{doc['stats']['bgwriter']['checkpoints_req']:,}" in sql
    assert "checkpoints requested" in page.text("findings")


def test_findings_from_the_document_are_used_when_present() -> None:
    doc = load("idle")
    doc["findings"] = [
        {
            "id": "x",
            "severity": "medium",
            "title": "Recorded finding",
            "evidence": "e",
            "next_step": "n",
            "section": "lwlocks",
        }
    ]
    page = Page(render_html(doc, None))
    text = page.text("findings")
    assert "Recorded finding" in text and "Nothing stands out" not in text
    assert any(a.get("href") == "#lwlocks" for a in page.attrs("a"))


def test_a_given_flame_svg_is_the_one_embedded() -> None:
    svg = render_svg("postgres;PostgresMain;ExecScan 5\n", title="Given <title> & co")
    _, page = render("idle", flame_svg=svg)
    inner = srcdoc(page)
    assert "Given &lt;title&gt; &amp; co" in inner
    assert "<?xml" not in inner


def test_svg_parts_parse_as_xml() -> None:
    text, page = render("slru")
    m = re.search(r'<svg class="timeline".*?</svg>', text, re.S)
    assert m is not None
    chart = ET.fromstring(m.group(0))
    bars = [e for e in chart.iter("rect") if e.get("class") == "bar"]
    assert len(bars) >= 5
    assert {b.get("data-type") for b in bars} >= {"Lock", "LWLock", "CPU"}
    assert all(float(b.get("height") or 0) > 0 for b in bars)
    inner = srcdoc(page)
    fm = re.search(r"<svg\b.*</svg>", inner, re.S)
    assert fm is not None
    flame = ET.fromstring(fm.group(0))
    assert flame.tag == "{http://www.w3.org/2000/svg}svg"


def test_timeline_stacks_active_backends_by_wait_type() -> None:
    activity = {
        "interval_s": 1.0,
        "samples": [
            {"t": 0.0, "active": 5, "total": 9, "waits": {"CPU": 2, "Lock:tuple": 1}},
            {"t": 1.0, "active": 0, "total": 9, "waits": {}},
            {"t": 2.0, "active": 3, "total": 9, "waits": {"IO:DataFileRead": 3}},
        ],
    }
    chart = ET.fromstring(timeline_svg(activity))
    bars = [e for e in chart.iter("rect") if e.get("class") == "bar"]
    # sample 0: CPU 2, Lock 1 and 2 active backends talking to clients; sample 2: IO 3
    assert [b.get("data-type") for b in bars] == ["CPU", "Lock", "Client", "IO"]
    heights = [float(b.get("height") or 0) for b in bars]
    assert heights[0] == pytest.approx(2 * heights[1]) and heights[3] == pytest.approx(
        3 * heights[1]
    )
    titles = [t.text or "" for b in bars for t in b.iter("title")]
    assert titles[1] == "0.0 s: Lock 1 of 5 active (tuple 1)"
    labels = [t.text for t in chart.iter("text")]
    assert "active backends" in labels and "seconds since the start of the capture" in labels
    assert "CPU (no wait event)" in labels and "IO" in labels


# ---------------------------------------------------------------------------------------------
# Escaping and no network.


def _evil_doc() -> dict[str, Any]:
    doc = load("pgbench")
    doc["stats"]["statements"][0]["query"] = EVIL_QUERY
    doc["waits"] = load("timemodel")["waits"]  # the recorded pgbench run predates it
    doc["waits"]["statements"] = {
        "db_time_us": 1e6,
        "rows": [
            {
                "kind": "statement",
                "query_id": 1,
                "query": EVIL_QUERY,
                "db_time_us": 1e6,
                "waits": [{"wait_event_type": "<b>Lock", "wait_event": "x</b>", "total_us": 1.0}],
            }
        ],
    }
    doc["waits"]["locks"] = {
        "lock_wait_us": 1e6,
        "rows": [{"lock": EVIL_TABLE, "locktype": "relation", "mode": "AccessShareLock",
                  "total_us": 1e6, "waits": 1, "max_us": 1e6, "waiters": [{"pid": 1}]}],
        "blocking": {"trees": [{"root": {"pid": 2, "state": "idle in transaction",
                                         "query": EVIL_QUERY}, "waited_us": 1e6,
                                "waiters": [{"pid": 1, "behind": 2, "lock": EVIL_TABLE,
                                             "waited_us": 1e6}]}]},
    }  # fmt: skip
    doc["hot"]["rows"][0]["function"] = "<img src=x onerror=alert(2)>"
    doc["meta"]["host"] = 'db"><script>alert(3)</script>'
    doc["meta"]["warnings"].append("see https://wiki.example.org/page?a=1&b=<2>")
    return doc


def test_strings_from_the_database_are_escaped() -> None:
    text = render_html(_evil_doc(), None)
    page = Page(text)
    assert page.errors == []
    assert "<script>alert" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert page.attrs("script") == [] and page.attrs("img") == []  # the page runs no script
    sql = page.text("sql")
    assert EVIL_QUERY in sql  # shown exactly as the server has it
    assert EVIL_QUERY in page.text("statements") and "<b>Lock:x</b>" in page.text("statements")
    assert "<b>Lock" not in text
    assert EVIL_TABLE in page.text("locks") and "<img src=y" not in text
    assert EVIL_QUERY in page.text("locks") and "root of 1 waiting" in page.text("locks")
    assert 'db"><script>alert(3)</script>' in page.text("capture")
    assert "<img src=x onerror=alert(2)>" in page.text("cpu")


def test_application_names_and_file_names_are_escaped() -> None:
    doc = load("slru")
    row = doc["clog_reads"]["rows"][0]
    row["application_name"] = "<b onmouseover=alert(4)>app</b> & 'x'"
    row["backend_type"] = '"><svg onload=alert(5)>'
    doc["lwlocks"]["rows"][0]["tranche"] = "<i>Tranche</i>"
    text = render_html(doc, None)
    page = Page(text)
    assert page.errors == []
    assert "<b onmouseover" not in text and "<svg onload" not in text and "<i>Tranche" not in text
    slru = page.text("slru")
    assert "<b onmouseover=alert(4)>app</b> & 'x'" in slru  # shown as the server has it
    assert '"><svg onload=alert(5)>' in slru
    assert "<i>Tranche</i>" in page.text("lwlocks")


def test_the_stylesheet_comes_from_its_file() -> None:
    """The report's CSS is package data (render/report/assets/report.css), inlined."""
    css = (resources.files("pgprobe.render.report") / "assets" / "report.css").read_text()
    text = render_html(load("idle"), None)
    rules = [line for line in css.splitlines() if line.startswith(".finding")]
    assert rules and all(rule in text for rule in rules)


def test_nothing_refers_to_the_network() -> None:
    text = render_html(_evil_doc(), None)
    page = Page(text)
    # the only literal URLs allowed are the flame graph's xmlns attributes (none are left: the
    # report writes '://' as '&#58;//' everywhere, the srcdoc included)
    for m in re.finditer(r"https?://", text, re.I):
        before = text[max(0, m.start() - 12) : m.start()]
        assert "xmlns" in before, text[m.start() - 40 : m.end() + 40]
    for tag, attrs in page.tags:
        for key in (
            "src",
            "href",
            "xlink:href",
            "action",
            "srcset",
            "poster",
            "data",
            "formaction",
        ):
            value = attrs.get(key)
            assert value is None or value.startswith("#"), (tag, key, value)
    assert "url(" not in text and "@import" not in text
    assert "default-src 'none'" in text  # and the browser is told so
    # text with a URL is still shown as written
    assert "see https://wiki.example.org/page?a=1&b=<2>" in page.text("capture")
    assert "http://x.example/" in page.text("sql")


# ---------------------------------------------------------------------------------------------
# Sections that could not run.


def test_null_sections_say_why() -> None:
    doc = load("pgbench")
    for name in SECTIONS:
        doc[name] = None
    doc["meta"]["warnings"] = [
        "lwlocks left out: /usr/sbin/postgres was built without --enable-dtrace",
        "profile left out: perf_event_open refused (kernel.perf_event_paranoid = 3)",
        "clog_reads left out: clog-reads is not available yet",
        "pg_stat_activity sampling stopped: server closed the connection",
    ]
    doc["findings"] = []
    text = render_html(doc, None)
    page = Page(text)
    assert page.errors == []
    assert (
        "unavailable: lwlocks left out: /usr/sbin/postgres was built without --enable-dtrace"
        in (page.text("lwlocks"))
    )
    assert "unavailable: profile left out: perf_event_open refused" in page.text("flame")
    assert "unavailable: profile left out: perf_event_open refused" in page.text("cpu")
    assert "unavailable: clog_reads left out: clog-reads is not available yet" in page.text("slru")
    assert "unavailable: pg_stat_activity sampling stopped" in page.text("waits")
    assert "unavailable: no reason was recorded" in page.text("sql")
    assert page.attrs("iframe") == []
    findings = page.text("findings")
    assert "No LWLock waits in this report" in findings
    assert "Sections that could not run" in page.text("capture")


def test_partial_stats() -> None:
    """PostgreSQL 13 has no pg_stat_wal; pg_stat_statements absent; PG 17's checkpointer."""
    doc = load("pgbench")
    doc["meta"]["postgres_version_num"] = 130012
    doc["stats"]["wal"] = None
    doc["stats"]["statements"] = None
    doc["stats"]["checkpointer"] = {"num_timed": 0, "num_requested": 2, "buffers_written": 10}
    page = Page(render_html(doc, None))
    sql = page.text("sql")
    assert "unavailable: pg_stat_wal does not exist before PostgreSQL 14" in sql
    assert "pg_stat_checkpointer" in sql and "num_requested" in sql
    assert "unavailable: pg_stat_statements is not installed" in sql


# ---------------------------------------------------------------------------------------------
# In a browser.


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with headless_chromium("1280,1000", "--hide-scrollbars") as drv:
        yield drv


@pytest.fixture(scope="module")
def report_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("report") / "triage.html"
    path.write_text(render_html(load("slru"), None), encoding="utf-8")
    return path.as_uri()


def console_problems(drv: Any) -> list[str]:
    return [e["message"] for e in drv.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")]


def open_report(drv: Any, url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    drv.switch_to.default_content()
    drv.get("about:blank")
    drv.get(url)
    WebDriverWait(drv, 10).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )


def into_flame(drv: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    drv.switch_to.frame(drv.find_element("id", "flamegraph"))
    WebDriverWait(drv, 10).until(
        lambda d: (
            d.execute_script("return document.documentElement.getAttribute('data-ready')") == "1"
        )
    )


def frame_g(drv: Any, name: str) -> Any:
    """The widest frame called `name`."""
    best, width = None, -1.0
    for g in drv.find_elements("css selector", "g.f"):
        tip = g.find_element("tag name", "title").get_attribute("textContent")
        if tip[: tip.rindex(" (")] == name and rect_width(g) > width:
            best, width = g, rect_width(g)
    assert best is not None, f"no frame {name!r}"
    return best


def rect_width(g: Any) -> float:
    return float(g.find_element("tag name", "rect").get_attribute("width"))


def test_browser_report_loads_cleanly(driver: Any, report_url: str) -> None:
    open_report(driver, report_url)
    assert console_problems(driver) == []
    sections = driver.execute_script(
        "return Array.from(document.querySelectorAll('main > section')).map(s => s.id)"
    )
    assert sections == REPORT_SECTIONS
    first = driver.find_element("css selector", "article.finding")
    assert "sev-high" in first.get_attribute("class").split()
    assert first.value_of_css_property("border-left-color") == "rgba(198, 40, 40, 1)"
    # nothing wider than the window
    assert driver.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    # numbers right-aligned
    cell = driver.find_element("css selector", "#lwlocks td.num")
    assert cell.value_of_css_property("text-align") == "right"


def test_browser_db_time_bar(driver: Any, tmp_path: Path) -> None:
    """The DB time bar drawn: each segment's on-screen width is its share of the bar's
    (within 1 px), the legend beside; a screenshot of the top for a person."""
    path = tmp_path / "timemodel.html"
    path.write_text(render_html(_computed("timemodel"), None), encoding="utf-8")
    open_report(driver, path.as_uri())
    assert console_problems(driver) == []
    bar = driver.execute_script(
        "return document.querySelector('#overview svg').getBoundingClientRect().width"
    )
    segs = driver.execute_script(
        "return Array.from(document.querySelectorAll('#overview rect.seg'))"
        ".map(r => [r.getAttribute('data-pct'), r.getBoundingClientRect().width])"
    )
    assert len(segs) >= 3
    for pct, w in segs:
        assert w == pytest.approx(bar * float(pct) / 100, abs=1.0)
    legend = driver.find_elements("css selector", "#overview ul.legend li")
    assert len(legend) == len(segs) and all(li.is_displayed() for li in legend)
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "triage_report_db_time.png"))


def test_browser_timeline_has_bars(driver: Any, report_url: str) -> None:
    open_report(driver, report_url)
    heights = driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.timeline rect.bar'))"
        ".map(r => r.getBoundingClientRect().height)"
    )
    assert len(heights) >= 5 and all(h > 0 for h in heights)
    legend = driver.execute_script(
        "return Array.from(document.querySelectorAll('svg.timeline .legend-item text'))"
        ".map(t => t.textContent)"
    )
    assert "CPU (no wait event)" in legend and "Lock" in legend
    chart = driver.find_element("css selector", "svg.timeline")
    assert chart.size["width"] > 900 and chart.size["height"] > 200


def test_browser_flame_graph_renders_zooms_and_searches(driver: Any, report_url: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    open_report(driver, report_url)
    iframe = driver.find_element("id", "flamegraph")
    assert iframe.size["width"] > 1000 and iframe.size["height"] > 400
    into_flame(driver)
    widths = driver.execute_script(
        "return Array.from(document.querySelectorAll('#frames rect'))"
        ".map(r => r.getBoundingClientRect().width)"
    )
    assert len(widths) > 100 and all(w > 0 for w in widths)
    plotw = driver.execute_script("return P.plotw")
    assert plotw == 1200 - 2 * XPAD
    # hover names the frame in the status line
    g = frame_g(driver, "base_yyparse")
    ActionChains(driver).move_to_element(g.find_element("tag name", "rect")).perform()
    status = driver.execute_script("return document.getElementById('status').textContent")
    assert status.startswith("base_yyparse (")
    # a click zooms into the frame: it fills the width, its view is in the frame's URL
    before = rect_width(g)
    assert before < plotw * 0.5
    g.find_element("tag name", "rect").click()
    assert rect_width(g) == pytest.approx(plotw, abs=0.01)
    assert "#x=" in driver.execute_script("return location.href")
    # search highlights and reports the matched share
    pct = driver.execute_script("return search('yyparse|yylex')")
    assert 0 < pct < 100
    matched = driver.execute_script("return document.getElementById('matched').textContent")
    assert matched.startswith("Matched: ")
    driver.find_element("id", "unzoom").click()
    assert rect_width(g) == pytest.approx(before, abs=0.01)
    driver.switch_to.default_content()
    # the report's own URL is untouched by the zoom
    assert "#x=" not in driver.current_url
    assert console_problems(driver) == []


def test_browser_ctrl_f_is_the_browsers_outside_the_graph(driver: Any, report_url: str) -> None:
    """The flame graph's Ctrl-F search prompt only answers inside its frame."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    open_report(driver, report_url)
    driver.find_element("css selector", "h2").click()
    ActionChains(driver).key_down(Keys.CONTROL).send_keys("f").key_up(Keys.CONTROL).perform()
    with pytest.raises(TimeoutException):
        WebDriverWait(driver, 1).until(ec.alert_is_present())


def test_browser_screenshots(driver: Any, report_url: str) -> None:
    """Screenshots for a person: the first screen, and the whole report."""
    open_report(driver, report_url)
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "triage_report_top.png"))
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, min(int(height) + 20, 12000))
    try:
        driver.save_screenshot(str(ARTIFACTS / "triage_report.png"))
        driver.execute_script("document.getElementById('waits').scrollIntoView()")
    finally:
        driver.set_window_size(1280, 1000)
    driver.execute_script("document.getElementById('flame').scrollIntoView()")
    into_flame(driver)
    frame_g(driver, "PortalRun").find_element("tag name", "rect").click()
    driver.switch_to.default_content()
    driver.save_screenshot(str(ARTIFACTS / "triage_report_flame_zoomed.png"))
    assert (ARTIFACTS / "triage_report.png").stat().st_size > 50_000
    assert console_problems(driver) == []
