"""USDT probes compiled into a binary (the .note.stapsdt ELF notes), and who else probes them."""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pgprobe import safefile
from pgprobe.errors import EXIT_ENV, PgprobeError

PROVIDER = "postgresql"
# lwlocks is the one tool that needs USDT probes; what a DBA can still use without them.
STILL_WORKS = "waits, clog-reads, flame, hot, triage without its LWLock table"


@lru_cache(maxsize=8)
def probe_names(binary: str) -> frozenset[tuple[str, str]]:
    """{(provider, name)} of the binary's USDT probes (empty: built without dtrace)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import NoteSection

    found: set[tuple[str, str]] = set()
    try:
        with safefile.open_regular(binary, follow=True) as f:
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
            missing = (
                "has none (built without --enable-dtrace)"
                if not present
                else f"lacks {PROVIDER}:{name}"
            )
            raise PgprobeError(
                f"lwlocks needs USDT probes: {binary} {missing}; still works: {STILL_WORKS}",
                EXIT_ENV,
            )


@dataclass(frozen=True)
class Site:
    """One place a USDT probe is compiled in: file offset, and its semaphore (0: none)."""

    name: str
    offset: int
    semaphore: int


@lru_cache(maxsize=8)
def probe_sites(binary: str) -> tuple[Site, ...]:
    """Every site of the binary's postgresql probes, as file offsets (what uprobes use)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import NoteSection

    sites = []
    try:
        with safefile.open_regular(binary, follow=True) as f:
            elf = ELFFile(f)
            fmt = "<QQQ" if elf.elfclass == 64 else "<III"
            size = struct.calcsize(fmt)
            loads = [
                (int(s["p_vaddr"]), int(s["p_filesz"]), int(s["p_offset"]))
                for s in elf.iter_segments()
                if s["p_type"] == "PT_LOAD"
            ]
            section = elf.get_section_by_name(".note.stapsdt")
            if not isinstance(section, NoteSection):
                return ()
            for note in section.iter_notes():
                desc = note["n_descdata"]
                if note["n_name"] != "stapsdt" or len(desc) < size:
                    continue
                pc, _base, semaphore = struct.unpack(fmt, desc[:size])
                provider, name = desc[size:].split(b"\0")[:2]
                if provider.decode() != PROVIDER:
                    continue
                sites.append(Site(name.decode(), _file_offset(loads, pc), semaphore))
    except (OSError, ELFError, struct.error):
        return ()
    return tuple(sites)


def _file_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int:
    """A virtual address of the ELF file -> its offset in the file (PT_LOAD segments)."""
    for start, size, offset in loads:
        if start <= vaddr < start + size:
            return vaddr - start + offset
    return vaddr


@dataclass(frozen=True)
class ForeignUprobe:
    """A uprobe another tool registered (perf probe, a DTrace provider) on one of our sites."""

    event: str  # group/name in uprobe_events, e.g. probe_postgres/lwdone
    site: Site

    def describe(self) -> str:
        fix = (
            f"perf probe -d {self.event.replace('/', ':')}"
            if self.event.startswith("probe_")
            else f"stop the tool that registered {self.event}"
        )
        return (
            f"another uprobe ({self.event}) sits on USDT probe {self.site.name} at offset "
            f"0x{self.site.offset:x} without its semaphore: while it is in use the kernel "
            f"refuses pgprobe's probe there (dmesg: ref_ctr_offset mismatch) and those events "
            f"are not counted; remove it: {fix}"
        )


UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")
# p:GROUP/EVENT PATH:0xOFFSET[(0xREFCTR)] [args]
_EVENT = re.compile(r"^[pr]:(\S+)\s+(\S+?):0x([0-9a-fA-F]+)(\(0x[0-9a-fA-F]+\))?")


def foreign_uprobes(
    binary: str, names: tuple[str, ...], events: Path = UPROBE_EVENTS
) -> list[ForeignUprobe]:
    """uprobes in tracefs on the sites of probes `names` of `binary` that lack the semaphore.

    PostgreSQL's USDT sites have semaphores; a uprobe registered there without
    one (perf probe -a ADDRESS) conflicts with ours. bpftrace's own probes do
    not appear here (they are perf events, not tracefs events).
    """
    try:
        text = events.read_text()
    except OSError:
        return []
    sites = {s.offset: s for s in probe_sites(binary) if s.name in names and s.semaphore}
    real = _same_file(binary)
    out = []
    for line in text.splitlines():
        match = _EVENT.match(line)
        if not match or match.group(4):
            continue
        event, path, offset = match.group(1), match.group(2), int(match.group(3), 16)
        site = sites.get(offset)
        if site is not None and _same_file(path) == real:
            out.append(ForeignUprobe(event, site))
    return out


def _same_file(path: str) -> tuple[int, int] | str:
    try:
        st = os.stat(path)
    except OSError:
        return path
    return (st.st_dev, st.st_ino)
