"""Stack maps of a capture (bpftrace, perf or DTrace) named into a Profile."""

from __future__ import annotations

import os
from collections.abc import Callable

from pgprobe.discover import Backend, Targets
from pgprobe.engines.base import (
    AggValue,
    KeyValue,
    NamedStack,
    RunInfo,
    Snapshot,
)
from pgprobe.symbolize import KERNEL_SUFFIX, Frame, Symbolizer
from pgprobe.tools.profiling.result import Profile, StackCount
from pgprobe.unwind import truncation
from pgprobe.unwind.fpcheck import lacks_frame_pointers


def name_stacks(
    targets: Targets,
    info: RunInfo,
    snapshot: Snapshot,
    symbolizer: Symbolizer,
    hz: int,
    kernel: bool,
    backends: dict[int, Backend] | None = None,
    stops: dict[tuple[int, tuple[int, ...]], str] | None = None,
) -> Profile:
    """Name the stack maps of a capture's snapshot into a Profile of the targets.

    Raw addresses (bpftrace, perf) are named by the symbolizer; stacks the
    tracer named itself (DTrace: NamedStack) are taken as they are. A user
    stack that stops short of its root ends in a ``[truncated: why]`` frame:
    ``stops`` gives the reasons of a DWARF walk (pgprobe.unwind.capture);
    without it (frame pointers) pgprobe.unwind.truncation judges the stack.
    """
    wanted = None if targets.whole_cluster else set(targets.pids)
    own = targets.cluster.own_pid
    module = os.path.basename(targets.cluster.binary)
    stored = stackless = 0
    frames_named = {True: 0, False: 0}
    server_named = {True: 0, False: 0}
    unnamed_in_file: dict[str, int] = {}  # module -> frames shown as module+0x...
    out: list[StackCount] = []
    truncated: dict[str, int] = {}
    lacks_fp = _module_lacks_fp(symbolizer)
    for (pid, kstack, ustack, query), value in _keys(snapshot):
        assert isinstance(pid, int) and isinstance(value, int)
        stored += value
        if pid == own or (wanted is not None and pid not in wanted):
            continue
        user = _frames(symbolizer, pid, ustack, value, kernel=False)
        if not user:
            stackless += value
        reason: str | None = None
        if stops is not None:
            reason = stops.get((pid, ustack)) if isinstance(ustack, tuple) else None
            if reason is not None:
                user.append(truncation.truncated_frame(reason))
        elif isinstance(ustack, tuple) and user:
            user, reason = truncation.cut_fp_stack(user, lacks_fp)
        if reason is not None:
            truncated[reason] = truncated.get(reason, 0) + value
        frames = _frames(symbolizer, pid, kstack, value, kernel=True) + user
        for f in frames:
            if truncation.is_truncation(f):
                continue
            frames_named[f.resolved] += value
            if not f.resolved and f.module and not f.module.startswith("["):
                unnamed_in_file[f.module] = unnamed_in_file.get(f.module, 0) + value
            if f.module == module:
                server_named[f.resolved] += value
        out.append(StackCount(pid, tuple(frames), value, query))
    taken = snapshot.get("samples").get((), 0)
    assert isinstance(taken, int)
    modules = symbolizer.stats.modules
    server = modules.get(module)
    server_frames = server_named[True] + server_named[False]
    return Profile(
        targets=targets,
        info=info,
        snapshot=snapshot,
        hz=hz,
        kernel=kernel,
        stacks=out,
        samples_taken=taken,
        samples_stored=stored,
        samples_without_stack=stackless,
        resolved_frames=frames_named[True],
        unresolved_frames=frames_named[False],
        server_module=module,
        server_unresolved_pct=100.0 * server_named[False] / server_frames if server_frames else 0.0,
        server_symbols=server.symbols if server else "",
        backends=dict(backends or {}),
        truncated=truncated,
        stripped_frames={
            m: n
            for m, n in unnamed_in_file.items()
            if m in modules and modules[m].path and modules[m].symbols in ("dynsym", "none")
        },  # fmt: skip
        stripped_paths={m: modules[m].path for m in unnamed_in_file if m in modules},
        skipped_files=symbolizer.stats.skipped_files,
    )


Query = tuple[int, int] | None


def _keys(snapshot: Snapshot) -> list[tuple[tuple[KeyValue, KeyValue, KeyValue, Query], AggValue]]:
    """Every map's keys as (pid, kernel stack, user stack, (state, query id) or None)."""
    out: list[tuple[tuple[KeyValue, KeyValue, KeyValue, Query], AggValue]] = []
    for k, v in snapshot.get("stacks").items():
        out.append(((k[0], (), k[1], None), v))
    for k, v in snapshot.get("kstacks").items():
        out.append(((k[0], k[1], k[2], None), v))
    for k, v in snapshot.get("qstacks").items():
        out.append(((k[0], (), k[3], _query(k[1], k[2])), v))
    for k, v in snapshot.get("qkstacks").items():
        out.append(((k[0], k[3], k[4], _query(k[1], k[2])), v))
    return out


def _query(state: KeyValue, query_id: KeyValue) -> Query:
    assert isinstance(state, int) and isinstance(query_id, int)
    return (state, query_id)


def _module_lacks_fp(symbolizer: Symbolizer) -> Callable[[str], bool]:
    """Whether a module (basename) of the capture lacks frame pointers, by its path."""
    paths: dict[str, str] = {}

    def lacks(module: str) -> bool:
        if module not in paths:  # modules appear as stacks are named: look again
            paths.update({m: s.path for m, s in symbolizer.stats.modules.items()})
            paths.setdefault(module, "")
        path = paths[module]
        return bool(path) and lacks_frame_pointers(path)

    return lacks


def _frames(
    symbolizer: Symbolizer, pid: int, stack: KeyValue, weight: int, kernel: bool
) -> list[Frame]:
    """One stack field as Frames, innermost first."""
    if isinstance(stack, NamedStack):
        return stack.symbolized(kernel=kernel)
    assert isinstance(stack, tuple)
    if not stack:
        return []
    if kernel:
        return symbolizer.kernel_frames(stack, weight)
    return symbolizer.user_frames(pid, stack, weight)


def plain_name(frame: Frame) -> str:
    """A frame's function name for a table: kernel frames without FlameGraph's _[k]."""
    return frame.name.removesuffix(KERNEL_SUFFIX)
