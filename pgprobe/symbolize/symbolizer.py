"""The Symbolizer: raw user addresses per pid (from maps snapshots) and kernel addresses."""

from __future__ import annotations

import bisect
import io
import os
import struct
from collections.abc import Sequence

from elftools.common.exceptions import ELFError

from pgprobe import safefile
from pgprobe.symbolize.elf import DEFAULT_DEBUG_ROOT, ElfImage
from pgprobe.symbolize.frames import UNKNOWN, Frame, ModuleStats, SymbolStats
from pgprobe.symbolize.kernel import KernelSymbols
from pgprobe.symbolize.maps import Mapping, parse_maps
from pgprobe.symbolize.perfmap import PerfMaps


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
MAX_PARSED_MAPS = 256  # distinct maps texts kept parsed


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
        self._perf_maps = PerfMaps()
        # maps text -> its mappings: forked backends mostly have the same maps (1,000 idle
        # backends: 17 distinct texts), parsed once. Bounded for a long-running agent.
        self._parsed: dict[str, list[Mapping]] = {}

    # -- snapshots ---------------------------------------------------------

    def snapshot(self, pid: int) -> bool:
        """Record pid's current mappings. False if /proc/PID/maps can't be read."""
        try:
            with open(f"{self._proc}/{pid}/maps") as f:
                text = f.read()
        except OSError:
            self._stats.unreadable_pids.add(pid)
            return False
        mappings = self._parse(text)
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
            if m.deleted and m.kind == "file" and "x" in m.perms:
                self._image(m, pid)
        return True

    def _parse(self, text: str) -> list[Mapping]:
        mappings = self._parsed.get(text)
        if mappings is None:
            if len(self._parsed) >= MAX_PARSED_MAPS:
                self._parsed.clear()
            mappings = self._parsed[text] = parse_maps(text)
        return mappings

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
        refused: dict[str, str] = {}
        for cand, is_path in self._candidates(m, pid):
            try:
                # A path may have been replaced since it was mapped (by a FIFO, a link):
                # read as untrusted data, and only if it is still the mapped file.
                with safefile.open_regular(cand, follow=not is_path) as f:
                    if is_path and os.fstat(f.fileno()).st_ino != m.inode:
                        continue
                    img = ElfImage(f, m.path, self.debug_root)
            except safefile.Untrusted as exc:
                refused[cand] = str(exc)
                continue
            except (OSError, ELFError, ValueError, struct.error):
                continue
            break
        if img is None:
            self._stats.skipped_files.update(refused)  # said only where nothing else served
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
        """Files to read m's ELF from, and whether each is a path (whose inode must match
        m's) rather than /proc's magic link to the mapped file itself.

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

    def code_at(self, pid: int, addr: int) -> tuple[Mapping | None, ElfImage | None, int]:
        """For an unwinder: the mapping of pid's addr, its ELF image, and the ELF address.

        The image is None for anonymous memory (JIT code) or an unreadable
        file; the ELF address is then addr itself.
        """
        pm = self._maps_for(pid)
        m = pm.find(addr)
        if m is None:
            return None, None, addr
        if m.kind == "file":
            img = self._image(m, pm.pid)
            file_offset = addr - m.start + m.offset
        elif m.kind == "[vdso]":
            img = self._vdso_image()
            file_offset = addr - m.start
        else:
            return m, None, addr
        if img is None:
            return m, None, addr
        vaddr = img.vaddr(file_offset)
        return m, img, file_offset if vaddr is None else vaddr

    def _resolve(self, pm: _ProcMaps, addr: int) -> Frame:
        m = pm.find(addr)
        if m is None:
            # in no mapping read: JIT code unmapped since it ran (PostgreSQL's JIT maps and
            # frees code per query) is still named by the process's perf map, as perf does
            return self._perf_maps.named(pm.pid, addr, self._proc) or _UNKNOWN_FRAME
        kind = m.kind
        if kind == "[anon]" and "x" in m.perms:
            # Executable anonymous memory is generated code: named from the
            # process's /tmp/perf-PID.map when it writes one, else [jit].
            return self._perf_maps.frame(pm.pid, addr, m.start, self._proc)
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
            skipped_files={**st.skipped_files, **self._perf_maps.skipped},
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
