"""The libbpf engine: load a compiled BPF object with the system's libbpf, attach it, read its maps.

Why: some tools' cost per event must be lower than bpftrace 0.17 allows. A compiled
object (clang -target bpf, CO-RE) attaches to raw BTF tracepoints (SEC("tp_btf/...")):
the program gets the kernel's own arguments, with no perf record filled per event as
for classic tracepoints, and reads task_struct fields as plain loads instead of a
helper call per read. pgprobe loads it with the system's libbpf.so.1 through ctypes:
bpftrace's own dependency, so present wherever bpftrace is, and nothing to build.

Every failure is a LibbpfError of one line; libbpf's own messages never reach the
terminal: they are kept in BpfObject.log.

Kept in one module (~560 lines): the prototypes, the object's life (open, load, attach:
tracepoints, uprobes, USDT probes, perf events), its map reads (in batches where the kernel
has them) and its ring buffers share one library handle, one message sink and one error path.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import platform
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from pgprobe.engines import perfevent

VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")

_V, _INT, _U32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32  # c_void_p: libbpf's opaque types
_PRINT_FN = ctypes.CFUNCTYPE(_INT, _INT, ctypes.c_char_p, _V)  # int (*)(level, fmt, va_list)
_SAMPLE_FN = ctypes.CFUNCTYPE(_INT, _V, _V, ctypes.c_size_t)  # int (*)(ctx, data, size)
_PROTOTYPES: dict[str, tuple[Any, list[Any]]] = {
    "libbpf_set_print": (_V, [_PRINT_FN]), "libbpf_get_error": (ctypes.c_long, [_V]),
    "libbpf_version_string": (ctypes.c_char_p, []),
    "bpf_object__open_file": (_V, [ctypes.c_char_p, _V]), "bpf_object__load": (_INT, [_V]),
    "bpf_object__close": (None, [_V]), "bpf_object__next_program": (_V, [_V, _V]),
    "bpf_object__find_map_by_name": (_V, [_V, ctypes.c_char_p]),
    "bpf_program__name": (ctypes.c_char_p, [_V]), "bpf_program__fd": (_INT, [_V]),
    "bpf_program__attach": (_V, [_V]), "bpf_link__destroy": (_INT, [_V]),
    "bpf_program__attach_uprobe_opts": (_V, [_V, _INT, ctypes.c_char_p, ctypes.c_size_t, _V]),
    "bpf_program__attach_usdt": (_V, [_V, _INT, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_char_p, _V]),
    "bpf_program__set_autoload": (_INT, [_V, ctypes.c_bool]),
    "bpf_map__initial_value": (_V, [_V, ctypes.POINTER(ctypes.c_size_t)]),
    "bpf_map__fd": (_INT, [_V]), "bpf_map__type": (_INT, [_V]),
    "bpf_map__key_size": (_U32, [_V]), "bpf_map__value_size": (_U32, [_V]),
    "bpf_map__max_entries": (_U32, [_V]),
    "bpf_map_get_next_key": (_INT, [_INT, _V, _V]), "bpf_map_lookup_elem": (_INT, [_INT, _V, _V]),
    "bpf_map_update_elem": (_INT, [_INT, _V, _V, ctypes.c_uint64]),
    "bpf_map_delete_elem": (_INT, [_INT, _V]),
    "bpf_map_lookup_batch": (_INT, [_INT, _V, _V, _V, _V, ctypes.POINTER(_U32), _V]),
    "bpf_program__attach_perf_event": (_V, [_V, _INT]),
    "ring_buffer__new": (_V, [_INT, _SAMPLE_FN, _V, _V]), "ring_buffer__consume": (_INT, [_V]),
    "ring_buffer__free": (None, [_V]),
}  # fmt: skip
_LIBBPF_DEBUG = 2  # enum libbpf_print_level: WARN 0, INFO 1, DEBUG 2 (dropped, as libbpf's default)
_PERCPU_MAPS = {5, 6, 10, 21}  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH, PERCPU_CGROUP_STORAGE
_BPF_NOEXIST = 1  # bpf_map_update_elem flag: create only
# sizeof(va_list) where va_copy is a plain struct copy (and va_list arrives as a pointer).
_VA_LIST_SIZE = {"x86_64": 24, "aarch64": 32}.get(platform.machine())

# libbpf's prefixes, and the lines around a verifier log that say nothing of the cause.
_PREFIX = re.compile(r"^libbpf: (?:prog '[^']*': )?")
_FAILED_PROG = re.compile(r"prog '([^']+)': (?:BPF program load failed|failed to load)")
_NOISE = re.compile(
    r"failed to load object|failed to load: -?\d+$|processed \d+ insns|verification time"
    r"|stack depth|-- (?:BEGIN|END) PROG LOAD LOG --|failed to prepare load attributes"
)


class LibbpfError(Exception):
    """A failure to open, load, attach or read a BPF object: one line, to show the user."""


_NO_BATCH = {errno.EOPNOTSUPP, 524}  # 524: the kernel's ENOTSUPP (no batch ops for the map)
_BATCH = 4096  # entries asked per batch read (more when one hash bucket holds more)


def _batch_items(
    fd: int, key_size: int, value_size: int, max_entries: int
) -> list[tuple[bytes, bytes]] | int:
    """A map's entries read in batches, or the error (negative errno) of the first read.
    A hash map is read bucket by bucket, each bucket whole (a key deleted meanwhile is
    missed, one added may be: as a walk key by key); ENOENT ends it, with the last entries."""
    lib = _lib()
    asked = max(1, min(max_entries, _BATCH))
    token_size = max(key_size, 8)  # the kernel's cursor: a bucket index (u32) for hashes
    cursor, after = ctypes.create_string_buffer(token_size), ctypes.create_string_buffer(token_size)
    count = _U32()
    out: list[tuple[bytes, bytes]] = []
    first = True
    while True:
        keys = ctypes.create_string_buffer(key_size * asked)
        values = ctypes.create_string_buffer(value_size * asked)
        count.value = asked
        err = lib.bpf_map_lookup_batch(fd, None if first else cursor, after, keys, values,
                                       ctypes.byref(count), None)  # fmt: skip
        if err == -errno.ENOSPC and count.value == 0 and asked < max_entries:
            asked = min(max_entries, 2 * asked)  # a bucket larger than the batch: again
            continue
        if err < 0 and err != -errno.ENOENT:
            if first:
                return int(err)
            raise LibbpfError(f"cannot read a map in batches: {os.strerror(-err)}")
        got = count.value
        k = ctypes.string_at(keys, key_size * got)
        v = ctypes.string_at(values, value_size * got)
        out.extend((k[i * key_size : (i + 1) * key_size], v[i * value_size : (i + 1) * value_size])
                   for i in range(got))  # fmt: skip
        if err == -errno.ENOENT:
            return out
        ctypes.memmove(cursor, after, token_size)
        first = False


# The log libbpf's messages go to: set before each call that may print. libbpf calls the
# print function in the calling thread, so objects used in other threads keep their own.
_sink = threading.local()


def _print(level: int, fmt: bytes | None, args: int | None) -> int:
    log: list[str] | None = getattr(_sink, "log", None)
    if log is None or fmt is None or level == _LIBBPF_DEBUG:
        return 0
    log.extend(line for line in _format(fmt, args).splitlines() if line.strip())
    return 0


_LIBC = ctypes.CDLL(None)  # the process's libc: vsnprintf formats libbpf's va_list messages
_LIBC.vsnprintf.restype = _INT
_LIBC.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, _V]
_PRINT = _PRINT_FN(_print)  # module-level: libbpf keeps the pointer for the process's life


def _format(fmt: bytes, args: int | None) -> str:
    size = 1 << 16
    if _VA_LIST_SIZE and args:
        # A verifier log comes whole in one message and its end matters most: measure it
        # on a copy of the va_list (vsnprintf consumes the one it gets), then format it all.
        copy = ctypes.create_string_buffer(_VA_LIST_SIZE)
        ctypes.memmove(copy, args, _VA_LIST_SIZE)
        size = max(_LIBC.vsnprintf(None, 0, fmt, copy), 0) + 1
    buf = ctypes.create_string_buffer(size)
    _LIBC.vsnprintf(buf, size, fmt, args)
    return buf.value.decode(errors="replace")


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    for name, (restype, argtypes) in _PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    lib.libbpf_set_print(_PRINT)  # before any other call: libbpf never writes to stderr itself
    return lib


def unavailable() -> str | None:
    """Why a compiled object cannot be loaded here (one line), or None."""
    try:
        _lib()
    except (OSError, AttributeError):
        return "libbpf.so.1 (libbpf 1.x) is not installed"
    if os.geteuid() != 0:
        return "loading BPF programs needs root"
    if not VMLINUX_BTF.exists():
        return f"the kernel has no BTF ({VMLINUX_BTF} is missing)"
    return None


def version() -> str:
    """libbpf's version ("1.1"), or "" when it is not installed."""
    try:
        return str(_lib().libbpf_version_string().decode()).lstrip("v")
    except (OSError, AttributeError):
        return ""


