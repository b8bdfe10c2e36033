"""`pgprobe triage` on a loaded cluster with a provoked SLRU problem: the report is real."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import slru_workload
from helpers import cluster_for, run_pgprobe

from pgprobe import pgversions
from pgprobe.pgbuilds import PgBuild
from pgprobe.sandbox import PgCluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def thrashing(
    pg_build: PgBuild, tracing: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PgCluster]:
    """Few pg_xact buffers; pgbench -c 4 (TPC-B-like) and 4 clients looking up old xids.

    On each build (the report's HTML and the terminal summary: once): the SQL
    sections read each version's views, and the findings must still be right.
    """
    settings = {**slru_workload.CLUSTER_SETTINGS, "max_connections": "60"}
    with cluster_for(pg_build, settings, name="pgprobe-triage") as pg:
        init = pg.pgbench("-i", "-q", "-s", "1")
        assert init.wait(timeout=300) == 0
        with pg.connect() as conn:
            n = slru_workload.xact_burn_size(conn) * 2
        first, last = slru_workload.burn_xids(pg.conninfo, n)
        script = tmp_path_factory.mktemp("triage") / "lookups.sql"
        script.write_text(slru_workload.xact_lookup_pgbench_script(first, last))
        loads = [
            pg.pgbench("-c", "4", "-j", "1", "-T", "600"),
            pg.pgbench("-n", "-c", "4", "-j", "1", "-T", "600", "-f", str(script)),
        ]
        time.sleep(1.5)
        assert all(load.poll() is None for load in loads)
        yield pg
        for load in loads:
            load.terminate()
            load.communicate(timeout=30)


class _Sections(HTMLParser):
    """Collects section ids, iframes and inline SVGs of the report (and fails on nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.iframes: list[dict[str, str | None]] = []
        self.svgs = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section" and found.get("id"):
            self.sections.append(str(found["id"]))
        elif tag == "iframe":
            self.iframes.append(found)
        elif tag == "svg":
            self.svgs += 1


@pytest.fixture(scope="module")
def triage_run(thrashing: PgCluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    report = tmp_path_factory.mktemp("report") / "report.html"
    done = run_pgprobe(
        ["triage", *thrashing.conn_args, "-d", "6", "-o", str(report), "--json"], timeout=240
    )
    assert done.returncode == 0, done.stderr
    return {"doc": json.loads(done.stdout), "html": report.read_text(), "stderr": done.stderr}


def test_every_section_has_real_data(
    pg_build: PgBuild, triage_run: dict[str, Any], tested_on: Callable[[str, str], None]
) -> None:
    doc = triage_run["doc"]
    meta = doc["meta"]
    assert 5.5 <= meta["duration_s"] <= 9
    if pg_build.has_usdt:
        assert sorted(meta["parts"]) == ["clog_reads", "lwlocks", "profile"]
        assert doc["lwlocks"]["rows"], "pgbench gives LWLock waits"
    else:
        assert sorted(meta["parts"]) == ["clog_reads", "profile"]
        assert any(w.startswith("lwlocks left out: ") for w in meta["warnings"]), meta
        assert doc["lwlocks"] is None
    assert doc["hot"]["rows"] and doc["flame"]["samples"] > 0
    assert sum(doc["flame"]["folded"].values()) == doc["flame"]["samples"]
    xact = [r for r in doc["clog_reads"]["rows"] if r["slru"] == "pg_xact"]
    assert xact, (doc["clog_reads"]["meta"], doc["stats"]["slru"], doc["meta"]["warnings"])
    assert all(r["bytes"] == r["reads"] * 8192 for r in xact)
    assert len(doc["activity"]["samples"]) >= 5
    assert doc["activity"]["wait_profile"]
    assert doc["stats"]["database"]["xact_commit"] > 0
    stat_xact = {r["slru"]: r for r in doc["stats"]["slru"]}["pg_xact"]
    assert stat_xact["blks_read"] > 0  # PostgreSQL saw the misses too
    # Each version's views: pg_stat_checkpointer 17+, pg_stat_io 16+ (18: io workers).
    version = meta["postgres_version_num"]
    stats = doc["stats"]
    assert (stats["checkpointer"] is not None) == pgversions.has_pg_stat_checkpointer(version)
    assert (stats["io"] is not None) == pgversions.has_pg_stat_io(version)
    if stats["io"] is not None:
        assert stats["io"]["client backend"] > 0  # 128kB of shared_buffers: backends evict
        assert ("io worker" in stats["io"]) == pgversions.has_io_workers(version)
    # 128kB of shared_buffers under pgbench: backends write their own dirty buffers, which
    # the finding reads from pg_stat_bgwriter before 17 and from pg_stat_io after.
    ids = [f["id"] for f in doc["findings"]]
    assert "stats.backend-writes" in ids, ids
    tested_on("triage", "yes" if pg_build.has_usdt else "yes, without the LWLock table")


def test_the_provoked_slru_problem_is_the_finding(triage_run: dict[str, Any]) -> None:
    findings = triage_run["doc"]["findings"]
    slru = [f for f in findings if f["id"] == "slru.pg_xact"]
    assert slru, [f["id"] for f in findings]
    assert slru[0]["severity"] in ("high", "medium")
    assert "pg_xact reads" in slru[0]["title"]


@pytest.mark.once
def test_report_is_one_self_contained_html_file(triage_run: dict[str, Any]) -> None:
    html = triage_run["html"]
    parser = _Sections()
    parser.feed(html)
    parser.close()
    for section in ("findings", "flame", "lwlocks", "slru", "waits", "cpu", "sql", "capture"):
        assert section in parser.sections, (section, parser.sections)
    assert parser.sections.index("findings") == 0  # findings first
    (flame,) = [f for f in parser.iframes if f.get("id") == "flamegraph"]
    assert "<svg" in str(flame.get("srcdoc"))  # the interactive flame graph, inline
    assert parser.svgs >= 1  # the wait-event timeline
    doc = triage_run["doc"]
    assert doc["lwlocks"]["rows"][0]["tranche"] in html
    assert "pg_xact/" in html
    assert 'src="http' not in html and 'href="http' not in html


@pytest.mark.once
def test_terminal_summary_and_default_report_name(thrashing: PgCluster, tmp_path: Path) -> None:
    done = run_pgprobe(["triage", *thrashing.conn_args, "-d", "3"], timeout=240)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("pgprobe triage: ")
    assert "pg_xact reads" in out
    report = Path(out.strip().splitlines()[-1].removeprefix("report: "))
    try:
        assert report.name.startswith("pgprobe-triage-") and report.suffix == ".html"
        assert report.stat().st_size > 10_000
    finally:
        report.unlink(missing_ok=True)
