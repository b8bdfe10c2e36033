"""USDT probes compiled into a binary (the .note.stapsdt ELF notes)."""

from __future__ import annotations

import struct
from functools import lru_cache

from pgprobe.errors import EXIT_ENV, PgprobeError

PROVIDER = "postgresql"


@lru_cache(maxsize=8)
def probe_names(binary: str) -> frozenset[tuple[str, str]]:
    """{(provider, name)} of the binary's USDT probes (empty: built without dtrace)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import NoteSection

    found: set[tuple[str, str]] = set()
    try:
        with open(binary, "rb") as f:
            elf = ELFFile(f)
            addr_size = 8 if elf.elfclass == 64 else 4
            section = elf.get_section_by_name(".note.stapsdt")
            if not isinstance(section, NoteSection):
                return frozenset()
            for note in section.iter_notes():
                if note["n_name"] != "stapsdt":
                    continue
                # pyelftools mistakes type 3 for a GNU build-id; the raw bytes are right.
                desc = note["n_descdata"]
                # three addresses (pc, base, semaphore), then "provider\0name\0args\0"
                provider, name = desc[3 * addr_size :].split(b"\0")[:2]
                found.add((provider.decode(), name.decode()))
    except (OSError, ELFError, struct.error) as exc:
        raise PgprobeError(f"cannot read USDT probes of {binary}: {exc}", EXIT_ENV) from None
    return frozenset(found)


def require(binary: str, names: tuple[str, ...]) -> None:
    """Fail with a clear line when the server lacks a probe a tool needs."""
    present = probe_names(binary)
    for name in names:
        if (PROVIDER, name) not in present:
            detail = "it has no USDT probes at all" if not present else f"probe {name} is missing"
            raise PgprobeError(
                f"PostgreSQL server {binary} was built without --enable-dtrace ({detail}: "
                f"usdt:{binary}:{PROVIDER}:{name}); install a build with probes",
                EXIT_ENV,
            )
