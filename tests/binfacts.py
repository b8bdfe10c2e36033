"""What a PostgreSQL server binary and this kernel offer, read by binutils and the kernel
itself: the truth that `pgprobe doctor`, pgprobe/pgbuilds.py and docs/support.md's "USDT
probes", "Stripped" and "Frame pointers" columns are checked against. None of pgprobe's
code runs here (pgbuilds reads ELF with pgprobe's own reader; this asks readelf, nm and
objdump).

- USDT probes: `readelf -n` lists stapsdt notes (one per probe site);
- stripped: `readelf -S` lists no .symtab section;
- frame pointers: the prologues of five functions every server exports (nm -D finds them,
  objdump disassembles their first bytes) save %rbp and set it from %rsp, in three of five
  at least (gcc's -fno-omit-frame-pointer does it in all of them; without it, none of these
  five does: each build of the matrix was read by hand);
- kprobes: the kernel's kprobe PMU (/sys/bus/event_source/devices/kprobe), or its
  CONFIG_KPROBES in /proc/config.gz where the kernel exposes its config.
"""

from __future__ import annotations

import functools
import gzip
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Exported by every server 14-18, and large enough to have a prologue of their own.
PROLOGUE_FUNCTIONS = ("PostgresMain", "LWLockAcquire", "heap_getnext", "ProcSleep", "palloc")


@dataclass(frozen=True)
class BinaryFacts:
    usdt: bool
    stripped: bool
    frame_pointers: bool


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def _saves_frame_pointer(binary: str, address: int) -> bool:
    """push %rbp, then mov %rsp,%rbp, among the function's first instructions."""
    text = _run("objdump", "-d", "--no-show-raw-insn", f"--start-address={address:#x}",
                f"--stop-address={address + 16:#x}", binary)  # fmt: skip
    insns = [ln.split("\t", 1)[1].split() for ln in text.splitlines()
             if re.match(r"^\s+[0-9a-f]+:\t", ln)]  # fmt: skip
    ops = [" ".join(i) for i in insns[:4]]
    return "push %rbp" in ops and "mov %rsp,%rbp" in ops[ops.index("push %rbp") :]


@functools.cache
def binary_facts(binary: str) -> BinaryFacts:
    notes = _run("readelf", "-n", "-W", binary)
    sections = _run("readelf", "-S", "-W", binary)
    exported = {}
    for line in _run("nm", "-D", "--defined-only", binary).splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[2] in PROLOGUE_FUNCTIONS:
            exported[fields[2]] = int(fields[0], 16)
    assert set(exported) == set(PROLOGUE_FUNCTIONS), (binary, exported)
    saving = sum(_saves_frame_pointer(binary, a) for a in exported.values())
    return BinaryFacts(
        usdt="stapsdt" in notes,
        stripped=re.search(r"\]\s+\.symtab\s", sections) is None,
        frame_pointers=saving >= 3,
    )


def kernel_has_kprobes() -> bool:
    config = Path("/proc/config.gz")
    if config.exists():
        text = gzip.decompress(config.read_bytes()).decode()
        return re.search(r"^CONFIG_KPROBES=y$", text, re.M) is not None
    return Path("/sys/bus/event_source/devices/kprobe").exists()
