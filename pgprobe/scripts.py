"""Where the probe scripts are: inside the installed package, or in a checkout.

A wheel carries bpf/ and d/ inside the package (pgprobe/bpf, pgprobe/d: pyproject.toml's
force-include), bpf/build/*.bpf.o included, compiled when the wheel was built
(hatch_build.py); a checkout has them beside the package, bpf/build/ made by
scripts/build-bpf."""

from __future__ import annotations

from pathlib import Path

from pgprobe.errors import PgprobeError

_PACKAGE = Path(__file__).resolve().parent


def script_path(engine_dir: str, name: str) -> Path:
    """bpf/<name> or d/<name>: the wheel's copy first, then the checkout's."""
    for base in (_PACKAGE / engine_dir, _PACKAGE.parent / engine_dir):
        candidate = base / name
        if candidate.is_file():
            return candidate
    raise PgprobeError(f"probe script {engine_dir}/{name} is missing from this installation")


def installed() -> bool:
    """Whether pgprobe runs from an installed wheel (its own bpf/ inside the package), not
    from a checkout (bpf/ beside the package; an editable install too)."""
    return (_PACKAGE / "bpf").is_dir() or not (_PACKAGE.parent / "bpf").is_dir()
