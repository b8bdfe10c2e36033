"""Name raw stack addresses: user addresses per pid, and kernel addresses.

Tracers hand pgprobe raw addresses (bpftrace runs with
BPFTRACE_NO_USER_SYMBOLS=1). This module names them in Python, from
/proc/PID/maps snapshots and ELF symbols, so that:

- a backend that exited before the capture ended is still named: its own
  snapshot, or else the postmaster's maps (backends are forked from the
  postmaster, so the server binary and the libraries loaded before the fork
  sit at the same addresses in every backend);
- a stripped binary's static functions are never mislabelled with the
  nearest exported name: an address must lie inside a symbol (start <= addr
  < start + size), otherwise the frame is ``module+0xOFFSET``.

API
---
``Symbolizer(kallsyms=True, debug_root="/usr/lib/debug", lazy_snapshots=True, proc="/proc")``
    ``kallsyms=False`` leaves every kernel frame ``[unknown]_[k]``;
    ``debug_root`` is where separate debug files live (tests point it
    elsewhere).

``.snapshot(pid) -> bool``
    Read /proc/PID/maps now (call it at capture start for the postmaster
    and every target, and for new pids as they appear). A second snapshot of
    the same pid adds to the first: mappings that went away since are kept
    unless a new mapping overlaps them. False when the maps can't be read.
    A file that was deleted or replaced since it was mapped ("(deleted)")
    is read at once through /proc/PID/map_files, while the process lives.
``.set_fallback(pid) -> bool``
    Use PID's snapshot (taken now if there is none) for pids that have none:
    the postmaster.
``.forget(pid)``
    Drop pid's snapshot (when the pid number was reused).
``.user_frames(pid, addrs, weight=1) -> list[Frame]``
    One Frame per address, in the same order (innermost first, as tracers
    print stacks). ``weight`` is how many samples the stack stands for; it
    only feeds the statistics. A pid with no snapshot is snapshotted on
    first use if it is still alive and (when a fallback is set) a child of
    the fallback pid; otherwise the fallback's maps are used; otherwise
    every frame is ``[unknown]``.
``.kernel_frames(addrs, weight=1) -> list[Frame]``
    Kernel addresses named from /proc/kallsyms; names carry FlameGraph's
    ``_[k]`` suffix (``do_syscall_64_[k]``; ``[unknown]_[k]`` when none).
``.stats -> SymbolStats``
    Frames resolved and unresolved per module, weighted, plus the pids whose
    maps could not be read or that used the fallback.
    ``stats.warnings()`` gives lines such as "47 % of frames unresolved in
    postgres (/usr/lib/postgresql/15/bin/postgres: only .dynsym, no debug
    file; install its debug symbols, build-id 44c0...)".

``Frame(name, module, resolved, offset=0)``
    ``name`` is the function (``ExecutorRun``), or when unresolved a stable
    label: ``postgres+0x2fb900`` (module = basename of the mapped file,
    offset from the file's load base, i.e. the ELF virtual address, the value
    addr2line and nm use), ``[anon]``, ``[heap]``, ``[stack]``, ``[vdso]``,
    ``[unknown]`` (no mapping). The vDSO is named from pgprobe's own copy
    (``__vdso_clock_gettime``). For a file without symbols for the address, the offset is
    the start of the enclosing function when .eh_frame describes it (so that
    all samples of one static function fold into one frame), else the
    address itself. ``offset`` is the address minus the start of ``name``.
    ``frame.label`` is ``name+0xoffset`` (for display), ``frame.folded`` the
    name alone (for FlameGraph folding: one function is one frame).

``folded_names(frames, main=None) -> list[str]``
    The names to fold (pgprobe.stacks.fold); with ``main="postgres"``,
    named frames of other modules become ``libc.so.6`__libc_pwrite``.

Symbols come from the file's .symtab, else its .dynsym, plus a separate
debug file when one is installed: ``<debug_root>/.build-id/xx/yyyy.debug``
by build-id, else the .gnu_debuglink name (CRC checked) in the file's
directory, its .debug/ subdirectory, or ``<debug_root>/<directory>``.
Parsed files are cached by (path, inode) and by build-id; results are cached
per address, and lookups use bisect.
"""

from __future__ import annotations

import bisect
import contextlib
import io
import os
import re
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

DEFAULT_DEBUG_ROOT = "/usr/lib/debug"
KERNEL_SUFFIX = "_[k]"
KERNEL_MODULE = "[kernel.kallsyms]"
UNKNOWN = "[unknown]"

