"""A named CPU profile: stacks per pid, losses, cut stacks, and how they are told."""

from __future__ import annotations

import functools
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any

from pgprobe.discover import Backend, Targets
from pgprobe.engines.base import (
    RunInfo,
    Snapshot,
)
from pgprobe.stacks import fold
from pgprobe.symbolize import UNKNOWN, Frame, folded_names
from pgprobe.symbolize.frames import skipped_warning
from pgprobe.tools import common
from pgprobe.tools.bystatement import Part
from pgprobe.tools.profiling.options import UNRESOLVED_WARN_PCT

UNKNOWN_FRAME = Frame(UNKNOWN, UNKNOWN, False)  # the leaf of an empty stack
STRIPPED_MIN_PCT = 1.0  # a stripped file with fewer of all frames is not worth a package


# -- the result ----------------------------------------------------------------------------


@dataclass(frozen=True)
class StackCount:
    """One distinct stack of one process, and how many samples saw it."""

    pid: int
    frames: tuple[Frame, ...]  # innermost first: kernel frames, then user frames
    count: int
    query: tuple[int, int] | None = None  # (st_state, st_query_id) at the samples, if read


@dataclass
class Profile:
    """What a capture saw of the targets, named."""

    targets: Targets
    info: RunInfo
    snapshot: Snapshot
    hz: int
    kernel: bool
    stacks: list[StackCount]
    samples_taken: int  # @samples: every sample of every process the script watched
    samples_stored: int  # the sum of the stack maps' counts, same processes
    samples_without_stack: int  # of the targets: no user stack (refused, or exiting)
    resolved_frames: int
    unresolved_frames: int
    server_module: str  # "postgres"
    server_unresolved_pct: float
    server_symbols: str  # "symtab", "dynsym", "debug file ...", "none"
    backends: dict[int, Backend] = field(default_factory=dict)  # seen during the capture
    unwind: str = "fp"  # how user stacks were walked: fp or dwarf
    unwind_reason: str = ""  # why (auto's choice)
    truncated: dict[str, int] = field(default_factory=dict)  # samples cut short, per reason
    bytes_per_sample: int = 0  # dwarf: perf.data bytes per sample
    unwind_cpu_s: float = 0.0  # dwarf: CPU seconds to read and unwind the samples
    perf_stop_s: float = 0.0  # dwarf: wall seconds perf record took to stop
    perf_cpu_s: float = 0.0  # dwarf: CPU seconds of perf record
    perf_data_bytes: int = 0  # dwarf: size of perf.data (every process's samples with -a)
    perf_samples_recorded: int = 0  # dwarf: samples in perf.data, of every process
    # Frames shown as module+0x... in files without .symtab or debug file, per module
    # (static functions of stripped files: only their debug symbols name them), and paths.
    stripped_frames: dict[str, int] = field(default_factory=dict)
    stripped_paths: dict[str, str] = field(default_factory=dict)
    # Files refused as untrusted for names (a perf map that is a FIFO, ...): path -> why.
    skipped_files: dict[str, str] = field(default_factory=dict)
    # --by query: each (state, id) key's part (profiling.statements), and its name.
    parts: dict[tuple[int, int], Part] = field(default_factory=dict)
    part_names: dict[tuple[int, int], str] = field(default_factory=dict)

    @property
    def truncated_samples(self) -> int:
        return sum(self.truncated.values())

    @property
    def samples(self) -> int:
        """Samples of the targets."""
        return sum(s.count for s in self.stacks)

    @property
    def lost_samples(self) -> int:
        return max(self.samples_taken - self.samples_stored, self.info.failed_map_updates, 0)

    @property
    def pids(self) -> list[int]:
        """The processes that were sampled at least once."""
        return sorted({s.pid for s in self.stacks})

    @property
    def unresolved_pct(self) -> float:
        total = self.resolved_frames + self.unresolved_frames
        return 100.0 * self.unresolved_frames / total if total else 0.0

    def stripped_pct(self) -> dict[str, float]:
        """{module: % of all frames that are its unnamed static functions}, largest first."""
        total = self.resolved_frames + self.unresolved_frames
        if not total:
            return {}
        ranked = sorted(self.stripped_frames.items(), key=lambda kv: -kv[1])
        # Files with a handful of such frames (libLLVM during a JIT compile) are left out.
        return {m: 100.0 * n / total for m, n in ranked if n >= STRIPPED_MIN_PCT / 100 * total}

    def describe(self, pid: int) -> Backend:
        """pg_stat_activity's row, else what /proc said while the capture ran."""
        found = self.targets.cluster.backend(pid)
        if found is not None:
            return found
        return self.backends.get(pid) or self.targets.describe(pid)

    def backend_frame(self, pid: int) -> str:
        """The root frame of one backend's stacks: 'pid 4242: client backend (pgbench)'."""
        b = self.describe(pid)
        kind = b.backend_type or "postgres"
        if pid == self.targets.cluster.postmaster_pid:
            kind = "postmaster"
        app = f" ({b.application_name})" if b.application_name else ""
        return f"pid {pid}: {kind}{app}"

    def frame_names(self, stack: StackCount) -> list[str]:
        """The folded names of a stack's frames, innermost first."""
        return folded_names(stack.frames, main=self.server_module)

    def part_frame(self, stack: StackCount) -> str:
        """The root frame of a statement's stacks: 'query 123: UPDATE ...' (--by query)."""
        return self.part_names.get(stack.query or (0, 0), "(statement not read)")

    def folded(self, per_backend: bool = False, per_query: bool = False) -> dict[str, int]:
        """FlameGraph folded stacks {"root;...;leaf": samples}."""
        out: dict[str, int] = {}
        for s in self.stacks:
            names = self.frame_names(s) or [UNKNOWN]  # no user stack (e.g. while exiting)
            if per_backend:
                names.append(self.backend_frame(s.pid))
            if per_query:
                names.append(self.part_frame(s))
            key = fold(names)
            out[key] = out.get(key, 0) + s.count
        return out

    def folded_by_part(self) -> dict[str, dict[str, int]]:
        """Folded stacks per statement (--by query), the part with most samples first."""
        out: dict[str, dict[str, int]] = {}
        for s in self.stacks:
            per = out.setdefault(self.part_frame(s), {})
            key = fold(self.frame_names(s))
            per[key] = per.get(key, 0) + s.count
        return dict(sorted(out.items(), key=lambda kv: (-sum(kv[1].values()), kv[0])))

    def folded_by_pid(self) -> dict[int, dict[str, int]]:
        out: dict[int, dict[str, int]] = {}
        for s in self.stacks:
            per = out.setdefault(s.pid, {})
            key = fold(self.frame_names(s))
            per[key] = per.get(key, 0) + s.count
        return out

    def facts(self) -> dict[str, str]:
        """The capture facts, for a flame graph's subtitle."""
        pids = self.targets.pids
        if self.targets.whole_cluster:
            who = f"cluster of postmaster {self.targets.cluster.postmaster_pid}"
        elif len(pids) <= 6:
            who = ", ".join(str(p) for p in pids)
        else:
            who = f"{len(pids)} backends"
        facts = {
            "duration": f"{self.info.duration_seconds:.1f} s",
            "Hz": str(self.hz),
            "pids": who,
            "samples": f"{self.samples:,}",
            "lost": f"{self.lost_samples:,}",
            "unresolved frames": f"{self.unresolved_pct:.1f} %",
            "unwind": self.unwind,
        }
        if self.truncated_samples:
            facts["cut stacks"] = f"{self.truncated_samples:,} ({self._truncated_pct():.1f} %)"
        if self.info.interrupted:
            facts["duration"] += " (interrupted)"
        return facts

    def meta(self, **extra: Any) -> dict[str, Any]:
        data = common.meta(
            self.targets,
            self.info,
            self.snapshot,
            hz=self.hz,
            kernel_stacks=self.kernel,
            samples=self.samples,
            samples_taken=self.samples_taken,
            lost_samples=self.lost_samples,
            samples_without_stack=self.samples_without_stack,
            sampled_pids=self.pids,
            unresolved_frames_pct=round(self.unresolved_pct, 2),
            server_unresolved_frames_pct=round(self.server_unresolved_pct, 2),
            server_symbols=self.server_symbols,
            unwind=self.unwind,
            unwind_reason=self.unwind_reason,
            truncated_samples=self.truncated_samples,
            truncated_reasons=dict(sorted(self.truncated.items(), key=lambda kv: -kv[1])),
            bytes_per_sample=self.bytes_per_sample if self.unwind == "dwarf" else None,
            unwind_cpu_s=round(self.unwind_cpu_s, 3) if self.unwind == "dwarf" else None,
            perf_stop_s=round(self.perf_stop_s, 3) if self.unwind == "dwarf" else None,
            perf_cpu_s=round(self.perf_cpu_s, 3) if self.unwind == "dwarf" else None,
            perf_data_bytes=self.perf_data_bytes if self.unwind == "dwarf" else None,
            perf_samples_recorded=self.perf_samples_recorded if self.unwind == "dwarf" else None,
            stripped_frames_pct={m: round(v, 2) for m, v in self.stripped_pct().items()},
            debug_packages=debug_packages(self),
        )
        data.update(extra)
        return data

    def warnings(self) -> list[str]:
        """Losses and missing symbols, one line each (without the 'pgprobe: ' prefix)."""
        out: list[str] = []
        if self.lost_samples and self.unwind == "dwarf":
            out.append(
                f"perf lost {self.lost_samples:,} samples (its buffer was full), counted over "
                f"every process it recorded: at most that many of the {self.samples:,} of the "
                "targets; shorten the capture or lower -F"
            )
        elif self.lost_samples:
            out.append(
                f"{self.lost_samples:,} of {self.samples_taken:,} samples lost "
                "(the stack map was full): shorten the capture or lower -F"
            )
        if self.samples_without_stack:
            out.append(
                f"{self.samples_without_stack:,} of {self.samples:,} samples have no user "
                "stack (shown as [unknown]): the kernel's stack map refused it (a hash "
                "collision) or the process was exiting"
            )
        if self.truncated_samples:
            out.append(truncation_warning(self))
        if sum(self.stripped_pct().values()) >= UNRESOLVED_WARN_PCT:
            out.append(stripped_warning(self))
        elif self.server_unresolved_pct >= UNRESOLVED_WARN_PCT:
            out.append(unresolved_warning(self))
        skipped = skipped_warning(self.skipped_files)
        if skipped:
            out.append(skipped)
        return out

    def _truncated_pct(self) -> float:
        return 100.0 * self.truncated_samples / self.samples if self.samples else 0.0


