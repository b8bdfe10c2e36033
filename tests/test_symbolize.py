"""Tests of pgprobe.symbolize on small C programs compiled here.

Long because it holds every symbolizer test, grouped by section below.

The program prints the run-time addresses of its functions (global, static,
and one in a shared library) and of an anonymous executable mapping and a
heap block, then blocks. `nm` on the unstripped build gives each function's
ELF address and size, so the tests know what every address must be named.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from conftest import need  # noqa: E402

from pgprobe.stacks import parse_bpftrace_stack, split_bpftrace_key  # noqa: E402
from pgprobe.symbolize import (  # noqa: E402
    Frame,
    KernelSymbols,
    Symbolizer,
    folded_names,
    parse_maps,
)

REPO = Path(__file__).resolve().parent.parent

LIB_C = r"""
int lib_func(int x) { volatile int y = x; return y * 5 + 2; }
"""

# exported_before is global (in .dynsym thanks to -rdynamic, like postgres'
# -Wl,-E); hidden_after is static and sits right after it, so a symbolizer
# that only looks for "the nearest symbol below" names it exported_before.
PROG_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

extern int lib_func(int);
volatile unsigned long sink;

int exported_before(int x) { volatile int y = x; return y * 3 + 1; }

static int __attribute__((noinline)) hidden_after(int x)
{
    volatile int y = x;
    return y * 7 + exported_before(y);
}

static void __attribute__((noinline)) spin_leaf(void)
{
    for (;;)
        sink++;
}

static void __attribute__((noinline)) spin_middle(int depth)
{
    if (depth > 0)
        spin_middle(depth - 1);
    else
        spin_leaf();
    sink += depth;  /* not a tail call */
}

int main(int argc, char **argv)
{
    void *anon = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *heap = malloc(64);
    printf("exported_before %p\n", (void *) exported_before);
    printf("hidden_after %p\n", (void *) hidden_after);
    printf("lib_func %p\n", (void *) lib_func);
    printf("anon %p\n", anon);
    printf("heap %p\n", heap);
    printf("ready\n");
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "spin") == 0)
        spin_middle(5);
    for (;;)
        pause();
    return hidden_after(argc);
}
"""


@dataclass
class Build:
    dir: Path
    prog: Path  # unstripped
    lib: Path
    nm: dict[str, tuple[int, int]]  # name -> (ELF address, size) from the unstripped build
    lib_nm: dict[str, tuple[int, int]]


def _run(*cmd: str | Path) -> str:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True).stdout


