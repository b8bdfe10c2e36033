"""Named frames, how they fold, and resolution statistics per module."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

KERNEL_SUFFIX = "_[k]"
KERNEL_MODULE = "[kernel.kallsyms]"
UNKNOWN = "[unknown]"


@dataclass(frozen=True, slots=True)
class Frame:
    """One named stack frame."""

    name: str
    module: str
    resolved: bool
    offset: int = 0

    @property
    def label(self) -> str:
        """``name+0xoffset`` (just ``name`` at offset 0): for display."""
        return f"{self.name}+0x{self.offset:x}" if self.offset else self.name

    @property
    def folded(self) -> str:
        """The frame as one FlameGraph frame: the name, without offset."""
        return self.name


def folded_names(frames: Iterable[Frame], main: str | None = None) -> list[str]:
    """Frame names for folding (pgprobe.stacks.fold), in the same order.

    With ``main`` (the server binary's module name, "postgres"), a named
    frame of any other user module is written ``module`name``
    (``libc.so.6`__libc_pwrite``, DTrace's convention, which pgprobe's
    flame graph colours by module); kernel frames (``_[k]``) and unresolved
    labels (``libc.so.6+0x1234``, ``[anon]``) already say where they are.
    """
    if main is None:
        return [f.name for f in frames]
    return [
        f"{f.module}`{f.name}"
        if f.resolved and f.module != main and not f.name.endswith(KERNEL_SUFFIX)
        else f.name
        for f in frames
    ]


@dataclass
class ModuleStats:
    """How many frames of one module got a name (weighted by samples)."""

    module: str
    resolved: int = 0
    unresolved: int = 0
    path: str = ""
    symbols: str = ""  # "symtab", "dynsym", "debug file <path>", "kallsyms", "none"
    build_id: str = ""

    @property
    def total(self) -> int:
        return self.resolved + self.unresolved

    @property
    def unresolved_pct(self) -> float:
        return 100.0 * self.unresolved / self.total if self.total else 0.0


@dataclass
class SymbolStats:
    """Resolution statistics over every frame symbolized so far."""

    modules: dict[str, ModuleStats] = field(default_factory=dict)
    unreadable_pids: set[int] = field(default_factory=set)  # maps could not be read
    fallback_pids: set[int] = field(default_factory=set)  # used the fallback's maps
    unknown_pids: set[int] = field(default_factory=set)  # no maps at all
    # Files refused as untrusted (pgprobe.safefile): path -> why; their frames are unnamed.
    skipped_files: dict[str, str] = field(default_factory=dict)

    @property
    def resolved(self) -> int:
        return sum(m.resolved for m in self.modules.values())

    @property
    def unresolved(self) -> int:
        return sum(m.unresolved for m in self.modules.values())

    def warnings(self, min_pct: float = 5.0) -> list[str]:
        """One line per module with at least min_pct % of its frames unresolved."""
        out: list[str] = []
        for m in sorted(self.modules.values(), key=lambda m: -m.unresolved):
            if not m.unresolved or m.unresolved_pct < min_pct:
                continue
            line = f"{m.unresolved_pct:.0f} % of frames unresolved in {m.module}"
            if m.path and m.symbols in ("dynsym", "none"):
                what = "only .dynsym" if m.symbols == "dynsym" else "no symbols"
                line += f" ({m.path}: {what}, no debug file; install its debug symbols"
                line += f", build-id {m.build_id})" if m.build_id else ")"
            out.append(line)
        skipped = skipped_warning(self.skipped_files)
        if skipped:
            out.append(skipped)
        return out


def skipped_warning(skipped_files: dict[str, str]) -> str | None:
    """One line for the files refused as untrusted (path -> why), or None when none was."""
    if not skipped_files:
        return None
    reasons = sorted(set(skipped_files.values()))
    shown = "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "")
    return (
        f"skipped {len(skipped_files)} file(s) that others can write, for frame names: "
        f"{shown} (their frames are shown unnamed)"
    )


# --------------------------------------------------------------------------
# /proc/PID/maps