def truncation_warning(profile: Profile) -> str:
    """One line: how many stacks stop short of main, why, and what gives whole ones."""
    reasons = sorted(profile.truncated.items(), key=lambda kv: -kv[1])
    why = "; ".join(f"{reason} ({n:,})" for reason, n in reasons[:3])
    more = f"; {len(reasons) - 3} more reasons" if len(reasons) > 3 else ""
    line = (
        f"{profile.truncated_samples:,} of {profile.samples:,} samples "
        f"({profile._truncated_pct():.0f} %) have a stack cut short, ending in "
        f"[truncated: ...]: {why}{more}"
    )
    if profile.unwind == "fp":
        line += "; --unwind dwarf walks them whole"
    return line


def unresolved_warning(profile: Profile) -> str:
    """One line: how many server frames have no name, and the package that fixes it."""
    binary = profile.targets.cluster.binary
    line = (
        f"{profile.server_unresolved_pct:.0f} % of the frames in {profile.server_module} "
        f"are unresolved (shown as {profile.server_module}+0x...)"
    )
    if profile.server_symbols not in ("dynsym", "none"):
        return line
    package = owning_package(binary)
    fix = (
        f"install {package}-dbgsym (Debian: from the debian-debug archive, "
        "see https://wiki.debian.org/HowToGetABacktrace)"
        if package
        else "install the server's debug-symbol package (postgresql-NN-dbgsym on "
        "Debian/Ubuntu, postgresqlNN-server-debuginfo on RHEL)"
    )
    return f"{line}: {binary} is stripped and has no debug file; {fix}"


