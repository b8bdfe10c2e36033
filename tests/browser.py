"""Headless Debian Chromium through selenium, for the tests that look at pages.

The system browser and driver only (apt-get install chromium chromium-driver):
selenium-manager, which would download a driver, is made to fail. Chromium runs
with the flags this closed network needs and a fresh profile directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import need

CHROMIUM = os.environ.get("PGPROBE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("PGPROBE_CHROMEDRIVER", "/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).parent / "artifacts"  # screenshots, for a person to look at


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} not found (apt-get install {pkg})"
    return None


@contextmanager
def headless_chromium(window_size: str, *extra_args: str) -> Iterator[Any]:
    """A selenium driver of headless Chromium (skipped if absent, failed under CI=true)."""
    problem = missing()
    need(problem is None, f"browser test: {problem}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common import selenium_manager

    def no_manager(*args: object, **kwargs: object) -> None:
        raise AssertionError("selenium-manager must not run (it would download a driver)")

    profile_dir = tempfile.mkdtemp(prefix="pgprobe-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile_dir}",
        f"--window-size={window_size}",
        *extra_args,
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(selenium_manager.SeleniumManager, "binary_paths", no_manager)
        drv = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile_dir, ignore_errors=True)