_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_BIND_RANK = {1: 0, 2: 1, 0: 2}  # GLOBAL, WEAK, LOCAL: preferred name first


@dataclass(frozen=True, slots=True)
class Frame:
    """One named stack frame."""

    name: str
    module: str
    resolved: bool
    offset: int = 0

    @property
    def label(self) -> str:
        """``name+0xoffset`` (just ``name`` at offset 0): for display."""
        return f"{self.name}+0x{self.offset:x}" if self.offset else self.name

    @property
    def folded(self) -> str:
        """The frame as one FlameGraph frame: the name, without offset."""
        return self.name


def folded_names(frames: Iterable[Frame], main: str | None = None) -> list[str]:
    """Frame names for folding (pgprobe.stacks.fold), in the same order.

    With ``main`` (the server binary's module name, "postgres"), a named
    frame of any other user module is written ``module`name``
    (``libc.so.6`__libc_pwrite``, DTrace's convention, which pgprobe's
    flame graph colours by module); kernel frames (``_[k]``) and unresolved
    labels (``libc.so.6+0x1234``, ``[anon]``) already say where they are.
    """
    if main is None:
        return [f.name for f in frames]
    return [
        f"{f.module}`{f.name}"
        if f.resolved and f.module != main and not f.name.endswith(KERNEL_SUFFIX)
        else f.name
        for f in frames
    ]


@dataclass
class ModuleStats:
    """How many frames of one module got a name (weighted by samples)."""

    module: str
    resolved: int = 0
    unresolved: int = 0
    path: str = ""
    symbols: str = ""  # "symtab", "dynsym", "debug file <path>", "kallsyms", "none"
    build_id: str = ""

    @property
    def total(self) -> int:
        return self.resolved + self.unresolved

    @property
    def unresolved_pct(self) -> float:
        return 100.0 * self.unresolved / self.total if self.total else 0.0


@dataclass
class SymbolStats:
    """Resolution statistics over every frame symbolized so far."""

    modules: dict[str, ModuleStats] = field(default_factory=dict)
    unreadable_pids: set[int] = field(default_factory=set)  # maps could not be read
    fallback_pids: set[int] = field(default_factory=set)  # used the fallback's maps
    unknown_pids: set[int] = field(default_factory=set)  # no maps at all

    @property
    def resolved(self) -> int:
        return sum(m.resolved for m in self.modules.values())

    @property
    def unresolved(self) -> int:
        return sum(m.unresolved for m in self.modules.values())

    def warnings(self, min_pct: float = 5.0) -> list[str]:
        """One line per module with at least min_pct % of its frames unresolved."""
        out: list[str] = []
        for m in sorted(self.modules.values(), key=lambda m: -m.unresolved):
            if not m.unresolved or m.unresolved_pct < min_pct:
                continue
            line = f"{m.unresolved_pct:.0f} % of frames unresolved in {m.module}"
            if m.path and m.symbols in ("dynsym", "none"):
                what = "only .dynsym" if m.symbols == "dynsym" else "no symbols"
                line += f" ({m.path}: {what}, no debug file; install its debug symbols"
                line += f", build-id {m.build_id})" if m.build_id else ")"
            out.append(line)
        return out


# --------------------------------------------------------------------------
# /proc/PID/maps


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int  # file offset of `start`
    inode: int
    path: str  # without " (deleted)"
    deleted: bool

    @property
    def kind(self) -> str:
        if self.inode and self.path.startswith("/"):
            return "file"
        if self.path.startswith("[stack"):
            return "[stack]"
        if self.path in ("[heap]", "[vdso]", "[vsyscall]", "[vvar]"):
            return self.path
        return "[anon]"

    @property
    def module(self) -> str:
        k = self.kind
        return os.path.basename(self.path) if k == "file" else k


_MAPS_RE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+)\s+(\S+)\s+([0-9a-f]+)\s+\S+\s+(\d+)\s*(.*)$")


def parse_maps(text: str) -> list[Mapping]:
    """Parse the text of /proc/PID/maps."""
    out: list[Mapping] = []
    for line in text.splitlines():
        m = _MAPS_RE.match(line)
        if not m:
            continue
        path = m.group(6)
        deleted = path.endswith(" (deleted)")
        if deleted:
            path = path[: -len(" (deleted)")]
        out.append(
            Mapping(
                start=int(m.group(1), 16),
                end=int(m.group(2), 16),
                perms=m.group(3),
                offset=int(m.group(4), 16),
                inode=int(m.group(5)),
                path=path,
                deleted=deleted,
            )
        )
    return out