def _nm(path: Path) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for line in _run("nm", "-S", "--defined-only", path).splitlines():
        parts = line.split()
        if len(parts) == 4:
            out[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return out


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    need(shutil.which("gcc") is not None, "gcc is not installed")
    need(shutil.which("objcopy") is not None, "binutils are not installed")
    d = tmp_path_factory.mktemp("symbuild")
    (d / "lib.c").write_text(LIB_C)
    (d / "prog.c").write_text(PROG_C)
    flags = ["-O0", "-fno-omit-frame-pointer", "-fno-inline", "-Wl,--build-id"]
    _run("gcc", *flags, "-fPIC", "-shared", "-o", d / "libsymtest.so", d / "lib.c")
    _run(
        "gcc", *flags, "-rdynamic", "-o", d / "prog", d / "prog.c",
        f"-L{d}", "-lsymtest", f"-Wl,-rpath,{d}",
    )  # fmt: skip
    return Build(d, d / "prog", d / "libsymtest.so", _nm(d / "prog"), _nm(d / "libsymtest.so"))


class Running:
    """A started copy of the program, with the addresses it printed."""

    def __init__(self, exe: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [str(exe), *args], stdout=subprocess.PIPE, text=True, cwd=exe.parent
        )
        self.addr: dict[str, int] = {}
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "ready":
                break
            name, value = line.split()
            self.addr[name] = int(value, 16)
        self.pid = self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


Start = Callable[..., Running]


@pytest.fixture
def start() -> Iterator[Start]:
    started: list[Running] = []

    def _start(exe: Path, *args: str) -> Running:
        r = Running(exe, *args)
        started.append(r)
        return r

    yield _start
    for r in started:
        r.stop()


def variant(build: Build, name: str) -> Path:
    """A copy of the unstripped program under another name, in its own directory."""
    d = build.dir / name
    d.mkdir(exist_ok=True)
    exe = d / "prog"
    shutil.copy2(build.prog, exe)
    return exe


def strip_all(exe: Path) -> None:
    _run("strip", "--strip-all", "--remove-section=.gnu_debuglink", exe)
    assert ".symtab" not in _run("readelf", "-S", exe)


def build_id(path: Path) -> str:
    for line in _run("readelf", "-n", path).splitlines():
        if "Build ID:" in line:
            return line.split()[-1]
    raise AssertionError("no build-id")


def addr_in(build: Build, r: Running, name: str, delta: int) -> int:
    """A run-time address `delta` bytes into function `name` of the program."""
    assert delta < build.nm[name][1]
    return r.addr[name] + delta


def module_offset(build: Build, name: str) -> int:
    return build.nm[name][0]


# --------------------------------------------------------------------------


def test_parse_maps() -> None:
    text = (
        "5607a7eb5000-5607a83df000 r-xp 000cd000 fe:00 318945      /usr/bin/x\n"
        "7f00-8f00 r-xp 00001000 fe:00 42   /tmp/a b.so (deleted)\n"
        "7ffe0000-7ffe1000 r-xp 00000000 00:00 0                  [vdso]\n"
        "7ffd0000-7ffd1000 rw-p 00000000 00:00 0                  [stack]\n"
        "10000-20000 rwxp 00000000 00:00 0 \n"
    )
    maps = parse_maps(text)
    assert [m.kind for m in maps] == ["file", "file", "[vdso]", "[stack]", "[anon]"]
    assert maps[0].offset == 0xCD000 and maps[0].module == "x" and not maps[0].deleted
    assert maps[1].path == "/tmp/a b.so" and maps[1].deleted and maps[1].inode == 42


def test_unstripped_names_static_functions(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False, debug_root=str(build.dir / "nodebug"))
    assert sym.snapshot(r.pid)
    frames = sym.user_frames(
        r.pid,
        [
            addr_in(build, r, "hidden_after", 5),
            addr_in(build, r, "exported_before", 3),
            r.addr["hidden_after"],
        ],
    )
    assert frames[0] == Frame("hidden_after", "prog", True, 5)
    assert frames[0].label == "hidden_after+0x5" and frames[0].folded == "hidden_after"
    assert frames[1] == Frame("exported_before", "prog", True, 3)
    assert frames[2].label == "hidden_after"
    st = sym.stats
    assert st.modules["prog"].resolved == 3 and st.modules["prog"].unresolved == 0
    assert st.modules["prog"].symbols == "symtab"
    assert st.warnings() == []


def test_stripped_static_function_is_not_mislabelled(build: Build, start: Start) -> None:
    exe = variant(build, "stripped")
    strip_all(exe)
    r = start(exe)
    sym = Symbolizer(kallsyms=False, debug_root=str(build.dir / "nodebug"))
    assert sym.snapshot(r.pid)
    inside = addr_in(build, r, "hidden_after", 9)
    frames = sym.user_frames(r.pid, [inside, addr_in(build, r, "exported_before", 2)], weight=3)
    # The static function: module + its start (from .eh_frame), never "exported_before".
    start_off = module_offset(build, "hidden_after")
    assert frames[0] == Frame(f"prog+0x{start_off:x}", "prog", False, 9)
    assert frames[0].label == f"prog+0x{start_off:x}+0x9"
    # The exported one is still in .dynsym.
    assert frames[1] == Frame("exported_before", "prog", True, 2)
    st = sym.stats.modules["prog"]
    assert (st.resolved, st.unresolved, st.symbols) == (3, 3, "dynsym")
    warnings = sym.stats.warnings()
    assert len(warnings) == 1 and warnings[0].startswith("50 % of frames unresolved in prog")
    assert "install its debug symbols" in warnings[0] and build_id(exe) in warnings[0]


@pytest.mark.parametrize(
    "where", ["same-dir", "dot-debug", "debug-root", "build-id", "debuginfod-cache"]
)
def test_stripped_with_debug_file(
    build: Build, start: Start, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    exe = variant(build, f"debug-{where}")
    root = build.dir / f"root-{where}"
    root.mkdir(exist_ok=True)
    debug = exe.parent / "prog.debug"
    _run("objcopy", "--only-keep-debug", exe, debug)
    strip_all(exe)
    if where == "build-id":
        bid = build_id(exe)
        target = root / ".build-id" / bid[:2] / f"{bid[2:]}.debug"
        target.parent.mkdir(parents=True)
        debug.rename(target)
    elif where == "debuginfod-cache":  # what `debuginfod-find debuginfo BUILD-ID` leaves
        target = root / "cache" / build_id(exe) / "debuginfo"
        target.parent.mkdir(parents=True)
        debug.rename(target)
        monkeypatch.setenv("DEBUGINFOD_CACHE_PATH", str(root / "cache"))
    else:
        _run("objcopy", f"--add-gnu-debuglink={debug}", exe)
        if where == "dot-debug":
            (exe.parent / ".debug").mkdir()
            debug.rename(exe.parent / ".debug" / "prog.debug")
        elif where == "debug-root":
            target = root / str(exe.parent).lstrip("/") / "prog.debug"
            target.parent.mkdir(parents=True)
            debug.rename(target)
    r = start(exe)
    sym = Symbolizer(kallsyms=False, debug_root=str(root))
    assert sym.snapshot(r.pid)
    frames = sym.user_frames(r.pid, [addr_in(build, r, "hidden_after", 4)])
    assert frames == [Frame("hidden_after", "prog", True, 4)]
    assert sym.stats.modules["prog"].symbols.startswith("debug file ")


def test_debuglink_with_wrong_crc_is_ignored(build: Build, start: Start) -> None:
    exe = variant(build, "badcrc")
    debug = exe.parent / "prog.debug"
    _run("objcopy", "--only-keep-debug", exe, debug)
    strip_all(exe)
    _run("objcopy", f"--add-gnu-debuglink={debug}", exe)
    with open(debug, "ab") as f:
        f.write(b"changed after linking")
    r = start(exe)
    sym = Symbolizer(kallsyms=False, debug_root=str(build.dir / "nodebug"))
    assert sym.snapshot(r.pid)
    [frame] = sym.user_frames(r.pid, [addr_in(build, r, "hidden_after", 4)])
    assert not frame.resolved


def test_shared_library_function(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False)
    assert sym.snapshot(r.pid)
    assert build.lib_nm["lib_func"][1] > 6
    [frame] = sym.user_frames(r.pid, [r.addr["lib_func"] + 6])
    assert frame == Frame("lib_func", "libsymtest.so", True, 6)


def test_libc_has_a_name(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False)
    assert sym.snapshot(r.pid)
    libc = next(m for m in sym._maps[r.pid].mappings if m.module.startswith("libc.so"))
    # Any address in libc's text gets a function name or a module+offset label, and
    # frames are cached per address: the same Frame object comes back.
    text = next(m for m in sym._maps[r.pid].mappings if m.path == libc.path and "x" in m.perms)
    a = text.start + 0x100
    f1 = sym.user_frames(r.pid, [a])[0]
    f2 = sym.user_frames(r.pid, [a])[0]
    assert f1 is f2 and f1.module == libc.module


def test_exited_pid_is_still_symbolized(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False)
    assert sym.snapshot(r.pid)
    addrs = [addr_in(build, r, "hidden_after", 1), r.addr["lib_func"] + 1]
    r.stop()
    assert not Path(f"/proc/{r.pid}").exists()
    assert folded_names(sym.user_frames(r.pid, addrs)) == ["hidden_after", "lib_func"]


def test_deleted_binary(build: Build, start: Start) -> None:
    exe = variant(build, "deleted")
    r = start(exe)
    exe.unlink()
    sym = Symbolizer(kallsyms=False)
    assert sym.snapshot(r.pid)
    m = next(m for m in sym._maps[r.pid].mappings if m.module == "prog")
    assert m.deleted
    addr = addr_in(build, r, "hidden_after", 2)
    r.stop()  # its file is gone and so is /proc/PID/map_files: read at snapshot time
    assert sym.user_frames(r.pid, [addr]) == [Frame("hidden_after", "prog", True, 2)]


def test_fallback_for_pids_without_snapshot(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False, lazy_snapshots=False)
    assert sym.set_fallback(r.pid)
    other = 2**22 + 12345  # above pid_max's default: never a live pid
    frames = sym.user_frames(other, [addr_in(build, r, "hidden_after", 1)])
    assert frames == [Frame("hidden_after", "prog", True, 1)]
    assert sym.stats.fallback_pids == {other}


def test_lazy_snapshot_of_a_live_pid(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False)
    assert sym.user_frames(r.pid, [addr_in(build, r, "hidden_after", 1)])[0].resolved
    assert sym.stats.fallback_pids == set()


def test_unreadable_pid_and_unmapped_addresses(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False)
    gone = 2**22 + 54321
    assert not sym.snapshot(gone)
    [f] = sym.user_frames(gone, [0x401000])
    assert f == Frame("[unknown]", "[unknown]", False)
    st = sym.stats
    assert gone in st.unreadable_pids and gone in st.unknown_pids
    assert st.modules["[unknown]"].unresolved == 1

    assert sym.snapshot(r.pid)
    anon, heap = r.addr["anon"], r.addr["heap"]
    frames = sym.user_frames(r.pid, [anon + 0x10, heap, 8])
    # Executable anonymous memory is generated code: [jit], or its name in /tmp/perf-PID.map.
    assert frames[0] == Frame("[jit]", "[jit]", False, 0x10)
    assert frames[0].label == "[jit]+0x10"
    assert frames[1].name == "[heap]"
    assert frames[2] == Frame("[unknown]", "[unknown]", False)
    perf_map = Path(f"/tmp/perf-{r.pid}.map")
    perf_map.write_text(f"{anon:x} 40 jitted_fn\nnot a line\n")
    try:
        named = Symbolizer(kallsyms=False)
        assert named.snapshot(r.pid)
        assert named.user_frames(r.pid, [anon + 0x10])[0] == Frame(
            "jitted_fn", f"perf-{r.pid}.map", True, 0x10
        )
    finally:
        perf_map.unlink()


def test_vdso(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False)
    assert sym.snapshot(r.pid)
    vdso = next(m for m in sym._maps[r.pid].mappings if m.path == "[vdso]")
    img = sym._vdso_image()
    # x86-64's vDSO exports its functions (__vdso_clock_gettime ...): none read is a fault
    assert img is not None and img.starts, "no symbol read from this process's [vdso]"
    name, start_addr = img.names[0], img.starts[0]
    [f] = sym.user_frames(r.pid, [vdso.start + start_addr + 1])
    assert f == Frame(name, "[vdso]", True, 1)


def test_resnapshot_keeps_old_mappings_and_counts(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False)
    assert sym.snapshot(r.pid)
    a = addr_in(build, r, "hidden_after", 1)
    sym.user_frames(r.pid, [a], weight=2)
    assert sym.snapshot(r.pid)
    sym.user_frames(r.pid, [a], weight=3)
    assert sym.stats.modules["prog"].resolved == 5


def test_kernel_frames_from_kallsyms() -> None:
    need(os.geteuid() == 0, "needs root to read kernel addresses from /proc/kallsyms")
    ks = KernelSymbols()
    need(ks.available, "/proc/kallsyms shows no addresses to root (kptr_restrict=2)")
    # A text symbol followed by another one well after it.
    target = None
    with open("/proc/kallsyms") as f:
        for line in f:
            a, t, name = line.split()[:3]
            if t in "tT" and name in ("do_syscall_64", "schedule", "vfs_read"):
                target = (int(a, 16), name)
                break
    assert target is not None
    sym = Symbolizer()
    frames = sym.kernel_frames([target[0] + 3, target[0]], weight=2)
    assert frames[0] == Frame(f"{target[1]}_[k]", "[kernel.kallsyms]", True, 3)
    assert frames[1].label == f"{target[1]}_[k]"
    assert sym.stats.modules["[kernel.kallsyms]"].resolved == 4
    assert sym.kernel_frames([1])[0] == Frame("[unknown]_[k]", "[kernel.kallsyms]", False)


def test_many_stacks_are_fast(build: Build, start: Start) -> None:
    r = start(build.prog)
    sym = Symbolizer(kallsyms=False)
    assert sym.snapshot(r.pid)
    base = r.addr["hidden_after"]
    # 100,000 stacks of depth 30 over a few thousand distinct addresses, 2/3 of them
    # in the program's text (named or not) and 1/3 in libc.
    text = next(m for m in sym._maps[r.pid].mappings if m.module.startswith("libc"))
    pool = [base + (i % 40) for i in range(2000)] + [text.start + 64 * i for i in range(1000)]
    stacks = [tuple(pool[(i * 7 + j * 13) % len(pool)] for j in range(30)) for i in range(100_000)]
    t0 = time.perf_counter()
    for s in stacks:
        sym.user_frames(r.pid, s)
    elapsed = time.perf_counter() - t0
    assert elapsed < 10, f"{elapsed:.1f} s for 100,000 stacks"
    assert sum(m.total for m in sym.stats.modules.values()) == 3_000_000


@pytest.mark.integration
def test_bpftrace_profile_end_to_end(build: Build, start: Start, tracing: None) -> None:
    """bpf/profile.bt samples a spinning program; its stacks name the static functions.

    The program is installed as "postgres" so that profile.bt's default filter
    (comm == "postgres") takes it.
    """
    d = build.dir / "e2e"
    d.mkdir(exist_ok=True)
    exe = d / "postgres"
    shutil.copy2(build.prog, exe)
    r = start(exe, "spin")
    time.sleep(0.2)
    env = dict(os.environ, BPFTRACE_NO_USER_SYMBOLS="1")
    sym = Symbolizer(kallsyms=False)
    assert sym.snapshot(r.pid)
    bt = subprocess.Popen(
        ["bpftrace", "-f", "json", str(REPO / "bpf" / "profile.bt"), "99", "0", str(r.pid)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert bt.stdout is not None
        first = bt.stdout.readline()  # {"type": "attached_probes", ...}
        assert "attached_probes" in first, first
        time.sleep(3)
        bt.send_signal(2)
        out, err = bt.communicate(timeout=60)
    finally:
        if bt.poll() is None:
            bt.kill()
            bt.wait()
    r.stop()
    stacks: dict[str, int] = {}
    total = 0
    for line in out.splitlines():
        if not line.strip():
            continue
        doc = json.loads(line)
        if doc["type"] == "map" and "@stacks" in doc["data"]:
            for key, n in doc["data"]["@stacks"].items():
                pid_text, stack_text = split_bpftrace_key(key, ["int", "stack"])
                assert int(pid_text) == r.pid
                names = folded_names(sym.user_frames(r.pid, parse_bpftrace_stack(stack_text)))
                stacks[";".join(reversed(names))] = n
                total += n
        if doc["type"] == "map" and "@samples" in doc["data"]:
            assert doc["data"]["@samples"] >= total
    # 3 s at 99 Hz is about 300 samples on an idle machine; on a busy one the
    # spinning program gets less of a CPU.
    assert total > 30, (out, err)
    top = max(stacks, key=lambda s: stacks[s])
    assert top.endswith("main;spin_middle;spin_middle;spin_middle;spin_middle;spin_middle;"
                        "spin_middle;spin_leaf"), top  # fmt: skip