def recursion_misses(fds: list[int]) -> int:
    """Runs the kernel skipped, summed over programs (fdinfo's recursion_misses, 5.12+)."""
    total = 0
    for fd in fds:
        with open(f"/proc/self/fdinfo/{fd}") as fh:
            total += sum(int(ln.split()[1]) for ln in fh if ln.startswith("recursion_misses:"))
    return total


def rodata_names(path: Path) -> frozenset[str]:
    """The names of the object's `const volatile` globals (what a load may set)."""
    return frozenset(_rodata_symbols(path))


def _rodata_symbols(path: Path) -> dict[str, tuple[int, int]]:
    """The object's `const volatile` globals: name -> (offset in .rodata, size)."""
    try:
        with path.open("rb") as fh:
            elf = ELFFile(fh)
            index = next((i for i, s in enumerate(elf.iter_sections()) if s.name == ".rodata"), -1)
            symtab = elf.get_section_by_name(".symtab")
            if index < 0 or not isinstance(symtab, SymbolTableSection):
                return {}
            return {
                str(s.name): (int(s["st_value"]), int(s["st_size"]))
                for s in symtab.iter_symbols()
                if s["st_shndx"] == index and s["st_info"]["type"] == "STT_OBJECT"
            }
    except (OSError, ELFError) as exc:
        raise LibbpfError(f"cannot read {path}: {exc}") from None


