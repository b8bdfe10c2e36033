"""Unwind a copied user stack: .eh_frame rules where there are, frame pointers where not.

``Unwinder(symbolizer).unwind(pid, regs, stack)`` walks from the sampled
registers up through the bytes perf copied from the stack (16 KiB by
default), using the CFI of each function (pgprobe.unwind.cfi) and, for code
without CFI (PostgreSQL's LLVM JIT code, which keeps frame pointers), the
frame-pointer chain. It returns the return addresses, innermost first, and
why the walk stopped when it did not reach the outermost frame (the frame
whose return address is undefined: ``_start``): that reason becomes the
stack's ``[truncated: ...]`` frame.

Code with neither CFI nor a frame-pointer chain (PostgreSQL's LLVM JIT code
on Debian 15 keeps data in rbp) is stepped over by scanning the stack above
it for the first word that is a return address into a function with CFI
(an address just after a call site, inside a function .eh_frame describes,
and whose own frame unwinds to another such address); the caller's rbp is
taken from the slot below it when that points further up the stack (where
a prologue's ``push %rbp`` puts it). Frames found so are counted
(``frames_by_scan``): a heuristic, as in perf's and gdb's fallbacks.

Mappings and ELF images come from the Symbolizer's /proc snapshots, so
backends that exited during the capture unwind like the others; a pid whose
walk meets an address outside its snapshot has its maps read again, once
(code mapped after the snapshot: the first JIT compile of a backend).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from pgprobe.symbolize import Symbolizer
from pgprobe.unwind.cfi import RBP, RSP, CfiError, Rule, eval_expression, rule_at

RIP = 16
MAX_FRAMES = 256
CALLEE_SAVED = (3, 6, 12, 13, 14, 15)  # rbx, rbp, r12-r15: kept across calls
SCAN_BYTES = 4096  # how far above code without unwind information to look for its caller


@dataclass(frozen=True, slots=True)
class Walk:
    addrs: tuple[int, ...]  # innermost first
    stop: str  # "" when the walk reached the outermost frame, else why it stopped


class Unwinder:
    def __init__(self, symbolizer: Symbolizer) -> None:
        self.symbolizer = symbolizer
        self._rules: dict[tuple[int, int, bool], Rule | None | str] = {}
        self._refreshed: set[int] = set()  # pids whose maps were read again for a miss
        self.frames_by_cfi = 0
        self.frames_by_fp = 0
        self.frames_by_scan = 0

    def _rule(self, pid: int, pc: int, first: bool) -> tuple[Rule | None | str, str]:
        """(rule, module): the CFI rule at pc; None: no CFI there; str: why it failed."""
        m, img, vaddr = self.symbolizer.code_at(pid, pc)
        if m is None and pid not in self._refreshed:
            # Mapped after the capture's snapshot (a backend's first JIT compile loads
            # llvmjit.so and libLLVM, then maps the code): read its maps again, once.
            self._refreshed.add(pid)
            if self.symbolizer.snapshot(pid):
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
                    cfa = eval_expression(rule.cfa_expression, {**regs, RIP: pc}, read)
                else:
                    reg = regs.get(rule.cfa_reg)
                    cfa = None if reg is None else reg + rule.cfa_offset
                if cfa is None:
                    return Walk(tuple(out), f"lost a register in {module}")
                by_expression = dict(rule.expressions)
                if rule.ra_offset is None and RIP not in by_expression:
                    return Walk(tuple(out), "")  # the outermost frame: whole stack
                ra = read(cfa + rule.ra_offset) if rule.ra_offset is not None else None
                for r, off in rule.saved:
                    value = read(cfa + off)
                    if value is not None:
                        new[r] = value
                for r, expr in by_expression.items():  # a signal frame: from the ucontext
                    slot = eval_expression(expr, {**regs, RIP: pc}, read, (cfa,))
                    value = read(slot) if slot is not None else None
                    if r == RIP:
                        ra = value
                    elif value is not None:
                        new[r] = value
                self.frames_by_cfi += 1
            else:
                # No CFI (JIT code): the frame-pointer chain if it leads to code, else a scan.
                bp = regs.get(RBP)
                ra = read(bp + 8) if bp is not None else None
                saved_bp = read(bp) if bp is not None else None
                if (
                    bp is not None
                    and ra is not None
                    and saved_bp is not None
                    and (self._is_return_address(pid, ra) or self._in_generated_code(pid, ra))
                ):
                    cfa = bp + 16
                    new[RBP] = saved_bp
                    self.frames_by_fp += 1
                else:
                    found = self._scan(pid, regs, read, top)
                    if found is None:
                        return Walk(tuple(out), f"no unwind information in {module}")
                    ra, cfa, new = found
                    self.frames_by_scan += 1
            if ra is None:
                return Walk(tuple(out), f"stack deeper than the {len(stack):,} bytes copied")
            if ra == 0:
                return Walk(tuple(out), "")
            if cfa <= regs[RSP] and ra != 0:
                return Walk(tuple(out), f"a frame that does not grow the stack in {module}")
            new[RSP] = cfa
            regs = new
            pc = ra
            first = False
        return Walk(tuple(out), f"more than {MAX_FRAMES} frames")

    def _is_return_address(self, pid: int, addr: int) -> bool:
        """addr follows a call inside a function that .eh_frame describes (not its start)."""
        _, img, vaddr = self.symbolizer.code_at(pid, addr)
        if img is None:
            return False
        i = img.eh_frame.find(vaddr - 1)
        return i is not None and vaddr != img.eh_frame.starts[i]

    def _in_generated_code(self, pid: int, addr: int) -> bool:
        m, img, _ = self.symbolizer.code_at(pid, addr)
        return m is not None and img is None and m.kind == "[anon]" and "x" in m.perms

    def _scan(
        self, pid: int, regs: dict[int, int], read: Callable[[int], int | None], top: int
    ) -> tuple[int, int, dict[int, int]] | None:
        """(return address, CFA, caller's registers) of code without unwind information."""
        sp = regs[RSP]
        for slot in range(sp, min(top, sp + SCAN_BYTES), 8):
            ra = read(slot)
            if ra is None or not self._is_return_address(pid, ra):
                continue
            new = {r: regs[r] for r in CALLEE_SAVED if r in regs}
            bp = read(slot - 8) if slot - 8 >= sp else None
            if bp is not None and slot < bp <= top:
                new[RBP] = bp
            new[RSP] = slot + 8
            if self._leads_on(pid, ra, new, read):
                return ra, slot + 8, new
        return None

    def _leads_on(
        self, pid: int, ra: int, regs: dict[int, int], read: Callable[[int], int | None]
    ) -> bool:
        """Whether the frame at ra unwinds to the end or to another return address."""
        rule, _ = self._rule(pid, ra, False)
        if not isinstance(rule, Rule) or rule.cfa_reg < 0:
            return False
        base = regs.get(rule.cfa_reg)
        if base is None:
            return False
        if rule.ra_offset is None:
            return True
        nxt = read(base + rule.cfa_offset + rule.ra_offset)
        return nxt is not None and (nxt == 0 or self._is_return_address(pid, nxt))
