"""pgprobe.unwind without tracing: CFI rules, expressions, cut stacks, perf maps, auto."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import need

from pgprobe.symbolize import ElfImage, Frame
from pgprobe.symbolize.perfmap import parse_perf_map
from pgprobe.unwind import choose, truncation
from pgprobe.unwind.cfi import RBP, RSP, eval_expression, rule_at

# One function that keeps a frame pointer and one that does not.
SOURCE = r"""
__attribute__((noinline)) long with_fp(long x) { volatile long a[4] = {x, x, x, x};
    return a[0] + a[3]; }
__attribute__((noinline, optimize("omit-frame-pointer"))) long without_fp(long x) {
    volatile long a[4] = {x, x, x, x}; return with_fp(a[1]) + a[2]; }
int main(int argc, char **argv) { return (int)without_fp(argc); }
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> ElfImage:
    need(shutil.which("gcc") is not None, "gcc is not installed")
    d = tmp_path_factory.mktemp("cfi")
    (d / "prog.c").write_text(SOURCE)
    subprocess.run(["gcc", "-O1", "-fno-omit-frame-pointer", "-o", str(d / "prog"),
                    str(d / "prog.c")], check=True)  # fmt: skip
    with open(d / "prog", "rb") as f:
        return ElfImage(f, str(d / "prog"), str(d))


def _start(image: ElfImage, name: str) -> int:
    return image.starts[image.names.index(name)]


def test_rules_at_entry_and_inside_a_function(image: ElfImage) -> None:
    for name in ("with_fp", "without_fp"):
        entry = rule_at(image.eh_frame, _start(image, name))
        assert entry is not None
        # At the first instruction the return address is the top of the stack.
        assert (entry.cfa_reg, entry.cfa_offset, entry.ra_offset) == (RSP, 8, -8)
    end = image.ends[image.names.index("with_fp")]
    inside = rule_at(image.eh_frame, end - 2)
    assert inside is not None
    assert inside.cfa_reg == RBP and dict(inside.saved)[RBP] == -16  # push %rbp; mov %rsp,%rbp
    end = image.ends[image.names.index("without_fp")]
    inside = rule_at(image.eh_frame, end - 2)
    assert inside is not None and inside.cfa_reg == RSP and inside.cfa_offset > 8
    assert rule_at(image.eh_frame, 0x10) is None  # no FDE there


def test_plt_cfa_expression() -> None:
    # rsp + 8 + ((rip & 15) >= 11) << 3, as in every PLT's FDE
    expr = bytes([0x77, 0x08, 0x80, 0x00, 0x3F, 0x1A, 0x3B, 0x2A, 0x33, 0x24, 0x22])
    assert eval_expression(expr, {RSP: 0x1000, 16: 0x40100C}) == 0x1010
    assert eval_expression(expr, {RSP: 0x1000, 16: 0x401004}) == 0x1008
    assert eval_expression(bytes([0x06]), {RSP: 0x1000}) is None  # memory reads: unsupported


def test_frame_pointer_stacks_are_cut_where_frame_pointers_end() -> None:
    lacks = {"libcrypto.so.3", "postgres-nofp"}.__contains__
    whole = [Frame("hash_bytes", "postgres", True), Frame("main", "postgres", True)]
    assert truncation.cut_fp_stack(whole, lacks) == (whole, None)
    garbage = [
        Frame("md5_block", "libcrypto.so.3", True),
        Frame("EVP_Digest", "libcrypto.so.3", True),
        Frame("[unknown]", "[unknown]", False),
    ]
    kept, reason = truncation.cut_fp_stack(garbage, lacks)
    assert reason == "no frame pointer in libcrypto.so.3"
    assert kept == [garbage[0], truncation.truncated_frame(reason)]
    assert kept[-1].name == "[truncated: no frame pointer in libcrypto.so.3]"
    short = [Frame("foo", "postgres", True), Frame("[jit]", "[jit]", False)]
    kept, reason = truncation.cut_fp_stack(short, lacks)
    assert reason == "frame-pointer walk stopped in [jit]" and kept[:2] == short


def test_perf_map_lines() -> None:
    text = "7f0000001000 40 LazyCompile:foo\nbad\n7f0000002000 zz x\n7f0000003000 8 a b c\n"
    assert parse_perf_map(text) == [(0x7F0000001000, 0x40, "LazyCompile:foo"),
                                    (0x7F0000003000, 8, "a b c")]  # fmt: skip


def test_auto_leaves_the_c_runtime_out(tmp_path: Path) -> None:
    for name in ("libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libpthread.so.0"):
        assert choose.C_RUNTIME.match(name), name
    for name in ("libcrypto.so.3", "libicuuc.so.72.1", "libcom_err.so.2.1"):
        assert not choose.C_RUNTIME.match(name), name
    assert choose.choose("fp", "/nonexistent", 1)[0] == "fp"
    assert choose.choose("dwarf", "/nonexistent", 1)[0] == "dwarf"


def test_a_system_wide_capture_keeps_the_roots_and_what_they_forked() -> None:
    from pgprobe.unwind.perfdata import RECORD_EXIT, RECORD_FORK, _lives

    # postmaster 100 forks 101 (a backend) at t=10 and 102 at 20, which forks 103 at 30;
    # 200 is another cluster's postmaster with its backend 201; 300 forked by 1 (a shell).
    # 101 exits at 40, and at 50 the shell gets pid 101 again: not the cluster's.
    fork, end = RECORD_FORK, RECORD_EXIT
    events = [(10, fork, 101, 100), (20, fork, 102, 100), (30, fork, 103, 102),
              (5, fork, 201, 200), (7, fork, 300, 1), (40, end, 101, 100),
              (50, fork, 101, 1)]  # fmt: skip
    lives = _lives(frozenset({100}), events)
    assert set(lives) == {100, 101, 102, 103}
    assert lives[101] == [(10, 40)] and lives[103] == [(30, 1 << 64)]
    assert lives[100] == [(-1, 1 << 64)]
    assert set(_lives(frozenset({101}), events)) == {101}
    assert set(_lives(frozenset({100, 200}), events)) == {100, 101, 102, 103, 200, 201}
