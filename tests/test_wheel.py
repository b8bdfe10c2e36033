"""Install without a compiler: a wheel built from a fresh clone carries bpf/waits.bpf.c
compiled (hatch_build.py runs scripts/build-bpf), and, installed into a new venv on a host
with no clang and no libbpf-dev, `pgprobe waits` runs that object.

The fresh clone: the checkout's own files as git sees them (`git ls-files -co
--exclude-standard`: committed, changed and new, never what .gitignore hides, so no
bpf/build/), copied to a temporary directory; in CI, itself a fresh clone, that is the
clone. The wheel is built there with this environment's hatchling (no build isolation: no
network in tests), which needs clang and libbpf-dev (scripts/setup installs them).

No clang: the install runs in a mount namespace of its own (unshare --mount), where every
clang and llc binary on PATH (their real files, behind /usr/bin's symlinks) has /dev/null
mounted over it, and libbpf's headers (/usr/include/bpf) an empty tmpfs: not runnable and
not found on PATH, by any name or path, while bpftrace (linked against libclang, not the
compiler) still runs. A PATH without them would only hide the names.

The new venv gets the wheel with --no-deps; its dependencies (psycopg, rich, ...) come from
this test's environment through a .pth file naming its site-packages, after the venv's
own (so pgprobe is the wheel's: the test checks where it was imported from).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import CHECKOUT, need

from pgprobe.sandbox import PgCluster

OBJECT = "pgprobe/bpf/build/waits.bpf.o"
CLANG_NAMES = ("clang", "llc", *(f"{n}-{v}" for n in ("clang", "llc") for v in range(11, 21)))


def _copy_of_checkout(dest: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"],
        cwd=CHECKOUT,
        capture_output=True,
        timeout=60,
    )
    need(listed.returncode == 0, f"the checkout is not a git clone: {listed.stderr!r}")
    src = dest / "pgprobe-clone"
    for name in filter(None, listed.stdout.decode().split("\0")):
        path = CHECKOUT / name
        if path.is_file():  # a file deleted in the working tree is listed, and not copied
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
    return src


@pytest.fixture(scope="module")
def fresh_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    need(shutil.which("git") is not None, "git is not installed")
    need(
        any(shutil.which(n) for n in ("clang-14", "clang")),
        "clang is not installed: the wheel's build compiles bpf/*.bpf.c (scripts/setup)",
    )
    src = _copy_of_checkout(tmp_path_factory.mktemp("clone"))
    assert not (src / "bpf" / "build").exists(), "a fresh clone has no bpf/build/"
    out = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k != "PGPROBE_WHEEL_BPF"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("pgprobe-*.whl")
    return built


def test_wheel_carries_the_compiled_objects(fresh_wheel: Path) -> None:
    """The object, as an eBPF ELF file, and a tag for this platform (the object is built
    for its byte order and architecture)."""
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert fresh_wheel.name.endswith(f"-py3-none-{platform}.whl"), fresh_wheel.name
    with zipfile.ZipFile(fresh_wheel) as whl:
        objs = [whl.read(OBJECT.replace("waits", name))
                for name in ("waits", "profile", "clog_reads", "lwlock_wait")]  # fmt: skip
        wheel_meta = whl.read("pgprobe-0.1.0.dist-info/WHEEL").decode()
        assert "pgprobe/bpf/waits.bt" in whl.namelist()  # the fallbacks, still there
        assert "pgprobe/bpf/profile.bt" in whl.namelist()
    for obj in objs:
        assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[18:20], sys.byteorder) == 247  # EM_BPF
    assert "Root-Is-Purelib: false" in wheel_meta and f"Tag: py3-none-{platform}" in wheel_meta


@pytest.fixture(scope="module")
def wheel_venv(fresh_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
         str(fresh_wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    site = subprocess.run(
        [str(venv / "bin" / "python"), "-c", purelib],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    # The dependencies: this environment's site-packages, after the venv's own. Its lines
    # are added as they are: the .pth files there (this checkout's editable install) are not
    # read, so the checkout's pgprobe stays out of the path.
    (Path(site) / "pgprobe_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def _hidden_compiler() -> str:
    """A shell prologue, run in a new mount namespace: clang, llc and libbpf's headers gone."""
    files = sorted({os.path.realpath(p) for n in CLANG_NAMES if (p := shutil.which(n))})
    lines = ["set -e"]
    lines += [f"mount --bind /dev/null '{f}'" for f in files]
    if Path("/usr/include/bpf").is_dir():
        lines.append("mount -t tmpfs -o size=1m,mode=0755 none /usr/include/bpf")
    for name in CLANG_NAMES:  # no compiler left by any name: say so, and stop
        lines.append(f"if command -v {name} >/dev/null; then echo 'still: {name}' >&2; exit 97; fi")
    for f in files:
        lines.append(f"if '{f}' --version >/dev/null 2>&1; then echo 'runs: {f}' >&2; exit 97; fi")
    lines.append("if [ -e /usr/include/bpf/bpf_helpers.h ]; then exit 97; fi")
    return "\n".join(lines) + "\n"


@pytest.mark.integration
@pytest.mark.usefixtures("tracing")
def test_installed_wheel_runs_waits_compiled_without_clang(
    wheel_venv: Path, cluster: PgCluster, tmp_path: Path
) -> None:
    need(shutil.which("unshare") is not None, "unshare (util-linux) is not installed")
    python = wheel_venv / "bin" / "python"
    where = (
        "import pgprobe; from pgprobe.tools.waits import compiled; "
        "print(pgprobe.__file__); print(compiled.object_path())"
    )
    script = _hidden_compiler() + (
        f"'{python}' -c \"$1\"\n"
        f"exec '{wheel_venv / 'bin' / 'pgprobe'}' waits -d 1 --json "
        + " ".join(f"'{a}'" for a in cluster.conn_args)
        + "\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{wheel_venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", where],
        capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode != 97, done.stderr  # a compiler still there: not the test asked
    assert done.returncode == 0, done.stderr
    package, obj, *rest = done.stdout.splitlines()
    site = str(wheel_venv.resolve())
    assert package.startswith(site), package  # the wheel's pgprobe, not the checkout's
    assert obj.startswith(site) and obj.endswith(OBJECT), obj  # the wheel's object
    doc = json.loads("\n".join(rest))
    meta = doc["meta"]
    assert meta["engine"] == "libbpf", (meta, done.stderr)
    assert not any("waits.bt" in w or "waits.bpf.o" in w for w in meta["warnings"]), meta
    assert "waits.bt" not in done.stderr, done.stderr
    assert doc["rows"], doc
