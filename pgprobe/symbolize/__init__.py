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

from pgprobe.symbolize.elf import DEFAULT_DEBUG_ROOT, ElfImage
from pgprobe.symbolize.frames import (
    KERNEL_MODULE,
    KERNEL_SUFFIX,
    UNKNOWN,
    Frame,
    ModuleStats,
    SymbolStats,
    folded_names,
)
from pgprobe.symbolize.kernel import KernelSymbols
from pgprobe.symbolize.maps import Mapping, parse_maps
from pgprobe.symbolize.symbolizer import Symbolizer

__all__ = [
    "DEFAULT_DEBUG_ROOT",
    "KERNEL_MODULE",
    "KERNEL_SUFFIX",
    "UNKNOWN",
    "ElfImage",
    "Frame",
    "KernelSymbols",
    "Mapping",
    "ModuleStats",
    "SymbolStats",
    "Symbolizer",
    "folded_names",
    "parse_maps",
]
