"""Function starts and ends from .eh_frame_hdr + .eh_frame (kept by stripped files)."""

from __future__ import annotations

import struct

from elftools.elf.elffile import ELFFile


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


def eh_frame_functions(elf: ELFFile) -> tuple[list[int], list[int]]:
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
