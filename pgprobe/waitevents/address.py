"""Where a PostgreSQL process keeps its wait_event_info: the address bpf/waits.bt reads.

Since PostgreSQL 14 the global ``uint32 *my_wait_event_info`` points at the
process's current wait_event_info (MyProc->wait_event_info once the process
has a PGPROC). It is exported in ``.dynsym`` (backends link with
--export-dynamic), so stripped builds have it too. Its run-time address is the
symbol's value plus the load base of the server binary, read from the
postmaster's /proc/PID/maps; backends fork from the postmaster, so the address
is the same in every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from pgprobe.errors import EXIT_ENV, PgprobeError
from pgprobe.symbolize.dynsym import defined_symbol

SYMBOL = "my_wait_event_info"
MIN_MAJOR = 14  # the symbol exists from 14 on
PAGE = 4096


@dataclass(frozen=True)
class WaitEventAddress:
    """The address of my_wait_event_info in the postmaster (and every backend)."""

    address: int
    symbol_value: int  # st_value in the binary
    load_base: int  # where the binary's first page is mapped (0 for a non-PIE binary)
    binary: str


def symbol_value(binary: str, name: str = SYMBOL) -> int | None:
    """st_value of a defined object symbol in .dynsym (else .symtab), None when absent."""
    try:
        value = defined_symbol(binary, name, (".dynsym", ".symtab"))
    except (OSError, ELFError) as exc:
        raise PgprobeError(f"cannot read the server binary {binary}: {exc}", EXIT_ENV) from None
    return value or None


def first_load_vaddr(binary: str) -> tuple[bool, int]:
    """(is a PIE/shared object, p_vaddr of the PT_LOAD at file offset 0, page aligned)."""
    with open(binary, "rb") as stream:
        elf = ELFFile(stream)
        pie = elf["e_type"] == "ET_DYN"
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD" and seg["p_offset"] == 0:
                return pie, int(seg["p_vaddr"]) & ~(PAGE - 1)
    return pie, 0


def load_base(pid: int, binary: str, proc: Path = Path("/proc")) -> int | None:
    """Start of the mapping of `binary`'s first page in pid's address space, None if unmapped."""
    try:
        text = (proc / str(pid) / "maps").read_text()
    except OSError:
        return None
    real = Path(binary).resolve()
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or int(fields[2], 16) != 0:
            continue
        path = fields[5].removesuffix(" (deleted)")
        if path == binary or Path(path).resolve() == real:
            return int(fields[0].split("-")[0], 16)
    return None


def find(postmaster_pid: int, binary: str, proc: Path = Path("/proc")) -> WaitEventAddress:
    """The address for bpf/waits.bt, or a one-line PgprobeError saying what is missing."""
    value = symbol_value(binary)
    if value is None:
        raise PgprobeError(
            f"{binary} has no symbol {SYMBOL} (PostgreSQL {MIN_MAJOR} or later exports it)",
            EXIT_ENV,
        )
    pie, first_vaddr = first_load_vaddr(binary)
    if not pie:
        return WaitEventAddress(value, value, 0, binary)
    base = load_base(postmaster_pid, binary, proc)
    if base is None:
        raise PgprobeError(
            f"cannot find {binary} in /proc/{postmaster_pid}/maps (run pgprobe as root)", EXIT_ENV
        )
    base -= first_vaddr
    return WaitEventAddress(base + value, value, base, binary)


def read_current(pid: int, where: WaitEventAddress, proc: Path = Path("/proc")) -> tuple[int, int]:
    """(the pointer my_wait_event_info holds, the uint32 it points at) in pid's memory.

    What bpf/waits.bt and d/waits.d read at each switch-out, here from
    /proc/PID/mem (root, or the process's owner with ptrace rights). A null
    pointer reads as (0, 0). OSError when the memory cannot be read.
    """
    return read_through(pid, where.address, 0, proc)


def read_through(
    pid: int, address: int, offset: int, proc: Path = Path("/proc")
) -> tuple[int, int]:
    """(the pointer at address, the uint32 at that pointer + offset) in pid's memory, as
    the probes follow my_wait_event_info and MyBEEntry. A null pointer reads as (0, 0).
    OSError when the memory cannot be read."""
    with open(proc / str(pid) / "mem", "rb", buffering=0) as mem:
        pointer = _read_int(mem, address, 8)
        return (pointer, _read_int(mem, pointer + offset, 4)) if pointer else (0, 0)


def pointer_at(pid: int, address: int, proc: Path = Path("/proc")) -> int:
    """The 8-byte pointer at address in pid's memory (my_wait_event_info's value).
    OSError when the memory cannot be read."""
    with open(proc / str(pid) / "mem", "rb", buffering=0) as mem:
        return _read_int(mem, address, 8)


def _read_int(mem: BinaryIO, address: int, size: int) -> int:
    mem.seek(address)
    return int.from_bytes(mem.read(size), "little")
