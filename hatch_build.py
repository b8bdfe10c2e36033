"""The wheel's build hook: bpf/*.bpf.c compiled into the wheel, so an install needs no clang.

A wheel (not an editable install) runs scripts/build-bpf before its files are collected:
bpf/build/*.bpf.o then goes into the wheel with the rest of bpf/ (pyproject.toml's
force-include, bpf -> pgprobe/bpf), and pgprobe finds it at pgprobe/bpf/build/ when
installed (pgprobe/scripts.py). The user's host then needs libbpf.so.1 (libbpf1,
bpftrace's own dependency) and a kernel with BTF, but no clang and no libbpf-dev.

Building the wheel needs clang and libbpf's headers (apt-get install clang libbpf-dev):
the build fails, saying so, when they are missing. PGPROBE_WHEEL_BPF=0 builds the wheel
without compiling: it carries only what bpf/build/ already holds (nothing in a fresh
clone), and pgprobe then runs bpf/waits.bt, costlier per context switch, and says why.

A wheel with an object is tagged for this platform (py3-none-linux_x86_64 here): the
object is compiled for the build host's byte order and architecture (scripts/build-bpf's
-target bpf and -D__TARGET_ARCH_*), though CO-RE makes it fit any kernel of that
architecture with BTF. A wheel without one stays py3-none-any.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SKIP_ENV = "PGPROBE_WHEEL_BPF"  # "0": build the wheel without compiling bpf/*.bpf.c
CLANGS = ("clang-14", "clang")  # scripts/build-bpf's choice, in its order
HINT = (
    "apt-get install clang libbpf-dev, or set PGPROBE_WHEEL_BPF=0 to build a wheel without "
    "it (pgprobe then runs bpf/waits.bt, costlier per context switch)"
)


class CustomBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return  # an editable install runs the checkout's bpf/: scripts/build-bpf there
        root = Path(self.root)
        if os.environ.get(SKIP_ENV, "1") != "0":
            compile_bpf(root)
        objects = sorted((root / "bpf" / "build").glob("*.bpf.o"))
        if objects:
            build_data["pure_python"] = False
            build_data["tag"] = f"py3-none-{platform_tag()}"
            self.app.display_info(
                "pgprobe: the wheel carries " + ", ".join(str(o.relative_to(root)) for o in objects)
            )
        else:
            self.app.display_warning(
                "pgprobe: the wheel carries no compiled BPF object (PGPROBE_WHEEL_BPF=0): "
                "pgprobe waits will run bpf/waits.bt"
            )


def compile_bpf(root: Path) -> None:
    """scripts/build-bpf: bpf/*.bpf.c into bpf/build/*.bpf.o, or a one-line failure."""
    if not any(shutil.which(name) for name in CLANGS):
        raise RuntimeError(
            "pgprobe's wheel carries bpf/waits.bpf.c compiled (bpf/build/waits.bpf.o), and "
            f"clang is not installed to compile it: {HINT}"
        )
    done = subprocess.run(
        ["bash", str(root / "scripts" / "build-bpf")],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        detail = (done.stderr.strip() or done.stdout.strip()).splitlines()[-5:]
        raise RuntimeError(
            "pgprobe's wheel carries bpf/*.bpf.c compiled, and scripts/build-bpf failed "
            f"(libbpf's headers missing?): {HINT}\n" + "\n".join(detail)
        )


def platform_tag() -> str:
    """This host's wheel platform tag: linux_x86_64, linux_aarch64, ..."""
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")
