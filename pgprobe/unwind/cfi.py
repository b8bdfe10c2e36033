"""x86-64 unwind rules from .eh_frame (DWARF call frame information).

``rule_at(index, vaddr)`` runs the CIE's and the FDE's CFA instructions up to
vaddr and returns what an unwinder needs to step out of that function: how
to compute the CFA (canonical frame address: the caller's stack pointer),
where the return address is saved, and where the callee-saved registers
are. Only the instructions that compilers emit are interpreted (all of
DWARF 4's DW_CFA set); a CFA given as an expression is kept as bytes and
evaluated by ``eval_expression`` (PLT stubs use one). Registers are DWARF
numbers: 3 rbx, 6 rbp, 7 rsp, 12-15 r12-r15, 16 the return address.

pyelftools decodes CFI too, but only by parsing every entry of the section
(a few seconds for the server binary): here one FDE is read when a sample
first lands in its function, and each (function, address) rule is cached by
the caller.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from pgprobe.symbolize.ehframe import EH_FIXED, EhFrameIndex, uleb
from pgprobe.symbolize.ehframe import sleb as _sleb

RA = 16  # DWARF column of the return address on x86-64
RSP = 7
RBP = 6


@dataclass(frozen=True, slots=True)
class Rule:
    """How to step out of the function at one address."""

    cfa_reg: int  # CFA = register + cfa_offset; -1: CFA is cfa_expression
    cfa_offset: int
    ra_offset: int | None  # return address at CFA + ra_offset; None: outermost frame
    saved: tuple[tuple[int, int], ...]  # (register, offset from CFA) of saved registers
    cfa_expression: bytes = b""
    # (register, DWARF expression of its slot's address, CFA pushed first): DW_CFA_expression,
    # as in a signal frame (glibc's __restore_rt reads every register from the ucontext);
    # the return address may be one of them (then ra_offset is None but the frame is not last)
    expressions: tuple[tuple[int, bytes], ...] = ()


class CfiError(ValueError):
    """The FDE could not be read or uses what this interpreter does not know."""


@dataclass(frozen=True, slots=True)
class _Cie:
    code_align: int
    data_align: int
    ra_reg: int
    fde_encoding: int
    has_aug_data: bool
    instructions: bytes


def _parse_cie(eh: bytes, pos: int) -> _Cie:
    (length,) = struct.unpack_from("<I", eh, pos)
    if length == 0xFFFFFFFF:
        raise CfiError("64-bit CIE")
    end = pos + 4 + length
    pos += 8  # length, CIE id
    version = eh[pos]
    pos += 1
    nul = eh.index(b"\0", pos)
    aug = eh[pos:nul].decode("ascii", "replace")
    pos = nul + 1
    if "eh" in aug:
        pos += 8
    code_align, pos = uleb(eh, pos)
    data_align, pos = _sleb(eh, pos)
    if version == 1:
        ra_reg = eh[pos]
        pos += 1
    else:
        ra_reg, pos = uleb(eh, pos)
    encoding = 0
    if aug.startswith("z"):
        aug_len, pos = uleb(eh, pos)
        after = pos + aug_len
        for ch in aug[1:]:
            if ch == "R":
                encoding = eh[pos]
                pos += 1
            elif ch == "L":
                pos += 1
            elif ch == "P":
                fixed = EH_FIXED.get(eh[pos] & 0x0F)
                if fixed is None:
                    raise CfiError("personality encoding")
                pos += 1 + fixed[1]
            elif ch not in "SB":
                raise CfiError(f"augmentation {aug!r}")
        pos = after
    return _Cie(code_align, data_align, ra_reg, encoding, aug.startswith("z"), eh[pos:end])


class _State:
    __slots__ = ("cfa_reg", "cfa_offset", "cfa_expression", "regs")

    def __init__(self) -> None:
        self.cfa_reg = RSP
        self.cfa_offset = 8
        self.cfa_expression = b""
        # reg -> offset from CFA; bytes: expression of its slot's address; None: undefined
        self.regs: dict[int, int | bytes | None] = {}

    def copy(self) -> _State:
        other = _State()
        other.cfa_reg, other.cfa_offset = self.cfa_reg, self.cfa_offset
        other.cfa_expression = self.cfa_expression
        other.regs = dict(self.regs)
        return other


def _run(
    code: bytes, cie: _Cie, state: _State, initial: _State | None, loc: int, target: int
) -> bool:
    """Run CFA instructions from `loc` until the row that covers `target`.

    Returns False when an advance went past target (the row is final).
    """
    pos = 0
    stack: list[_State] = []
    da = cie.data_align
    while pos < len(code):
        op = code[pos]
        pos += 1
        high, low = op & 0xC0, op & 0x3F
        if high == 0x40:  # advance_loc
            loc += low * cie.code_align
            if loc > target:
                return False
            continue
        if high == 0x80:  # offset
            off, pos = uleb(code, pos)
            state.regs[low] = off * da
            continue
        if high == 0xC0:  # restore
            _restore(state, initial, low)
            continue
        if op == 0x00:  # nop
            continue
        if op in (0x02, 0x03, 0x04):  # advance_loc1/2/4
            fmt, size = {0x02: ("<B", 1), 0x03: ("<H", 2), 0x04: ("<I", 4)}[op]
            (delta,) = struct.unpack_from(fmt, code, pos)
            pos += size
            loc += delta * cie.code_align
            if loc > target:
                return False
        elif op == 0x01:  # set_loc
            raise CfiError("DW_CFA_set_loc")
        elif op in (0x05, 0x11, 0x14, 0x15):  # offset_extended(_sf), val_offset(_sf)
            reg, pos = uleb(code, pos)
            if op in (0x05, 0x14):
                off, pos = uleb(code, pos)
            else:
                off, pos = _sleb(code, pos)
            state.regs[reg] = off * da if op in (0x05, 0x11) else None  # val_offset: not a slot
        elif op == 0x06:  # restore_extended
            reg, pos = uleb(code, pos)
            _restore(state, initial, reg)
        elif op in (0x07, 0x08):  # undefined, same_value
            reg, pos = uleb(code, pos)
            if op == 0x07:
                state.regs[reg] = None
            else:
                state.regs.pop(reg, None)
        elif op == 0x09:  # register: reg saved in another register (rare; dropped)
            reg, pos = uleb(code, pos)
            _, pos = uleb(code, pos)
            state.regs[reg] = None
        elif op == 0x0A:  # remember_state
            stack.append(state.copy())
        elif op == 0x0B:  # restore_state
            if not stack:
                raise CfiError("restore_state without remember_state")
            old = stack.pop()
            state.cfa_reg, state.cfa_offset = old.cfa_reg, old.cfa_offset
            state.cfa_expression, state.regs = old.cfa_expression, old.regs
        elif op in (0x0C, 0x12):  # def_cfa, def_cfa_sf
            state.cfa_reg, pos = uleb(code, pos)
            if op == 0x0C:
                state.cfa_offset, pos = uleb(code, pos)
            else:
                off, pos = _sleb(code, pos)
                state.cfa_offset = off * da
            state.cfa_expression = b""
        elif op == 0x0D:  # def_cfa_register
            state.cfa_reg, pos = uleb(code, pos)
            state.cfa_expression = b""
        elif op in (0x0E, 0x13):  # def_cfa_offset, def_cfa_offset_sf
            if op == 0x0E:
                state.cfa_offset, pos = uleb(code, pos)
            else:
                off, pos = _sleb(code, pos)
                state.cfa_offset = off * da
        elif op == 0x0F:  # def_cfa_expression
            size, pos = uleb(code, pos)
            state.cfa_reg, state.cfa_expression = -1, code[pos : pos + size]
            pos += size
        elif op in (0x10, 0x16):  # expression (slot address); val_expression: can't place
            reg, pos = uleb(code, pos)
            size, pos = uleb(code, pos)
            state.regs[reg] = code[pos : pos + size] if op == 0x10 else None
            pos += size
        elif op == 0x2E:  # GNU_args_size
            _, pos = uleb(code, pos)
        elif op == 0x2F:  # GNU_negative_offset_extended
            reg, pos = uleb(code, pos)
            off, pos = uleb(code, pos)
            state.regs[reg] = -off * da
        else:
            raise CfiError(f"unknown CFA instruction 0x{op:02x}")
    return True


def _restore(state: _State, initial: _State | None, reg: int) -> None:
    if initial is not None and reg in initial.regs:
        state.regs[reg] = initial.regs[reg]
    else:
        state.regs.pop(reg, None)


_cie_cache: dict[tuple[int, int], _Cie] = {}


def rule_at(index: EhFrameIndex, vaddr: int, lookup: int | None = None) -> Rule | None:
    """The unwind rule at vaddr (None: no FDE covers it). May raise CfiError.

    lookup: the address to find the function and row of, when it differs
    from vaddr (for a return address, callers pass vaddr - 1: inside the
    call instruction, which may be the last of its function).
    """
    target = vaddr if lookup is None else lookup
    i = index.find(target)
    if i is None:
        return None
    eh = index.data
    fde = index.fdes[i]
    try:
        (cie_ptr,) = struct.unpack_from("<I", eh, fde + 4)
        cie_at = fde + 4 - cie_ptr
        key = (id(eh), cie_at)
        cie = _cie_cache.get(key)
        if cie is None:
            cie = _cie_cache[key] = _parse_cie(eh, cie_at)
        (length,) = struct.unpack_from("<I", eh, fde)
        end = fde + 4 + length
        fixed = EH_FIXED.get(cie.fde_encoding & 0x0F)
        if fixed is None:
            raise CfiError("FDE pointer encoding")
        pos = fde + 8 + 2 * fixed[1]
        if cie.has_aug_data:
            aug_len, pos = uleb(eh, pos)
            pos += aug_len
        state = _State()
        _run(cie.instructions, cie, state, None, 0, 1 << 64)
        initial = state.copy()
        _run(eh[pos:end], cie, state, initial, index.starts[i], target)
    except (struct.error, IndexError) as exc:
        raise CfiError(f"truncated CFI: {exc}") from None
    ra = state.regs.get(cie.ra_reg)
    saved = tuple(
        sorted((r, o) for r, o in state.regs.items() if isinstance(o, int) and r != cie.ra_reg)
    )
    expressions = tuple(sorted((r, o) for r, o in state.regs.items() if isinstance(o, bytes)))
    return Rule(
        state.cfa_reg,
        state.cfa_offset,
        ra if isinstance(ra, int) else None,
        saved,
        state.cfa_expression,
        expressions,
    )


_BINARY: dict[int, Callable[[int, int], int]] = {
    0x1A: lambda a, b: a & b,
    0x1C: lambda a, b: a - b,
    0x1E: lambda a, b: a * b,
    0x21: lambda a, b: a | b,
    0x22: lambda a, b: a + b,
    0x24: lambda a, b: a << b,
    0x25: lambda a, b: a >> b,
    0x27: lambda a, b: a ^ b,
    0x29: lambda a, b: int(a == b),
    0x2A: lambda a, b: int(a >= b),
    0x2B: lambda a, b: int(a > b),
    0x2C: lambda a, b: int(a <= b),
    0x2D: lambda a, b: int(a < b),
    0x2E: lambda a, b: int(a != b),
}


def eval_expression(
    expr: bytes,
    regs: dict[int, int],
    read: Callable[[int], int | None] | None = None,
    push: tuple[int, ...] = (),
) -> int | None:
    """A DWARF expression of registers, constants and arithmetic (None: unsupported).

    Enough for the CFA expressions compilers and linkers emit (PLT stubs:
    rsp + 8 + ((rip & 15) >= 11) << 3) and for signal frames (DW_OP_deref of
    a slot of the copied stack, through read); push: the initial stack (the CFA,
    for a DW_CFA_expression register rule).
    """
    stack: list[int] = list(push)
    pos = 0
    try:
        while pos < len(expr):
            op = expr[pos]
            pos += 1
            if 0x30 <= op <= 0x4F:  # lit0..31
                stack.append(op - 0x30)
            elif 0x70 <= op <= 0x8F:  # breg0..31
                off, pos = _sleb(expr, pos)
                reg = regs.get(op - 0x70)
                if reg is None:
                    return None
                stack.append(reg + off)
            elif op == 0x08:  # const1u
                stack.append(expr[pos])
                pos += 1
            elif op == 0x06:  # deref: a word of the copied stack
                value = read(stack.pop()) if read is not None else None
                if value is None:
                    return None
                stack.append(value)
            elif op == 0x23:  # plus_uconst
                off, pos = uleb(expr, pos)
                stack.append(stack.pop() + off)
            elif op in _BINARY:
                b, a = stack.pop(), stack.pop()
                stack.append(_BINARY[op](a, b) & 0xFFFFFFFFFFFFFFFF)
            else:
                return None
    except IndexError:
        return None
    return stack[-1] if stack else None
