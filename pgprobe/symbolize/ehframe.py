"""Function starts and ends from .eh_frame_hdr + .eh_frame (kept by stripped files)."""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field

from elftools.elf.elffile import ELFFile


def leb128(data: bytes, pos: int, signed: bool = False) -> tuple[int, int]:
    """A DWARF LEB128 number at data[pos]: (value, position after it)."""
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            if signed and b & 0x40:
                result -= 1 << shift
            return result, pos


def uleb(data: bytes, pos: int) -> tuple[int, int]:
    return leb128(data, pos)


def sleb(data: bytes, pos: int) -> tuple[int, int]:
    return leb128(data, pos, signed=True)


EH_FIXED = {0x00: ("<Q", 8), 0x02: ("<H", 2), 0x03: ("<I", 4), 0x04: ("<Q", 8),
             0x0A: ("<h", 2), 0x0B: ("<i", 4), 0x0C: ("<q", 8)}  # fmt: skip


def cie_fde_encoding(eh: bytes, cie: int) -> int | None:
    """The pointer encoding ('R' augmentation) of the CIE at offset cie."""
    pos = cie + 8  # length, CIE id
    version = eh[pos]
    pos += 1
    end = eh.index(b"\0", pos)
    aug = eh[pos:end].decode("ascii", "replace")
    pos = end + 1
    if "eh" in aug:
        pos += 8
    _, pos = uleb(eh, pos)  # code alignment
    _, pos = uleb(eh, pos)  # data alignment (sleb; only skipped)
    if version == 1:
        pos += 1
    else:
        _, pos = uleb(eh, pos)
    if not aug.startswith("z"):
        return 0x00
    _, pos = uleb(eh, pos)
    for ch in aug[1:]:
        if ch == "R":
            return eh[pos]
        if ch == "L":
            pos += 1
        elif ch == "P":
            penc = eh[pos]
            pos += 1
            fixed = EH_FIXED.get(penc & 0x0F)
            if fixed is None:
                return None
            pos += fixed[1]
        elif ch not in "SB":
            return None
    return 0x00


@dataclass
class EhFrameIndex:
    """The functions .eh_frame describes, sorted by start, and the section itself.

    starts/ends are virtual addresses; fdes[i] is the offset in `data` of the
    FDE of function i (pgprobe.unwind.cfi reads its unwind rules from there);
    `address` is the section's virtual address.
    """

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    fdes: list[int] = field(default_factory=list)
    data: bytes = b""
    address: int = 0

    def find(self, vaddr: int) -> int | None:
        """The index of the function holding vaddr, if .eh_frame describes one."""
        i = bisect.bisect_right(self.starts, vaddr) - 1
        return i if i >= 0 and vaddr < self.ends[i] else None


def eh_frame_functions(elf: ELFFile) -> EhFrameIndex:
    """Function (start, end) virtual addresses from .eh_frame_hdr + .eh_frame.

    Stripped binaries keep these (they are needed for unwinding), so they
    tell where a static function starts and ends even without a name.
    """
    hdr_sec = elf.get_section_by_name(".eh_frame_hdr")
    eh_sec = elf.get_section_by_name(".eh_frame")
    if hdr_sec is None or eh_sec is None or not elf.little_endian:
        return EhFrameIndex()
    hdr = hdr_sec.data()
    eh = eh_sec.data()
    hdr_addr = hdr_sec["sh_addr"]
    eh_addr = eh_sec["sh_addr"]
    if len(hdr) < 12 or hdr[0] != 1 or hdr[3] != 0x3B:  # datarel | sdata4 table
        return EhFrameIndex()
    ptr_fixed = EH_FIXED.get(hdr[1] & 0x0F)
    cnt_fixed = EH_FIXED.get(hdr[2] & 0x0F)
    if ptr_fixed is None or cnt_fixed is None:
        return EhFrameIndex()
    pos = 4 + ptr_fixed[1]
    (count,) = struct.unpack_from(cnt_fixed[0], hdr, pos)
    pos += cnt_fixed[1]
    table = struct.unpack_from(f"<{2 * count}i", hdr, pos)
    encodings: dict[int, int | None] = {}
    out = EhFrameIndex(data=eh, address=eh_addr)
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
                encodings[cie] = cie_fde_encoding(eh, cie)
            enc = encodings[cie]
            fixed = EH_FIXED.get(enc & 0x0F) if enc is not None else None
            if fixed is None:
                continue
            (size,) = struct.unpack_from(fixed[0], eh, fde + 8 + fixed[1])
        except (struct.error, IndexError, ValueError):
            continue
        if size > 0:
            out.starts.append(start)
            out.ends.append(start + size)
            out.fdes.append(fde)
    return out
