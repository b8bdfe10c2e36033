"""Tests of pgprobe.stacks: bpftrace stack keys and FlameGraph folded stacks."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pgprobe.stacks import (
    fold,
    format_folded,
    parse_bpftrace_stack,
    parse_folded,
    parse_folded_line,
    read_folded,
    split_bpftrace_key,
    unfold,
    write_folded,
)
from pgprobe.symbolize import Frame, folded_names

# Real keys from bpftrace 0.17 -f json, BPFTRACE_NO_USER_SYMBOLS=1 (bpf/profile.bt).
USTACK_KEY = "6172,\n    0x5607a83af777\n    0x5607a83b5781\n    0x5607a83c46b3\n"
KSTACK_KEY = (
    "6709,\n\tffffffff81b6d5ed copy_folio_from_iter_atomic+205\n"
    "\tffffffff821ecc51 do_syscall_64+113\n"
    "\tffffffff81000130 entry_SYSCALL_64_after_hwframe+118\n"
    ",\n    0x7f7549116483\n    0x5607a822b354\n"
)
EMPTY_KSTACK_KEY = "5997,,\n    0x5607a830681f\n    0x5607a8306f36\n"


def test_parse_default_mode_stack() -> None:
    assert parse_bpftrace_stack("\n    0x5607a8274906\n    0x5607a80ec8bc\n") == (
        0x5607A8274906,
        0x5607A80EC8BC,
    )
    assert parse_bpftrace_stack("") == ()


def test_parse_perf_mode_stacks() -> None:
    kernel = "\n\tffffffff8158e846 filemap_get_pages+166\n\tffffffff821ecc51 do_syscall_64+113\n"
    assert parse_bpftrace_stack(kernel) == (0xFFFFFFFF8158E846, 0xFFFFFFFF821ECC51)
    user = "\n\t5607a80fd88f 0x5607a80fd88f ([unknown])\n\t7f75491163d3 __libc_pread64+19 (/x)\n"
    assert parse_bpftrace_stack(user) == (0x5607A80FD88F, 0x7F75491163D3)


def test_parse_symbolized_stack_is_refused() -> None:
    with pytest.raises(ValueError, match="without an address"):
        parse_bpftrace_stack("\n        filemap_get_pages+166\n")


def test_split_pid_and_ustack() -> None:
    pid, stack = split_bpftrace_key(USTACK_KEY, ["int", "stack"])
    assert pid == "6172"
    assert parse_bpftrace_stack(stack) == (0x5607A83AF777, 0x5607A83B5781, 0x5607A83C46B3)


def test_split_pid_kstack_ustack() -> None:
    pid, kstack, ustack = split_bpftrace_key(KSTACK_KEY, ["int", "stack", "stack"])
    assert pid == "6709"
    assert parse_bpftrace_stack(kstack)[0] == 0xFFFFFFFF81B6D5ED
    assert len(parse_bpftrace_stack(kstack)) == 3
    assert parse_bpftrace_stack(ustack) == (0x7F7549116483, 0x5607A822B354)


def test_split_empty_kstack() -> None:
    pid, kstack, ustack = split_bpftrace_key(EMPTY_KSTACK_KEY, ["int", "stack", "stack"])
    assert (pid, kstack) == ("5997", "")
    assert parse_bpftrace_stack(ustack) == (0x5607A830681F, 0x5607A8306F36)


def test_split_stack_then_strings_and_single_field() -> None:
    key = "\n    0x1\n    0x2\n,WALWrite,a,b"
    assert split_bpftrace_key(key, ["stack", "str", "str"]) == [
        "\n    0x1\n    0x2\n",
        "WALWrite",
        "a,b",
    ]
    assert split_bpftrace_key("\n    0x1\n", ["stack"]) == ["\n    0x1\n"]
    with pytest.raises(ValueError):
        split_bpftrace_key("12", ["int", "stack"])
    with pytest.raises(ValueError):
        split_bpftrace_key("12,\n    0x1\n,13", ["int", "stack"])


def test_fold_and_unfold() -> None:
    inner_first = ["leaf", "middle", "main"]
    assert fold(inner_first) == "main;middle;leaf"
    assert unfold("main;middle;leaf") == inner_first
    assert fold(["a;b", "x\ny"]) == "x y;a:b"
    assert fold([]) == "[unknown]"
    assert fold([], empty="[no stack]") == "[no stack]"
    kernel = ["schedule_[k]", "do_syscall_64_[k]"]
    assert fold(kernel + ["__libc_recv", "main"]) == (
        "main;__libc_recv;do_syscall_64_[k];schedule_[k]"
    )


def test_fold_symbolized_frames() -> None:
    frames = [
        Frame("do_syscall_64_[k]", "[kernel.kallsyms]", True, 0x71),
        Frame("__libc_pwrite", "libc.so.6", True, 0x13),
        Frame("postgres+0x443300", "postgres", False, 0x54),
        Frame("BufFileWrite", "postgres", True, 0xAD),
    ]
    assert fold(folded_names(frames)) == (
        "BufFileWrite;postgres+0x443300;__libc_pwrite;do_syscall_64_[k]"
    )
    assert fold(folded_names(frames, main="postgres")) == (
        "BufFileWrite;postgres+0x443300;libc.so.6`__libc_pwrite;do_syscall_64_[k]"
    )


def test_folded_lines() -> None:
    assert parse_folded_line("a;b;c 12\n") == ("a;b;c", 12)
    assert parse_folded_line("operator new;x 3") == ("operator new;x", 3)
    for bad in ("a;b;c", "a;b;c x", " 5"):
        with pytest.raises(ValueError):
            parse_folded_line(bad)
    text = "# comment\na;b 3\n\na;c 1\na;b 2\n"
    assert parse_folded(io.StringIO(text)) == {"a;b": 5, "a;c": 1}
    with pytest.raises(ValueError, match="line 2"):
        parse_folded(["a 1", "broken"])


def test_folded_files_round_trip(tmp_path: Path) -> None:
    stacks = {"main;b": 2, "main;a": 2, "main;c;d": 7}
    assert format_folded(stacks) == ["main;c;d 7", "main;a 2", "main;b 2"]
    path = tmp_path / "out.folded"
    write_folded(path, stacks)
    assert path.read_text() == "main;c;d 7\nmain;a 2\nmain;b 2\n"
    assert read_folded(path) == stacks
    buf = io.StringIO()
    write_folded(buf, stacks)
    assert buf.getvalue() == path.read_text()
