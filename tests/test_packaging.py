"""A non-editable install carries the probe scripts inside the package."""

from __future__ import annotations

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


def test_installed_package_finds_its_scripts(wheel: Path, tmp_path: Path) -> None:
    """pip install of the wheel (not -e) into a fresh venv; look from outside the checkout."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
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