# --------------------------------------------------------------------------
# ELF files


def _uleb(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return result, pos


_EH_FIXED = {0x00: ("<Q", 8), 0x02: ("<H", 2), 0x03: ("<I", 4), 0x04: ("<Q", 8),
             0x0A: ("<h", 2), 0x0B: ("<i", 4), 0x0C: ("<q", 8)}  # fmt: skip


def _cie_fde_encoding(eh: bytes, cie: int) -> int | None:
    """The pointer encoding ('R' augmentation) of the CIE at offset cie."""
    pos = cie + 8  # length, CIE id
    version = eh[pos]
    pos += 1
    end = eh.index(b"\0", pos)
    aug = eh[pos:end].decode("ascii", "replace")
    pos = end + 1
    if "eh" in aug:
        pos += 8
    _, pos = _uleb(eh, pos)  # code alignment
    _, pos = _uleb(eh, pos)  # data alignment (sleb; only skipped)
    if version == 1:
        pos += 1
    else:
        _, pos = _uleb(eh, pos)
    if not aug.startswith("z"):
        return 0x00
    _, pos = _uleb(eh, pos)
    for ch in aug[1:]:
        if ch == "R":
            return eh[pos]
        if ch == "L":
            pos += 1
        elif ch == "P":
            penc = eh[pos]
            pos += 1
            fixed = _EH_FIXED.get(penc & 0x0F)
            if fixed is None:
                return None
            pos += fixed[1]
        elif ch not in "SB":
            return None
    return 0x00


def _eh_frame_functions(elf: ELFFile) -> tuple[list[int], list[int]]:
    """Function (start, end) virtual addresses from .eh_frame_hdr + .eh_frame.

    Stripped binaries keep these (they are needed for unwinding), so they
    tell where a static function starts and ends even without a name.
    """
    hdr_sec = elf.get_section_by_name(".eh_frame_hdr")
    eh_sec = elf.get_section_by_name(".eh_frame")
    if hdr_sec is None or eh_sec is None or not elf.little_endian:
        return [], []
    hdr = hdr_sec.data()
    eh = eh_sec.data()
    hdr_addr = hdr_sec["sh_addr"]
    eh_addr = eh_sec["sh_addr"]
    if len(hdr) < 12 or hdr[0] != 1 or hdr[3] != 0x3B:  # datarel | sdata4 table
        return [], []
    ptr_fixed = _EH_FIXED.get(hdr[1] & 0x0F)
    cnt_fixed = _EH_FIXED.get(hdr[2] & 0x0F)
    if ptr_fixed is None or cnt_fixed is None:
        return [], []
    pos = 4 + ptr_fixed[1]
    (count,) = struct.unpack_from(cnt_fixed[0], hdr, pos)
    pos += cnt_fixed[1]
    table = struct.unpack_from(f"<{2 * count}i", hdr, pos)
    encodings: dict[int, int | None] = {}
    starts: list[int] = []
    ends: list[int] = []
    for i in range(count):
        start = hdr_addr + table[2 * i]
        fde = hdr_addr + table[2 * i + 1] - eh_addr
        try:
            (length,) = struct.unpack_from("<I", eh, fde)
            if length == 0xFFFFFFFF:
                continue
            (cie_ptr,) = struct.unpack_from("<I", eh, fde + 4)
            cie = fde + 4 - cie_ptr
            if cie not in encodings:
                encodings[cie] = _cie_fde_encoding(eh, cie)
            enc = encodings[cie]
            fixed = _EH_FIXED.get(enc & 0x0F) if enc is not None else None
            if fixed is None:
                continue
            (size,) = struct.unpack_from(fixed[0], eh, fde + 8 + fixed[1])
        except (struct.error, IndexError, ValueError):
            continue
        if size > 0:
            starts.append(start)
            ends.append(start + size)
    return starts, ends


def _func_symbols(elf: ELFFile, section_name: str) -> list[tuple[int, int, int, str]]:
    """(value, size, binding rank, name) of the defined functions of a symbol table."""
    sec = elf.get_section_by_name(section_name)
    if sec is None or sec["sh_type"] == "SHT_NOBITS" or sec["sh_size"] == 0:
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
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


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
            if debug is not None:
                with open(debug, "rb") as f:
                    dsyms = _func_symbols(ELFFile(f), ".symtab")
                if dsyms:
                    syms += dsyms
                    self.symbols = f"debug file {debug}"
        self.fde_starts, self.fde_ends = _eh_frame_functions(elf)
        self._index(syms)
        self._cache: dict[int, tuple[str, int, bool]] = {}

    def _find_debug_file(self, elf: ELFFile, debug_root: str) -> str | None:
        if self.build_id and len(self.build_id) > 2:
            cand = os.path.join(
                debug_root, ".build-id", self.build_id[:2], self.build_id[2:] + ".debug"
            )
            if os.path.isfile(cand) and self._build_id_of(cand) == self.build_id:
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
    def _build_id_of(path: str) -> str:
        try:
            with open(path, "rb") as f:
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
            j = bisect.bisect_right(self.fde_starts, vaddr) - 1
            start = vaddr
            if j >= 0 and vaddr < self.fde_ends[j]:
                start = self.fde_starts[j]
            res = (f"{self.module}+0x{start:x}", start, False)
        self._cache[vaddr] = res
        return res


# --------------------------------------------------------------------------
# kernel


class KernelSymbols:
    """Text symbols of /proc/kallsyms (a symbol ends where the next starts)."""

    def __init__(self, path: str = "/proc/kallsyms") -> None:
        rows: list[tuple[int, str, str]] = []
        try:
            with open(path) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) < 3 or parts[1] not in ("t", "T", "w", "W"):
                        continue
                    addr = int(parts[0], 16)
                    if addr == 0:
                        continue
                    mod = parts[3].strip("[]") if len(parts) > 3 else ""
                    rows.append((addr, parts[2], mod))
        except OSError:
            rows = []
        rows.sort()
        self.available = bool(rows)  # False when not root (kptr_restrict) or unreadable
        self.starts = [r[0] for r in rows]
        self.names = [r[1] + KERNEL_SUFFIX for r in rows]
        self.modules = [f"[{r[2]}]" if r[2] else KERNEL_MODULE for r in rows]

    def lookup(self, addr: int) -> Frame:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i < 0 or (i == len(self.starts) - 1 and addr - self.starts[i] > 0x100000):
            return Frame(UNKNOWN + KERNEL_SUFFIX, KERNEL_MODULE, False)
        return Frame(self.names[i], self.modules[i], True, addr - self.starts[i])


