"""Stacks that stop short of their root, said as such: ``[truncated: why]``.

A whole user stack of a PostgreSQL process ends (outermost) in ``_start`` /
``main`` / ``__libc_start_call_main`` (``start_thread`` / ``clone3`` for a
thread). A frame-pointer walk that meets a function built without frame
pointers goes astray: it skips callers, or runs into addresses that are no
code. ``cut_fp_stack`` keeps the frames up to the innermost frame of a file
without frame pointers (those above it are guesses), and ends the stack in
``[truncated: no frame pointer in libcrypto.so.3]``; a DWARF walk reports
its own reason (pgprobe.unwind.dwarf.Walk.stop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pgprobe.symbolize import UNKNOWN, Frame

ROOTS = frozenset(
    {"_start", "main", "__libc_start_call_main", "__libc_start_main", "__libc_start_main_impl",
     "start_thread", "clone", "clone3", "__clone", "__clone3"}
)  # fmt: skip
MODULE = "[truncated]"
FP_MAX_FRAMES = 127  # kernel.perf_event_max_stack: the kernel's walk stops there


def truncated_frame(reason: str) -> Frame:
    return Frame(f"[truncated: {reason}]", MODULE, False)


def is_truncation(frame: Frame) -> bool:
    return frame.module == MODULE


def is_whole(frames: Sequence[Frame]) -> bool:
    """True when the outermost frame is a process's or thread's first function."""
    return bool(frames) and frames[-1].name in ROOTS


def cut_fp_stack(
    frames: list[Frame], lacks_fp: Callable[[str], bool]
) -> tuple[list[Frame], str | None]:
    """(frames to keep + a [truncated] frame, reason), or (frames, None) when whole.

    frames: user frames of a frame-pointer walk, innermost first; lacks_fp:
    whether a module (basename) was built without frame pointers.
    """
    if not frames or is_whole(frames) or frames == [Frame(UNKNOWN, UNKNOWN, False)]:
        return frames, None
    for i, f in enumerate(frames):
        if f.module and not f.module.startswith("[") and lacks_fp(f.module):
            reason = f"no frame pointer in {f.module}"
            return [*frames[: i + 1], truncated_frame(reason)], reason
    if len(frames) >= FP_MAX_FRAMES:
        reason = f"deeper than {FP_MAX_FRAMES} frames"
    else:
        reason = f"frame-pointer walk stopped in {frames[-1].module}"
    return [*frames, truncated_frame(reason)], reason
