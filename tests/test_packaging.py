"""A non-editable install carries the probe scripts and the report's templates and stylesheets
inside the package, and finds them from outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import CHECKOUT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(CHECKOUT),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("pgprobe-*.whl")
    return built


def test_wheel_carries_bpf_and_d_scripts(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    scripts = [*(CHECKOUT / "bpf").glob("*.bt"), *(CHECKOUT / "d").glob("*.d")]
    assert scripts
    for script in scripts:
        assert f"pgprobe/{script.parent.name}/{script.name}" in names


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed (pip install, not -e)."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return venv


def test_installed_package_finds_its_scripts(venv: Path, tmp_path: Path) -> None:
    """Look from outside the checkout."""
    probe = (
        "import pgprobe.scripts as s; p = s.script_path('bpf', 'lwlock_wait.bt'); "
        "assert 'site-packages' in str(p), p; print(p)"
    )
    found = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path
    )
    assert found.returncode == 0, found.stderr
    assert (
        Path(found.stdout.strip()).read_text() == (CHECKOUT / "bpf" / "lwlock_wait.bt").read_text()
    )


def test_wheel_carries_the_report_templates_and_stylesheets(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    report = CHECKOUT / "pgprobe" / "render" / "report"
    files = [*(report / "templates").iterdir(), *(report / "assets").iterdir()]
    assert any(f.suffix == ".css" for f in files) and any(f.suffix == ".html" for f in files)
    for f in files:
        assert f"pgprobe/render/report/{f.parent.name}/{f.name}" in names


def test_installed_package_renders_a_report(venv: Path, tmp_path: Path) -> None:
    """The installed wheel renders the triage report of a recorded document, templates and
    stylesheet read from site-packages. Jinja2 and MarkupSafe come from the test's own
    environment (the venv was made with --no-deps: no network in tests)."""
    import jinja2
    import markupsafe

    libs = tmp_path / "libs"
    libs.mkdir()
    for mod in (jinja2, markupsafe):
        (libs / mod.__name__).symlink_to(Path(str(mod.__file__)).parent)
    script = (
        "import json, sys, pgprobe.render.report as r; "
        "assert 'site-packages' in r.__file__, r.__file__; "
        "doc = json.load(open(sys.argv[1])); "
        "sys.stdout.write(r.render_html(doc, None))"
    )
    fixture = CHECKOUT / "tests" / "fixtures" / "triage" / "slru.json"
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script, str(fixture)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(libs)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    page = done.stdout
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert ".finding{border:1px solid var(--line)" in page  # the stylesheet, inlined
    assert '<svg class="timeline"' in page and 'id="flamegraph"' in page
    assert "pg_xact reads:" in page
