"""The hot loop of a compiled kernel, read from its SASS: how much a warp issues per iteration.

Why: tiles, warps and bytes say what the tensor cores and the memory system must do; they do not
say what else each K step (or key block) costs. A fused RMSNorm squares and reduces its x tile
inside the K loop, a weight-only-quantized GEMM converts and scales its weight tile there, and a
config whose accumulator no longer fits reloads spilled registers there. All of that shows up as
instructions in the loop body of the very cubin the driver loads, so the cost model reads them
from ``cuobjdump -sass`` rather than guessing from the kernel's source.

A loop is a backward branch (``BRA`` to a lower address). The hot loop is the innermost such loop
(one containing no other) with the most instructions; the kernels here have one main loop (the K
loop of a GEMM, the key loop of attention, the token loop of a decode partition), and where a
causal kernel has two (off-diagonal and diagonal blocks) they are alike. SASS is text printed by
a tool, not external JSON, so it is read line by line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "/*0a30*/   @!P1 BRA 0x20a0 ;" -> address, optional predicate, opcode with modifiers, operands
_INSTRUCTION = re.compile(
    r"/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?(?P<op>[A-Z][A-Z0-9_.]*)(?P<args>[^;]*);")
# Tensor-core instructions: warpgroup MMA (sm_90), warp MMA (HMMA/IMMA/QMMA for fp8 on sm_89+)
_MMA_OPS = frozenset({"HGMMA", "IGMMA", "QGMMA", "HMMA", "IMMA", "QMMA"})
_LOCAL_OPS = frozenset({"LDL", "STL"})  # local memory: what spilled registers cost in the loop


@dataclass(frozen=True)
class LoopProfile:
    """Per warp, one iteration of the hot loop (None when the kernel has no loop)."""

    instructions: int   # every instruction in the loop body issues once per iteration
    mma_ops: int        # tensor-core instructions among them
    local_ops: int      # local-memory loads and stores (register spills) among them
    loops: int          # backward branches found (innermost or not)
    total_instructions: int

    def numbers(self) -> dict[str, int]:
        return {"loop_instructions": self.instructions, "loop_mma_ops": self.mma_ops,
                "loop_local_ops": self.local_ops}


def _instructions(sass: str) -> list[tuple[int, str, str]]:
    out = []
    for line in sass.splitlines():
        m = _INSTRUCTION.search(line)
        if m:
            out.append((int(m.group("addr"), 16), m.group("op"), m.group("args").strip()))
    return out


def _branch_target(args: str) -> int | None:
    token = args.split()[0].strip("`(),") if args.split() else ""
    try:
        return int(token, 16)
    except ValueError:
        return None


def hot_loop(sass: str) -> LoopProfile | None:
    """The profile of the hot loop of the (single) kernel function in ``sass``."""
    ins = _instructions(sass)
    if not ins:
        return None
    index = {addr: i for i, (addr, _, _) in enumerate(ins)}
    loops: list[tuple[int, int]] = []
    for i, (addr, op, args) in enumerate(ins):
        if op.split(".")[0] != "BRA":
            continue
        target = _branch_target(args)
        if target is not None and target < addr and target in index:
            loops.append((index[target], i))
    if not loops:
        return LoopProfile(0, 0, 0, 0, len(ins))
    innermost = [(s, e) for s, e in loops
                 if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in loops)]
    start, end = max(innermost, key=lambda se: (se[1] - se[0], -se[0]))
    body = [op.split(".")[0] for _, op, _ in ins[start:end + 1]]
    return LoopProfile(
        instructions=len(body),
        mma_ops=sum(op in _MMA_OPS for op in body),
        local_ops=sum(op in _LOCAL_OPS for op in body),
        loops=len(loops),
        total_instructions=len(ins),
    )
