"""Unwind a copied user stack: .eh_frame rules where there are, frame pointers where not.

``Unwinder(symbolizer).unwind(pid, regs, stack)`` walks from the sampled
registers up through the bytes perf copied from the stack (16 KiB by
default), using the CFI of each function (pgprobe.unwind.cfi) and, for code
without CFI (PostgreSQL's LLVM JIT code, which keeps frame pointers), the
frame-pointer chain. It returns the return addresses, innermost first, and
why the walk stopped when it did not reach the outermost frame (the frame
whose return address is undefined: ``_start``): that reason becomes the
stack's ``[truncated: ...]`` frame.

Mappings and ELF images come from the Symbolizer's /proc snapshots, so
backends that exited during the capture unwind like the others.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pgprobe.symbolize import Symbolizer
from pgprobe.unwind.cfi import RBP, RSP, CfiError, Rule, eval_expression, rule_at

RIP = 16
MAX_FRAMES = 256
CALLEE_SAVED = (3, 6, 12, 13, 14, 15)  # rbx, rbp, r12-r15: kept across calls


@dataclass(frozen=True, slots=True)
class Walk:
    addrs: tuple[int, ...]  # innermost first
    stop: str  # "" when the walk reached the outermost frame, else why it stopped


class Unwinder:
    def __init__(self, symbolizer: Symbolizer) -> None:
        self.symbolizer = symbolizer
        self._rules: dict[tuple[int, int, bool], Rule | None | str] = {}
        self.frames_by_cfi = 0
        self.frames_by_fp = 0

    def _rule(self, pid: int, pc: int, first: bool) -> tuple[Rule | None | str, str]:
        """(rule, module): the CFI rule at pc; None: no CFI there; str: why it failed."""
        m, img, vaddr = self.symbolizer.code_at(pid, pc)
        if m is None:
            return "address outside every mapping", ""
        if img is None:
            return None, m.module if m.kind == "file" else ("[jit]" if "x" in m.perms else m.kind)
        key = (id(img), vaddr, first)
        if key not in self._rules:
            try:
                self._rules[key] = rule_at(img.eh_frame, vaddr, vaddr if first else vaddr - 1)
            except CfiError as exc:
                self._rules[key] = f"unreadable unwind information in {img.module} ({exc})"
        return self._rules[key], img.module

    def unwind(self, pid: int, regs: dict[int, int], stack: bytes) -> Walk:
        if RIP not in regs or RSP not in regs:
            return Walk((), "no user registers in the sample")
        base = regs[RSP]
        top = base + len(stack) - 8

        def read(addr: int) -> int | None:
            if base <= addr <= top:
                return int(struct.unpack_from("<Q", stack, addr - base)[0])
            return None

        regs = dict(regs)
        pc = regs[RIP]
        out: list[int] = []
        first = True
        while len(out) < MAX_FRAMES:
            # A return address may point past the end of its function (a call
            # to a noreturn function is the last instruction): name the call.
            out.append(pc if first else pc - 1)
            rule, module = self._rule(pid, pc, first)
            if isinstance(rule, str):
                return Walk(tuple(out), rule)
            new: dict[int, int] = {r: regs[r] for r in CALLEE_SAVED if r in regs}
            if rule is not None:
                if rule.cfa_reg < 0:
                    cfa = eval_expression(rule.cfa_expression, {**regs, RIP: pc})
                else:
                    reg = regs.get(rule.cfa_reg)
                    cfa = None if reg is None else reg + rule.cfa_offset
                if cfa is None:
                    return Walk(tuple(out), f"lost a register in {module}")
                if rule.ra_offset is None:
                    return Walk(tuple(out), "")  # the outermost frame: whole stack
                ra = read(cfa + rule.ra_offset)
                for r, off in rule.saved:
                    value = read(cfa + off)
                    if value is not None:
                        new[r] = value
                self.frames_by_cfi += 1
            else:
                # No CFI (JIT code): the frame-pointer chain, if it points into the copy.
                bp = regs.get(RBP)
                ra = read(bp + 8) if bp is not None else None
                saved_bp = read(bp) if bp is not None else None
                if ra is None or saved_bp is None or bp is None:
                    return Walk(tuple(out), f"no unwind information in {module}")
                cfa = bp + 16
                new[RBP] = saved_bp
                self.frames_by_fp += 1
            if ra is None:
                return Walk(tuple(out), f"stack deeper than the {len(stack):,} bytes copied")
            if ra == 0:
                return Walk(tuple(out), "")
            if cfa <= regs[RSP]:
                return Walk(tuple(out), f"a frame that does not grow the stack in {module}")
            new[RSP] = cfa
            regs = new
            pc = ra
            first = False
        return Walk(tuple(out), f"more than {MAX_FRAMES} frames")
