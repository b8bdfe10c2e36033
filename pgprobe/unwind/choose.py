"""--unwind fp|dwarf|auto: which way a capture walks user stacks, and why.

fp: the kernel walks the frame-pointer chain (bpf/profile.bt): cheapest, and
whole stacks when the server and the libraries it works in keep frame
pointers. dwarf: perf copies the top of the user stack with each sample and
pgprobe unwinds it with .eh_frame (pgprobe.unwind.dwarf): whole stacks on
any build, at the cost of the copy (16 KiB a sample) and the unwinding.

auto decides per capture from the files mapped into the postmaster (backends
are forked from it): dwarf when the server binary or a library other than
the C runtime lacks frame pointers (pgprobe.unwind.fpcheck, the measure
`pgprobe doctor` reports) and perf is installed; fp otherwise. The C runtime
is left out: its functions on a backend's stack are system-call wrappers and
leaves (memcpy), which a frame-pointer walk passes (their caller's frame is
intact), so Debian's libc alone does not cut stacks short.
"""

from __future__ import annotations

import os
import re
import shutil

from pgprobe.symbolize import parse_maps
from pgprobe.unwind.fpcheck import lacks_frame_pointers

MODES = ("fp", "dwarf", "auto")
C_RUNTIME = re.compile(r"^(libc|libm|libpthread|libdl|librt|ld-linux[-\w]*)[.-]")


def perf_binary() -> str | None:
    return shutil.which("perf")


def files_without_frame_pointers(binary: str, pid: int, proc: str = "/proc") -> list[str]:
    """The server binary and the libraries mapped in pid that lack frame pointers."""
    paths = [binary]
    try:
        with open(f"{proc}/{pid}/maps") as f:
            mappings = parse_maps(f.read())
    except OSError:
        mappings = []
    for m in mappings:
        runtime = C_RUNTIME.match(os.path.basename(m.path))
        if m.kind == "file" and "x" in m.perms and m.path not in paths and not runtime:
            paths.append(m.path)
    return [os.path.basename(p) for p in paths if lacks_frame_pointers(p)]


def choose(mode: str, binary: str, postmaster: int) -> tuple[str, str]:
    """(fp or dwarf, why): the mode for this capture, and a line saying why."""
    if mode == "fp":
        return "fp", "frame pointers (--unwind fp)"
    have_perf = perf_binary() is not None
    if mode == "dwarf":
        return "dwarf", "DWARF .eh_frame over perf's stack copies (--unwind dwarf)"
    missing = files_without_frame_pointers(binary, postmaster)
    if not missing:
        return "fp", "frame pointers: the server and its libraries keep them"
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    if not have_perf:
        return "fp", (
            f"frame pointers, though {shown} lack them (stacks through them are cut short): "
            "install perf (Debian: linux-perf) for --unwind dwarf"
        )
    return "dwarf", f"DWARF .eh_frame over perf's stack copies: {shown} lack frame pointers"