# --------------------------------------------------------------------------
# the symbolizer


class _ProcMaps:
    """One pid's mappings, sorted, with a per-address cache of frames."""

    def __init__(self, pid: int, mappings: list[Mapping]) -> None:
        self.pid = pid
        self.set(mappings)
        self.cache: dict[int, Frame] = {}
        self.counts: dict[int, int] = {}
        # Counts of frames resolved under earlier mappings: {(module, resolved): n}
        self.retired: dict[tuple[str, bool], int] = {}

    def retire(self) -> None:
        """Fold the per-address counts into `retired` and empty the cache."""
        for a, n in self.counts.items():
            f = self.cache[a]
            key = (f.module, f.resolved)
            self.retired[key] = self.retired.get(key, 0) + n
        self.counts.clear()
        self.cache.clear()

    def set(self, mappings: list[Mapping]) -> None:
        self.mappings = sorted(mappings, key=lambda m: m.start)
        self.starts = [m.start for m in self.mappings]

    def find(self, addr: int) -> Mapping | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.mappings[i].end:
            return self.mappings[i]
        return None


_UNKNOWN_FRAME = Frame(UNKNOWN, UNKNOWN, False)


class Symbolizer:
    """Names raw user addresses per pid, and kernel addresses. See the module doc."""

    def __init__(
        self,
        kallsyms: bool = True,
        debug_root: str = DEFAULT_DEBUG_ROOT,
        lazy_snapshots: bool = True,
        proc: str = "/proc",
    ) -> None:
        self.debug_root = debug_root
        self.lazy_snapshots = lazy_snapshots
        self._proc = proc
        self._kallsyms_wanted = kallsyms
        self._kernel: KernelSymbols | None = None
        self._maps: dict[int, _ProcMaps] = {}
        self._fallback: _ProcMaps | None = None
        self._images: dict[tuple[str, int], ElfImage | None] = {}
        self._by_build_id: dict[str, ElfImage] = {}
        self._vdso: ElfImage | None | bool = False  # False: not loaded yet
        self._tried_lazy: set[int] = set()
        self._unknown = _ProcMaps(0, [])
        self._kernel_counts: dict[int, int] = {}
        self._kernel_cache: dict[int, Frame] = {}
        self._stats = SymbolStats()

    # -- snapshots ---------------------------------------------------------

    def snapshot(self, pid: int) -> bool:
        """Record pid's current mappings. False if /proc/PID/maps can't be read."""
        try:
            with open(f"{self._proc}/{pid}/maps") as f:
                text = f.read()
        except OSError:
            self._stats.unreadable_pids.add(pid)
            return False
        mappings = parse_maps(text)
        if not mappings:
            self._stats.unreadable_pids.add(pid)
            return False
        self._stats.unreadable_pids.discard(pid)
        old = self._maps.get(pid)
        if old is None:
            self._maps[pid] = _ProcMaps(pid, mappings)
        else:
            new_starts = sorted((m.start, m.end) for m in mappings)
            kept = [m for m in old.mappings if not _overlaps(new_starts, m.start, m.end)]
            old.retire()
            old.set(mappings + kept)
        # A deleted or replaced file can only be read through this process,
        # now, while it is alive: load those images at once.
        for m in mappings:
            if m.kind == "file" and "x" in m.perms and m.deleted:
                self._image(m, pid)
        return True

    def set_fallback(self, pid: int) -> bool:
        """Use pid's maps (the postmaster's) for pids with no snapshot of their own."""
        if pid not in self._maps and not self.snapshot(pid):
            return False
        self._fallback = self._maps[pid]
        return True

    def forget(self, pid: int) -> None:
        """Drop pid's snapshot (for a pid number that was reused)."""
        self._maps.pop(pid, None)

    def _maps_for(self, pid: int) -> _ProcMaps:
        pm = self._maps.get(pid)
        if pm is not None:
            return pm
        if self.lazy_snapshots and pid not in self._tried_lazy:
            self._tried_lazy.add(pid)
            if self._is_target_child(pid) and self.snapshot(pid):
                return self._maps[pid]
        if self._fallback is not None:
            self._stats.fallback_pids.add(pid)
            return self._fallback
        self._stats.unknown_pids.add(pid)
        return self._unknown

    def _is_target_child(self, pid: int) -> bool:
        if self._fallback is None:
            return True
        try:
            with open(f"{self._proc}/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            return False
        fields = stat[stat.rfind(")") + 2 :].split()
        return len(fields) > 1 and int(fields[1]) == self._fallback.pid

    # -- ELF images ----------------------------------------------------------

    def _image(self, m: Mapping, pid: int) -> ElfImage | None:
        key = (m.path, m.inode)
        if key in self._images:
            return self._images[key]
        img: ElfImage | None = None
        for cand, check_inode in self._candidates(m, pid):
            try:
                with open(cand, "rb") as f:
                    if check_inode and os.fstat(f.fileno()).st_ino != m.inode:
                        continue
                    img = ElfImage(f, m.path, self.debug_root)
            except (OSError, ELFError, ValueError, struct.error):
                continue
            break
        if img is not None and img.build_id:
            # Two files with one build-id hold the same code: share the
            # richer symbols (a stripped copy gets the unstripped names).
            other = self._by_build_id.get(img.build_id)
            if other is None or _richness(img) > _richness(other):
                self._by_build_id[img.build_id] = img
            else:
                img = other
        self._images[key] = img
        return img

    def _candidates(self, m: Mapping, pid: int) -> list[tuple[str, bool]]:
        """Files to read m's ELF from, and whether their inode must match m's.

        The path as mapped (only if it is still the same file), the path in
        the process's root (containers), and the mapped file itself through
        /proc/PID/map_files (while the process lives; also for deleted files).
        """
        out = [] if m.deleted else [(m.path, True), (f"{self._proc}/{pid}/root{m.path}", True)]
        out.append((f"{self._proc}/{pid}/map_files/{m.start:x}-{m.end:x}", False))
        return out

    def _vdso_image(self) -> ElfImage | None:
        if self._vdso is False:
            self._vdso = None
            try:
                with open(f"{self._proc}/self/maps") as f:
                    own = parse_maps(f.read())
                for m in own:
                    if m.path == "[vdso]":
                        with open(f"{self._proc}/self/mem", "rb") as mem:
                            mem.seek(m.start)
                            data = mem.read(m.end - m.start)
                        self._vdso = ElfImage(io.BytesIO(data), "[vdso]", self.debug_root)
            except (OSError, ELFError, ValueError, struct.error, OverflowError):
                self._vdso = None
        return self._vdso if isinstance(self._vdso, ElfImage) else None

    # -- resolution ----------------------------------------------------------

    def _resolve(self, pm: _ProcMaps, addr: int) -> Frame:
        m = pm.find(addr)
        if m is None:
            return _UNKNOWN_FRAME
        kind = m.kind
        if kind == "file":
            module = m.module
            file_offset = addr - m.start + m.offset
            img = self._image(m, pm.pid)
        elif kind == "[vdso]":
            module = kind
            file_offset = addr - m.start
            img = self._vdso_image()
        else:
            return Frame(kind, kind, False, addr - m.start)
        if img is None:
            return Frame(f"{module}+0x{file_offset:x}", module, False)
        vaddr = img.vaddr(file_offset)
        if vaddr is None:
            vaddr = file_offset
        name, start, ok = img.lookup(vaddr)
        if not ok and img.module != module:  # same file under another name
            name = f"{module}+0x{start:x}"
        return Frame(name, module, ok, vaddr - start)

    def user_frames(self, pid: int, addrs: Sequence[int], weight: int = 1) -> list[Frame]:
        """Frames for pid's user addresses, in the same order."""
        pm = self._maps_for(pid)
        cache = pm.cache
        counts = pm.counts
        out: list[Frame] = []
        append = out.append
        for a in addrs:
            f = cache.get(a)
            if f is None:
                f = cache[a] = self._resolve(pm, a)
                counts[a] = 0
            counts[a] += weight
            append(f)
        return out

    def kernel_frames(self, addrs: Sequence[int], weight: int = 1) -> list[Frame]:
        """Frames for kernel addresses (names from /proc/kallsyms, with _[k])."""
        if self._kernel is None:
            self._kernel = KernelSymbols() if self._kallsyms_wanted else KernelSymbols("/dev/null")
        cache = self._kernel_cache
        counts = self._kernel_counts
        out: list[Frame] = []
        for a in addrs:
            f = cache.get(a)
            if f is None:
                f = cache[a] = self._kernel.lookup(a)
                counts[a] = 0
            counts[a] += weight
            out.append(f)
        return out

    # -- statistics ----------------------------------------------------------

    @property
    def stats(self) -> SymbolStats:
        """Frames resolved/unresolved per module so far (weighted by samples)."""
        st = self._stats
        mods: dict[str, ModuleStats] = {}
        info: dict[str, tuple[str, str, str]] = {}
        for img in list(self._images.values()) + [self._vdso_image_if_loaded()]:
            if img is not None:
                info.setdefault(img.module, (img.path, img.symbols, img.build_id))
        seen: set[int] = set()
        for pm in [*self._maps.values(), self._unknown]:
            if id(pm) in seen:
                continue
            seen.add(id(pm))
            _tally(mods, pm.counts, pm, info)
        kinfo = ("/proc/kallsyms", "kallsyms", "")
        for a, n in self._kernel_counts.items():
            f = self._kernel_cache[a]
            ms = mods.get(f.module)
            if ms is None:
                ms = mods[f.module] = ModuleStats(f.module, 0, 0, *kinfo)
            if f.resolved:
                ms.resolved += n
            else:
                ms.unresolved += n
        return SymbolStats(
            modules=mods,
            unreadable_pids=set(st.unreadable_pids),
            fallback_pids=set(st.fallback_pids),
            unknown_pids=set(st.unknown_pids),
        )

    def _vdso_image_if_loaded(self) -> ElfImage | None:
        return self._vdso if isinstance(self._vdso, ElfImage) else None


def _tally(
    mods: dict[str, ModuleStats],
    counts: dict[int, int],
    pm: _ProcMaps,
    info: dict[str, tuple[str, str, str]],
) -> None:
    rows: list[tuple[str, bool, int]] = [(m, r, n) for (m, r), n in pm.retired.items()]
    for a, n in counts.items():
        f = pm.cache[a]
        rows.append((f.module, f.resolved, n))
    for module, resolved, n in rows:
        ms = mods.get(module)
        if ms is None:
            path, symbols, build_id = info.get(module, ("", "none", ""))
            ms = mods[module] = ModuleStats(module, 0, 0, path, symbols, build_id)
        if resolved:
            ms.resolved += n
        else:
            ms.unresolved += n


def _richness(img: ElfImage) -> int:
    return {"none": 0, "dynsym": 1}.get(img.symbols, 2)  # symtab or debug file: 2


def _overlaps(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    i = bisect.bisect_left(ranges, (end, 0))
    return i > 0 and ranges[i - 1][1] > start
