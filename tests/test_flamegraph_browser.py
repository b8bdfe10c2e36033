"""The flame graph SVG in a real browser: Debian's headless Chromium driven by selenium.

Needs ``apt-get install chromium chromium-driver`` and ``pip install selenium``. The driver is
always /usr/bin/chromedriver (or $PGPROBE_CHROMEDRIVER): selenium-manager is never run and
nothing is downloaded. Without a browser the tests are skipped, except under CI=true where
they fail. Screenshots go to tests/artifacts/ (gitignored) for a person to look at.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import ARTIFACTS, headless_chromium

from pgprobe.render.flamegraph import XPAD, parse_folded, render_svg

SAMPLE = Path(__file__).parent.parent / "samples" / "flamegraph_pgbench.svg"
WIDTH = 1200
PLOTW = WIDTH - 2 * XPAD

PROFILE = """\
postgres;PostgresMain;exec_simple_query;PortalRun;ExecutePlan;ExecScan;SeqNext;heap_getnextslot 400
postgres;PostgresMain;exec_simple_query;PortalRun;ExecutePlan;ExecScan;ExecInterpExpr;int4eq 200
postgres;PostgresMain;exec_simple_query;PortalRun;ExecutePlan;ExecScan;SeqNext;heap_getnextslot;\
ReadBufferExtended;smgrread;libc.so.6`pread64;vfs_read_[k];filemap_read_[k] 100
postgres;PostgresMain;exec_simple_query;PortalRun;ExecutePlan;ExecHashJoin;ExecScan;SeqNext 150
postgres;PostgresMain;exec_simple_query;pg_plan_queries;planner;standard_planner 100
postgres;PostgresMain;ReadCommand;pq_getbyte;secure_read;libc.so.6`__libc_recv;\
entry_SYSCALL_64_[k];__x64_sys_recvfrom_[k];schedule_[k] 300
postgres;PostgresMain;exec_simple_query;PortalRun;ExecutePlan;\
pg_stat_statements.so`pgss_ExecutorRun 50
postgres;PostgresMain;[unknown];postgres+0x4a2f10 30
"""
STACKS = parse_folded(PROFILE)
TOTAL = sum(STACKS.values())


def expected_pct(pattern: str, flags: int = 0) -> float:
    """Percent of samples under at least one frame matching: each stack counted once."""
    rx = re.compile(pattern, flags)
    hit = sum(n for stack, n in STACKS.items() if any(rx.search(f) for f in stack))
    return 100 * hit / TOTAL


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with headless_chromium("1240,900") as drv:
        yield drv


@pytest.fixture(scope="module")
def svg_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("fg") / "flame.svg"
    path.write_text(
        render_svg(PROFILE, title="pgbench, pid 4242", subtitle="10 s at 99 Hz", width=WIDTH),
        encoding="utf-8",
    )
    return path.as_uri()


def load(drv: Any, url: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    drv.get("about:blank")  # a new document even when only the fragment differs
    drv.get(url)
    WebDriverWait(drv, 10).until(
        lambda d: (
            d.execute_script("return document.documentElement.getAttribute('data-ready')") == "1"
        )
    )


def frame(drv: Any, name: str, depth: int | None = None) -> Any:
    """The <g> of the (first) frame called ``name``."""
    from selenium.webdriver.common.by import By

    for g in drv.find_elements(By.CSS_SELECTOR, "g.f"):
        tip = g.find_element(By.TAG_NAME, "title").get_attribute("textContent")
        if tip[: tip.rindex(" (")] == name and (
            depth is None or g.get_attribute("data-d") == str(depth)
        ):
            return g
    raise AssertionError(f"no frame {name!r}")


def rect_width(g: Any) -> float:
    from selenium.webdriver.common.by import By

    return float(g.find_element(By.TAG_NAME, "rect").get_attribute("width"))


def text_of(drv: Any, el_id: str) -> str:
    return str(drv.execute_script(f"return document.getElementById('{el_id}').textContent"))


def severe_logs(drv: Any) -> list[str]:
    return [e["message"] for e in drv.get_log("browser") if e.get("level") == "SEVERE"]


def test_frames_render(driver: Any, svg_url: str) -> None:
    from selenium.webdriver.common.by import By

    load(driver, svg_url)
    n_frames = len(driver.find_elements(By.CSS_SELECTOR, "g.f"))
    widths = driver.execute_script(
        "return Array.from(document.querySelectorAll('#frames rect'))"
        ".map(function (r) { return r.getBoundingClientRect().width; })"
    )
    assert n_frames > 20
    assert len(widths) == n_frames and all(w > 0 for w in widths)
    assert rect_width(frame(driver, "all")) == pytest.approx(PLOTW, abs=0.01)
    legend = driver.execute_script(
        "return Array.from(document.querySelectorAll('#legend text'))"
        ".map(function (t) { return t.textContent; })"
    )
    assert legend == [
        "postgres",
        "kernel",
        "libc / ld.so",
        "other libraries / extensions",
        "unresolved",
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "flamegraph_initial.png"))
    assert severe_logs(driver) == []


def test_hover_shows_name_samples_percent(driver: Any, svg_url: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    load(driver, svg_url)
    g = frame(driver, "ExecutePlan")
    ActionChains(driver).move_to_element(g.find_element(By.TAG_NAME, "rect")).perform()
    n = 400 + 200 + 100 + 150 + 50
    assert text_of(driver, "status") == f"ExecutePlan ({n:,} samples, {100 * n / TOTAL:.2f}%)"


def test_click_zooms_and_hash_reproduces_it(driver: Any, svg_url: str) -> None:
    from selenium.webdriver.common.by import By

    load(driver, svg_url)
    g = frame(driver, "ExecutePlan")
    before = rect_width(g)
    assert before < PLOTW * 0.8
    g.find_element(By.TAG_NAME, "rect").click()
    assert rect_width(g) == pytest.approx(PLOTW, abs=0.01)
    # children fill it in proportion, ancestors are dimmed, the rest hidden
    scan = frame(driver, "ExecScan", depth=6)
    assert rect_width(scan) == pytest.approx(PLOTW * 700 / 900, abs=0.01)
    assert "p" in frame(driver, "PostgresMain").get_attribute("class").split()
    assert rect_width(frame(driver, "PostgresMain")) == pytest.approx(PLOTW, abs=0.01)
    assert "h" in frame(driver, "ReadCommand").get_attribute("class").split()
    url = driver.current_url
    start, depth = g.get_attribute("data-s"), g.get_attribute("data-d")
    assert f"x={start}" in url and f"y={depth}" in url
    # the same link opened afresh shows the same zoom
    load(driver, url)
    assert rect_width(frame(driver, "ExecutePlan")) == pytest.approx(PLOTW, abs=0.01)
    assert "h" in frame(driver, "ReadCommand").get_attribute("class").split()
    # Reset Zoom
    driver.find_element(By.ID, "unzoom").click()
    assert rect_width(frame(driver, "ExecutePlan")) == pytest.approx(before, abs=0.01)
    assert "x=" not in driver.current_url
    assert severe_logs(driver) == []


def test_search_highlights_and_counts_nested_matches_once(driver: Any, svg_url: str) -> None:
    load(driver, svg_url)
    hl = driver.execute_script("return P.hl")
    # "Exec" matches ExecutePlan and, inside it, ExecScan, ExecInterpExpr, ExecHashJoin
    pct = driver.execute_script("return search('Exec')")
    want = expected_pct("Exec")
    assert want == pytest.approx(100 * 900 / TOTAL)
    assert pct == pytest.approx(want)
    assert text_of(driver, "matched").startswith(f"Matched: {want:.2f}%")
    assert frame(driver, "ExecInterpExpr").find_element("tag name", "rect").get_attribute(
        "fill"
    ) == (hl)
    assert frame(driver, "SeqNext", depth=7).find_element("tag name", "rect").get_attribute(
        "fill"
    ) != (hl)
    assert "q=Exec" in driver.current_url
    # case sensitivity toggle ("ic")
    assert driver.execute_script("return search('^executeplan')") == 0
    driver.find_element("id", "ic").click()
    assert driver.execute_script("return search('^executeplan')") == pytest.approx(
        expected_pct("^executeplan", re.IGNORECASE)
    )
    assert "i=1" in driver.current_url
    driver.find_element("id", "ic").click()
    # search and zoom together survive a reload of the link
    driver.execute_script("search('heap|vfs')")
    frame(driver, "exec_simple_query").find_element("tag name", "rect").click()
    driver.save_screenshot(str(ARTIFACTS / "flamegraph_zoom_search.png"))
    url = driver.current_url
    load(driver, url)
    assert text_of(driver, "matched").startswith(f"Matched: {expected_pct('heap|vfs'):.2f}%")
    assert rect_width(frame(driver, "exec_simple_query")) == pytest.approx(PLOTW, abs=0.01)
    fill = frame(driver, "heap_getnextslot").find_element("tag name", "rect").get_attribute("fill")
    assert fill == hl
    # Escape clears it
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    ActionChains(driver).send_keys(Keys.ESCAPE).perform()
    assert text_of(driver, "matched") == ""
    assert "q=" not in driver.current_url
    assert severe_logs(driver) == []


def test_ctrl_f_prompts_for_a_regex(driver: Any, svg_url: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    load(driver, svg_url)
    ActionChains(driver).key_down(Keys.CONTROL).send_keys("f").key_up(Keys.CONTROL).perform()
    alert = WebDriverWait(driver, 5).until(ec.alert_is_present())
    alert.send_keys("planner")
    alert.accept()
    assert text_of(driver, "matched").startswith(f"Matched: {expected_pct('planner'):.2f}%")
    assert text_of(driver, "search") == "Reset Search"
    driver.find_element("id", "search").click()  # the button now resets
    assert text_of(driver, "matched") == ""


def test_sample_looks_like_a_flame_graph(driver: Any) -> None:
    """Screenshot of samples/flamegraph_pgbench.svg (a real capture), for a person to look at."""
    assert SAMPLE.exists(), f"{SAMPLE} is a committed capture (docs/flame.md says how)"
    load(driver, SAMPLE.resolve().as_uri())
    n = driver.execute_script("return frames.length")
    assert n > 100
    height = driver.execute_script("return document.documentElement.height.baseVal.value")
    driver.set_window_size(1240, int(height) + 140)  # the whole picture, legend included
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "flamegraph_pgbench.png"))
    driver.set_window_size(1240, 900)
    assert severe_logs(driver) == []
