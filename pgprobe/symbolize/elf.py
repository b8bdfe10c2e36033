"""The symbols, load segments and debug files of one ELF file."""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
import zlib
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from pgprobe import safefile
from pgprobe.symbolize.ehframe import eh_frame_functions

DEFAULT_DEBUG_ROOT = "/usr/lib/debug"
# libLLVM's .symtab with its debug file is ~20 MiB; the largest debug file CRC-checked.
MAX_SYMBOL_TABLE = 512 * 2**20
MAX_DEBUG_FILE = 4 * 2**30
_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_BIND_RANK = {1: 0, 2: 1, 0: 2}  # GLOBAL, WEAK, LOCAL: preferred name first


def _func_symbols(elf: ELFFile, section_name: str) -> list[tuple[int, int, int, str]]:
    """(value, size, binding rank, name) of the defined functions of a symbol table."""
    sec = elf.get_section_by_name(section_name)
    if sec is None or sec["sh_type"] == "SHT_NOBITS" or sec["sh_size"] == 0:
        return []
    if sec["sh_size"] > MAX_SYMBOL_TABLE:  # a crafted (sparse) file: not read into memory
        return []
    data = sec.data()
    strtab = elf.get_section(sec["sh_link"]).data()
    out: list[tuple[int, int, int, str]] = []
    end = "<" if elf.little_endian else ">"
    if elf.elfclass == 64:
        fmt, size = end + "IBBHQQ", 24
    else:
        fmt, size = end + "IIIBBH", 16
    for row in struct.iter_unpack(fmt, data[: len(data) // size * size]):
        if size == 24:
            name_off, info, _other, shndx, value, sz = row
        else:
            name_off, value, sz, info, _other, shndx = row
        if info & 0xF not in (_STT_FUNC, _STT_GNU_IFUNC) or shndx == 0 or value == 0:
            continue
        nul = strtab.find(b"\0", name_off)
        name = strtab[name_off:nul].decode("utf-8", "replace")
        if not name:
            continue
        out.append((value, sz, _BIND_RANK.get(info >> 4, 3), name))
    return out


def _build_id(elf: ELFFile) -> str:
    for sec in elf.iter_sections():
        if sec["sh_type"] != "SHT_NOTE":
            continue
        for note in sec.iter_notes():  # type: ignore[attr-defined]
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return str(note["n_desc"])
    return ""


def _debuglink(elf: ELFFile) -> tuple[str, int] | None:
    sec = elf.get_section_by_name(".gnu_debuglink")
    if sec is None:
        return None
    data = sec.data()
    nul = data.find(b"\0")
    if nul <= 0:
        return None
    crc_at = (nul + 4) & ~3
    if len(data) < crc_at + 4:
        return None
    (crc,) = struct.unpack_from("<I" if elf.little_endian else ">I", data, crc_at)
    return data[:nul].decode("utf-8", "replace"), crc


def _file_crc(path: str) -> int:
    crc = 0
    with safefile.open_regular(path, follow=True) as f:
        safefile.check_size(f, MAX_DEBUG_FILE, path)
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def debuginfod_cached(build_id: str) -> list[str]:
    """Where debuginfod clients keep a file's debug info once fetched: read, never fetched.

    ``debuginfod-find debuginfo BUILD-ID`` (or gdb, or perf with DEBUGINFOD_URLS set)
    stores it in $DEBUGINFOD_CACHE_PATH, else $XDG_CACHE_HOME/debuginfod_client, else
    ~/.cache/debuginfod_client (also the sudo caller's, as pgprobe runs as root).
    """
    roots = [os.environ.get("DEBUGINFOD_CACHE_PATH", "")]
    if os.environ.get("XDG_CACHE_HOME"):
        roots.append(os.path.join(os.environ["XDG_CACHE_HOME"], "debuginfod_client"))
    roots.append(os.path.expanduser("~/.cache/debuginfod_client"))
    if os.environ.get("SUDO_USER"):
        roots.append(os.path.expanduser(f"~{os.environ['SUDO_USER']}/.cache/debuginfod_client"))
    return [os.path.join(r, build_id, "debuginfo") for r in roots if r]


def _open_debug(path: str, debug_root: str) -> BinaryIO:
    """A debug file, as untrusted data: a regular file only. Symlinks are followed under
    the debug root (root's: .build-id/ is made of them), not elsewhere (debuginfod caches
    are the sudo caller's own)."""
    return safefile.open_regular(path, follow=path.startswith(debug_root.rstrip("/") + "/"))


class ElfImage:
    """The symbols and load segments of one ELF file."""

    def __init__(self, stream: BinaryIO, path: str, debug_root: str) -> None:
        elf = ELFFile(stream)
        self.path = path
        self.module = os.path.basename(path)
        self.build_id = _build_id(elf)
        self.segments = [
            (seg["p_offset"], seg["p_filesz"], seg["p_vaddr"])
            for seg in elf.iter_segments()
            if seg["p_type"] == "PT_LOAD"
        ]
        syms = _func_symbols(elf, ".symtab")
        self.symbols = "symtab" if syms else "none"
        if not syms:
            syms = _func_symbols(elf, ".dynsym")
            if syms:
                self.symbols = "dynsym"
            debug = self._find_debug_file(elf, debug_root)
            dsyms: list[tuple[int, int, int, str]] = []
            if debug is not None:
                with contextlib.suppress(OSError, ELFError), _open_debug(debug, debug_root) as f:
                    dsyms = _func_symbols(ELFFile(f), ".symtab")
                if dsyms:
                    syms += dsyms
                    self.symbols = f"debug file {debug}"
        self.eh_frame = eh_frame_functions(elf)
        self._index(syms)
        self._cache: dict[int, tuple[str, int, bool]] = {}

    def _find_debug_file(self, elf: ELFFile, debug_root: str) -> str | None:
        if self.build_id and len(self.build_id) > 2:
            by_id = os.path.join(
                debug_root, ".build-id", self.build_id[:2], self.build_id[2:] + ".debug"
            )
            for cand in (by_id, *debuginfod_cached(self.build_id)):
                if self._build_id_of(cand, debug_root) == self.build_id:
                    return cand
        link = _debuglink(elf)
        if link is None:
            return None
        name, crc = link
        real = os.path.realpath(self.path)
        d = os.path.dirname(real)
        for cand in (
            os.path.join(d, name),
            os.path.join(d, ".debug", name),
            os.path.join(debug_root, d.lstrip("/"), name),
        ):
            if os.path.isfile(cand) and os.path.realpath(cand) != real:
                with contextlib.suppress(OSError):
                    if _file_crc(cand) == crc:
                        return cand
        return None

    @staticmethod
    def _build_id_of(path: str, debug_root: str) -> str:
        try:
            with _open_debug(path, debug_root) as f:
                return _build_id(ELFFile(f))
        except (OSError, ELFError):
            return ""

    def _index(self, syms: list[tuple[int, int, int, str]]) -> None:
        # One name per start address: sized before unsized, then global
        # before weak before local, then fewer leading underscores.
        def preference(s: tuple[int, int, int, str]) -> tuple[bool, int, int, str]:
            _, size, rank, name = s
            return (size == 0, rank, len(name) - len(name.lstrip("_")), name)

        best: dict[int, tuple[int, int, int, str]] = {}
        for s in syms:
            old = best.get(s[0])
            if old is None or preference(s) < preference(old):
                best[s[0]] = s
        rows = sorted(best.values())
        self.starts = [r[0] for r in rows]
        self.ends = [r[0] + max(r[1], 1) for r in rows]  # unsized: only its first byte
        self.names = [r[3] for r in rows]
        self.max_end: list[int] = []
        top = 0
        for e in self.ends:
            top = max(top, e)
            self.max_end.append(top)

    def vaddr(self, file_offset: int) -> int | None:
        """The ELF virtual address of a file offset (None: in no PT_LOAD)."""
        for off, filesz, vaddr in self.segments:
            if off <= file_offset < off + filesz:
                return file_offset - off + vaddr
        return None

    def lookup(self, vaddr: int) -> tuple[str, int, bool]:
        """(name, start, resolved) of the function holding vaddr.

        Unresolved: (module+0xSTART, START, False) where START is the
        function start from .eh_frame, else vaddr itself.
        """
        hit = self._cache.get(vaddr)
        if hit is not None:
            return hit
        res: tuple[str, int, bool] | None = None
        i = bisect.bisect_right(self.starts, vaddr) - 1
        while i >= 0 and self.max_end[i] > vaddr:
            if vaddr < self.ends[i]:
                res = (self.names[i], self.starts[i], True)
                break
            i -= 1
        if res is None:
            j = self.eh_frame.find(vaddr)
            start = vaddr if j is None else self.eh_frame.starts[j]
            res = (f"{self.module}+0x{start:x}", start, False)
        self._cache[vaddr] = res
        return res