def _cause(log: list[str]) -> str | None:
    """The last line of libbpf's log that says why (a verifier log's error, not its stats)."""
    for line in reversed(log):
        text = _PREFIX.sub("", line).strip()
        if text and not _NOISE.search(text):
            return text
    return None


class _UprobeOpts(ctypes.Structure):
    """libbpf's struct bpf_uprobe_opts as of 1.0 (sz: the fields this side knows of)."""

    _fields_ = [("sz", ctypes.c_size_t), ("ref_ctr_offset", ctypes.c_size_t),
                ("bpf_cookie", ctypes.c_uint64), ("retprobe", ctypes.c_bool),
                ("func_name", ctypes.c_char_p)]  # fmt: skip


class BpfObject:
    """A compiled BPF object, loaded (verified) on construction; attach() starts its programs."""

    def __init__(
        self,
        path: Path,
        rodata: dict[str, int],
        off: frozenset[str] = frozenset(),
        uprobes: dict[str, tuple[str, str]] | None = None,
        sampled: dict[str, int] | None = None,
        usdt: dict[str, tuple[str, str, str]] | None = None,
    ) -> None:
        """off: programs neither loaded nor attached (a part of the object not asked for);
        uprobes: program -> (binary, function) for its SEC("uprobe") programs, which name
        no place of their own (libbpf finds the function's offset in the binary); sampled:
        program -> Hz for its SEC("perf_event") programs (a cpu-clock event per CPU); usdt:
        program -> (binary, provider, probe) for its SEC("usdt") programs (libbpf finds
        every site of the probe and its arguments' places, and counts its semaphore)."""
        self.path = path
        self.off = off
        self.uprobes = uprobes or {}
        self.usdt = usdt or {}
        self.sampled = sampled or {}
        self.log: list[str] = []
        self._obj: int | None = None
        self._links: list[int] = []
        symbols = _rodata_symbols(path) if rodata else {}
        if unknown := [name for name in rodata if name not in symbols]:
            raise LibbpfError(f"{path.name} has no const volatile global named {unknown[0]}")
        lib = _lib()
        _sink.log = self.log
        self._obj = lib.bpf_object__open_file(os.fsencode(path), None)
        if not self._obj:
            why = _cause(self.log) or os.strerror(ctypes.get_errno())
            raise LibbpfError(f"cannot open {path}: {why}")
        try:
            self._set_rodata(rodata, symbols)
            for name, prog in self._programs():
                if name in off and lib.bpf_program__set_autoload(prog, False):
                    raise LibbpfError(f"cannot leave program {name} of {path.name} unloaded")
            _sink.log = self.log
            err = lib.bpf_object__load(self._obj)
            if err < 0:
                failed = [m.group(1) for line in self.log if (m := _FAILED_PROG.search(line))]
                what = f"program {failed[0]} in {path.name}" if failed else path.name
                raise LibbpfError(f"{what} failed to load: {_cause(self.log) or os.strerror(-err)}")
        except BaseException:
            self.close()
            raise

    def _set_rodata(self, rodata: dict[str, int], symbols: dict[str, tuple[int, int]]) -> None:
        if not rodata:
            return
        lib = _lib()
        ro = lib.bpf_object__find_map_by_name(self._obj, b".rodata")
        size = ctypes.c_size_t()
        base = lib.bpf_map__initial_value(ro, ctypes.byref(size)) if ro else None
        if not base:
            raise LibbpfError(f"libbpf found no .rodata in {self.path.name}")
        for name, value in rodata.items():
            offset, width = symbols[name]
            bits = 8 * width
            fits = -(1 << (bits - 1)) <= value < (1 << bits)  # as signed or as unsigned
            if width not in (1, 2, 4, 8) or offset + width > size.value or not fits:
                raise LibbpfError(f"{name}={value} does not fit its {width} bytes")
            # The initial value is libbpf's copy, written into the map at load: writable until then.
            raw = (value & ((1 << bits) - 1)).to_bytes(width, sys.byteorder)
            ctypes.memmove(base + offset, raw, width)

    def _programs(self) -> Iterator[tuple[str, int]]:
        if not self._obj:
            raise LibbpfError(f"{self.path.name} is closed")
        lib = _lib()
        prog = lib.bpf_object__next_program(self._obj, None)
        while prog:
            yield lib.bpf_program__name(prog).decode(errors="replace"), prog
            prog = lib.bpf_object__next_program(self._obj, prog)

    def attach(self) -> None:
        """Attach every program (at the place its SEC() names); the links live until detach()
        or close()."""
        lib = _lib()
        self.detach()
        for name, prog in self._programs():
            if name in self.off:
                continue
            start = len(self.log)
            _sink.log = self.log
            if name in self.sampled:
                self._attach_sampled(name, prog, self.sampled[name])
                continue
            if name in self.uprobes:
                binary, function = self.uprobes[name]
                opts = _UprobeOpts(ctypes.sizeof(_UprobeOpts), 0, 0, False, function.encode())
                link = lib.bpf_program__attach_uprobe_opts(
                    prog, -1, os.fsencode(binary), 0, ctypes.byref(opts))  # fmt: skip
            elif name in self.usdt:
                binary, provider, probe = self.usdt[name]
                link = lib.bpf_program__attach_usdt(
                    prog, -1, os.fsencode(binary), provider.encode(), probe.encode(), None
                )
            else:
                link = lib.bpf_program__attach(prog)
            err = lib.libbpf_get_error(link)  # NULL and errno on failure, in libbpf 1.x
            if err or not link:
                why = _cause(self.log[start:]) or os.strerror(-err or errno.ENOENT)
                raise LibbpfError(f"cannot attach program {name} of {self.path.name}: {why}")
            self._links.append(link)

    def _attach_sampled(self, name: str, prog: int, hz: int) -> None:
        """The program on a cpu-clock event per online CPU; each link owns its event's fd."""
        try:
            fds = perfevent.open_cpu_clock(hz)
        except OSError as e:
            raise LibbpfError(f"cannot attach program {name} of {self.path.name}: {e}") from None
        lib = _lib()
        for i, fd in enumerate(fds):
            start = len(self.log)
            _sink.log = self.log
            link = lib.bpf_program__attach_perf_event(prog, fd)
            err = lib.libbpf_get_error(link)
            if err or not link:
                for left in fds[i:]:
                    os.close(left)
                why = _cause(self.log[start:]) or os.strerror(-err or errno.ENOENT)
                raise LibbpfError(f"cannot attach program {name} of {self.path.name}: {why}")
            self._links.append(link)

    def ring_buffer(self, name: str, on_record: Callable[[bytes], None]) -> RingBuffer:
        """A reader of ring buffer map `name`: each record, as bytes, to on_record."""
        if not self._obj:
            raise LibbpfError(f"{self.path.name} is closed")
        m = _lib().bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise LibbpfError(f"{self.path.name} has no map named {name}")
        return RingBuffer(_lib().bpf_map__fd(m), on_record)

    def detach(self) -> None:
        """Stop every program (destroy the links); the object, its maps and their contents
        stay, and attach() starts them again without loading (verifying) anew."""
        lib = _lib()
        for link in self._links:
            lib.bpf_link__destroy(link)
        self._links.clear()

    def _map(self, name: str) -> tuple[int, int, int, int]:
        """A map's fd, key size, value size, max entries; per-CPU maps are refused."""
        lib = _lib()
        m = lib.bpf_object__find_map_by_name(self._obj, name.encode()) if self._obj else None
        if not m:
            raise LibbpfError(f"{self.path.name} has no map named {name} (or is closed)")
        if lib.bpf_map__type(m) in _PERCPU_MAPS:
            raise LibbpfError(f"map {name} of {self.path.name} is per-CPU: not supported")
        sizes = (lib.bpf_map__key_size(m), lib.bpf_map__value_size(m), lib.bpf_map__max_entries(m))
        return (lib.bpf_map__fd(m), *sizes)

    def map_fd(self, name: str) -> int:
        return self._map(name)[0]

    def items(self, name: str) -> list[tuple[bytes, bytes]]:
        """Every (key, value) of a hash or array map, as raw bytes, each key once: in
        batches (BPF_MAP_LOOKUP_BATCH: a few system calls for the whole map; a key and a
        lookup each took two per entry, most of a 1,000-process read of the time model),
        or key by key where the kernel has no batch reads for the map."""
        fd, key_size, value_size, max_entries = self._map(name)
        batched = _batch_items(fd, key_size, value_size, max_entries)
        if isinstance(batched, list):
            return batched
        if batched != -errno.EINVAL and -batched not in _NO_BATCH:
            raise LibbpfError(f"cannot read map {name} of {self.path.name}: "
                              f"{os.strerror(-batched)}")  # fmt: skip
        lib = _lib()
        key, nxt = ctypes.create_string_buffer(key_size), ctypes.create_string_buffer(key_size)
        value = ctypes.create_string_buffer(value_size)
        # A key deleted between two calls makes get_next_key start again from the first
        # key: the dict keeps each key once, with the value read last.
        out: dict[bytes, bytes] = {}
        prev: ctypes.Array[ctypes.c_char] | None = None
        for _ in range(4 * max_entries + 16):  # a pass and a few restarts, never endless
            if (err := lib.bpf_map_get_next_key(fd, prev, nxt)) < 0:
                break
            if (err := lib.bpf_map_lookup_elem(fd, nxt, value)) == 0:
                out[nxt.raw] = value.raw
            elif err != -errno.ENOENT:  # ENOENT: deleted since get_next_key returned it
                break
            ctypes.memmove(key, nxt, key_size)
            prev = key
        else:
            err = -errno.EAGAIN  # the map kept changing under the reads
        if err != -errno.ENOENT:  # get_next_key's ENOENT: no key after the last one
            raise LibbpfError(f"cannot read map {name} of {self.path.name}: {os.strerror(-err)}")
        return list(out.items())

    def lookup(self, name: str, key: bytes) -> bytes | None:
        """One entry's value, or None when the key is absent (a task storage map's key is a
        pidfd of the task: such maps cannot be walked, only asked)."""
        fd, key_size, value_size, _ = self._map(name)
        if len(key) != key_size:
            raise LibbpfError(f"map {name} takes {key_size}-byte keys")
        value = ctypes.create_string_buffer(value_size)
        err = _lib().bpf_map_lookup_elem(fd, key, value)
        if err == -errno.ENOENT:
            return None
        if err < 0:
            raise LibbpfError(f"cannot read map {name} of {self.path.name}: {os.strerror(-err)}")
        return value.raw

    def update(self, name: str, key: bytes, value: bytes, only_new: bool = False) -> bool:
        """Set one entry (BPF_ANY: create or replace); sizes must be the map's. only_new
        (BPF_NOEXIST): create it only, False when the key has an entry already (kept)."""
        fd, key_size, value_size, _ = self._map(name)
        if (len(key), len(value)) != (key_size, value_size):
            raise LibbpfError(f"map {name} takes {key_size}-byte keys, {value_size}-byte values")
        err = _lib().bpf_map_update_elem(fd, key, value, _BPF_NOEXIST if only_new else 0)
        if only_new and err == -errno.EEXIST:
            return False
        if err < 0:
            raise LibbpfError(f"cannot update map {name} of {self.path.name}: {os.strerror(-err)}")
        return True

    def delete(self, name: str, key: bytes) -> None:
        """Delete one entry, if there is one."""
        err = _lib().bpf_map_delete_elem(self._map(name)[0], key)
        if err < 0 and err != -errno.ENOENT:
            raise LibbpfError(f"cannot delete from map {name} of {self.path.name}: "
                              f"{os.strerror(-err)}")  # fmt: skip

    def clear(self, name: str) -> None:
        """Delete every entry of a hash map (detached: nothing adds any meanwhile)."""
        for key, _ in self.items(name):
            self.delete(name, key)

    def program_fds(self) -> list[int]:
        """Each program's fd (its /proc/self/fdinfo has run_time_ns, recursion_misses...)."""
        lib = _lib()
        return [lib.bpf_program__fd(p) for name, p in self._programs() if name not in self.off]

    def close(self) -> None:
        """Detach (destroy the links) and free everything; idempotent."""
        self.detach()
        if self._obj:
            _lib().bpf_object__close(self._obj)
            self._obj = None

    def close_in_background(self) -> None:
        """close(), leaving the kernel's removal of uprobes (about 0.1 s a site here, most of
        a USDT capture's end) to a process of its own: a grandchild keeps a copy of the BPF
        descriptors alone (not pgprobe's output or its connection: a reader of pgprobe's
        output sees its end when pgprobe ends) until this process has closed its own, then
        exits, the last holder. The caller goes on at once, as it does from bpftrace, which
        it leaves to detach alone. Without a process to spare (fork refused), the removal
        is waited for here."""
        if not self._links or not (self.uprobes or self.usdt):  # the rest detach at once
            self.close()
            return
        try:
            done_r, done_w = os.pipe()
            child = os.fork()
        except OSError:
            self.close()
            return
        if child == 0:  # the child: a grandchild to hold the copies, reparented when it exits
            try:
                if os.fork() == 0:
                    _keep_only_bpf({done_r})
                    os.read(done_r, 1)  # EOF: pgprobe closed its own copies
            finally:
                os._exit(0)
        os.close(done_r)
        os.waitpid(child, 0)
        try:
            self.close()
        finally:
            os.close(done_w)

    def __enter__(self) -> BpfObject:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _keep_only_bpf(keep: set[int]) -> None:
    """Every descriptor of this process closed but BPF objects, perf events and `keep`."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the listing's own, closed since
        if fd not in keep and not target.startswith(("anon_inode:bpf", "anon_inode:[perf_")):
            with contextlib.suppress(OSError):
                os.close(fd)


class RingBuffer:
    """libbpf's ring_buffer on one map: consume() hands each record waiting to on_record."""

    def __init__(self, fd: int, on_record: Callable[[bytes], None]) -> None:
        def call(_ctx: int | None, data: int | None, size: int) -> int:
            if data:
                on_record(ctypes.string_at(data, size))
            return 0

        self._callback = _SAMPLE_FN(call)  # kept: libbpf calls it until free()
        self._rb = _lib().ring_buffer__new(fd, self._callback, None, None)
        if not self._rb:
            raise LibbpfError(f"cannot read a ring buffer: {os.strerror(ctypes.get_errno())}")

    def consume(self) -> int:
        """Every record waiting, handed over now; how many."""
        if not self._rb:
            return 0
        got = _lib().ring_buffer__consume(self._rb)
        if got < 0:
            raise LibbpfError(f"cannot read a ring buffer: {os.strerror(-got)}")
        return int(got)

    def close(self) -> None:
        if self._rb:
            _lib().ring_buffer__free(self._rb)
            self._rb = None
