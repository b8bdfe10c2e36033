"""One exported symbol of an ELF file, found fast: `defined_symbol(path, name)`.

Tools ask for one name in the server binary before each capture (clog-reads: is
pgstat_count_slru_page_read exported; waits: where is my_wait_event_info). pyelftools'
get_symbol_by_name builds a Symbol object for each of the ~10,800 entries of Debian's
postgres .dynsym first: 0.2-0.25 s of CPU on the way to attach, more than bpftrace needs to
compile lwlock_wait.bt. Here pyelftools reads the section headers only; the string table is
searched for the name as bytes and the symbol table unpacked with struct in one call (a few
ms). Results are cached per (path, size, mtime, name).
"""

from __future__ import annotations

import functools
import os
import struct

from elftools.elf.elffile import ELFFile

from pgprobe import safefile

# st_name, st_info, st_other, st_shndx, st_value, st_size (ELF64); ELF32 orders them
# st_name, st_value, st_size, st_info, st_other, st_shndx.
_SYM64 = struct.Struct("<IBBHQQ")
_SYM32 = struct.Struct("<IIIBBH")
SHN_UNDEF = 0


def defined_symbol(path: str, name: str, tables: tuple[str, ...] = (".dynsym",)) -> int | None:
    """st_value of the first defined symbol `name` in the given tables; None when absent.

    A defined symbol (st_shndx != SHN_UNDEF) may have the value 0 in a relocatable file
    only; callers that need an address check it. Raises OSError / ELFError when the file
    cannot be read as ELF.
    """
    st = os.stat(path)
    return _lookup(path, st.st_size, st.st_mtime_ns, name, tables)


@functools.lru_cache(maxsize=64)
def _lookup(path: str, size: int, mtime_ns: int, name: str, tables: tuple[str, ...]) -> int | None:
    # The server's binary may sit where others write (a user's own build): never block.
    with safefile.open_regular(path, follow=True) as f:
        return defined_in(ELFFile(f), name, tables)


def defined_in(elf: ELFFile, name: str, tables: tuple[str, ...] = (".dynsym",)) -> int | None:
    """defined_symbol's answer for an ELF file already open."""
    for table in tables:
        section = elf.get_section_by_name(table)
        if section is None or section["sh_type"] not in ("SHT_DYNSYM", "SHT_SYMTAB"):
            continue
        strtab = elf.get_section(section["sh_link"])
        found = _in_table(elf, section.data(), strtab.data(), name.encode())
        if found is not None:
            return found
    return None


def _in_table(elf: ELFFile, symbols: bytes, strings: bytes, name: bytes) -> int | None:
    """The value of the first defined entry whose st_name points at `name`."""
    offsets = set()
    needle = name + b"\0"
    at = strings.find(needle)
    while at != -1:
        # The name may also be the tail of a longer one ("foo" in "barfoo"): any offset
        # where the bytes read exactly `name` up to a NUL is a valid st_name for it.
        offsets.add(at)
        at = strings.find(needle, at + 1)
    if not offsets:
        return None
    wide = elf.elfclass == 64
    layout = _SYM64 if wide else _SYM32
    if not elf.little_endian:
        layout = struct.Struct(">" + layout.format[1:])
    usable = len(symbols) - len(symbols) % layout.size
    for entry in layout.iter_unpack(symbols[:usable]):
        if wide:
            st_name, _, _, shndx, value, _ = entry
        else:
            st_name, value, _, _, _, shndx = entry
        if st_name in offsets and shndx != SHN_UNDEF:
            return int(value)
    return None