def debug_packages(profile: Profile) -> list[str]:
    """The dpkg debug-symbol packages (``-dbgsym``) that name the stripped files' frames."""
    out: list[str] = []
    for module in profile.stripped_pct():
        package = owning_package(profile.stripped_paths.get(module, ""))
        if package and f"{package}-dbgsym" not in out:
            out.append(f"{package}-dbgsym")
    return out


def stripped_warning(profile: Profile) -> str:
    """One line: the share of frames in static functions of stripped files, and the fix."""
    shares = profile.stripped_pct()
    parts = ", ".join(f"{m} {v:.0f} %" for m, v in shares.items())
    packages = debug_packages(profile)
    fix = (
        f"install {', '.join(packages)} (Debian: from the debian-debug archive, "
        "see https://wiki.debian.org/HowToGetABacktrace) to name them"
        if packages
        else "install their debug symbols (a .debug file under /usr/lib/debug/.build-id, "
        "or in the debuginfod cache) to name them"
    )
    return (
        f"{sum(shares.values()):.0f} % of frames are static functions of stripped files, "
        f"shown as module+0x... ({parts}): {fix}"
    )


@functools.lru_cache(maxsize=64)  # dpkg -S takes ~0.1 s; meta and warnings ask twice
def owning_package(path: str) -> str | None:
    """The dpkg package that installed path, e.g. 'postgresql-15' (None: not dpkg's)."""
    if not path:
        return None
    try:
        done = subprocess.run(
            ["dpkg", "-S", os.path.realpath(path)], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or ":" not in done.stdout:
        return None
    package = done.stdout.splitlines()[0].split(":", 1)[0].split(",")[0].strip()
    return package or None
