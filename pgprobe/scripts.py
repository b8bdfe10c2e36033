"""Where the probe scripts are: inside the installed package, or in a checkout."""

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
