"""How long one iteration of a loop takes when nothing but its own dependencies hold it up.

Why: an instruction count says how many issue slots a loop body takes; it does not say how
long the body waits on itself. A GEMM's K loop is mostly independent work (address updates,
asynchronous copies, MMAs on an accumulator the tensor cores own), so its warps issue nearly
back to back. A dequantizing loop is a chain: a shared-memory load of packed weights, a shift,
a mask, a subtract, a conversion through the quarter-rate pipe, a scale, a store for the MMA to
read, a barrier; and it may load its scale row from global memory synchronously, in the middle
of the chain. Two loops of the same length can differ by several times in time per iteration
(measured on the H200: 4 to 5 cycles per loop instruction per scheduler for the int4 dequant
loop against about 1 for the calibration GEMMs).

So the body is scheduled as the SM would run it: the warps a block puts on one of the SM's
four schedulers, in order, one instruction per cycle per scheduler, each instruction waiting
for the registers it reads, a quarter-rate conversion occupying its pipe, and a block-wide
barrier holding every warp until all have arrived. The result, cycles per iteration for one
block, is a static feature of the cubin (like its register count); the cost model scales it
by the clock and fits nothing inside it.

The latencies are the published microbenchmark figures for Hopper (dependent-issue latency of
the integer and FP32 pipes, shared-memory and L2-hit load latency), not fitted values. The
tensor-core work is not timed here: an MMA's result is marked ready at once, because the cost
model charges the MMAs through its compute term. SASS is text printed by ``cuobjdump``, read
token by token.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

ALU_CYCLES = 4         # IADD3, LOP3, SHF, IMAD, FFMA, HFMA2, PRMT, ... dependent issue
CONVERT_CYCLES = 14    # I2F/F2I/F2F and MUFU: the quarter-rate XU pipe
CONVERT_PIPE_CYCLES = 8  # one warp instruction holds a scheduler's XU pipe this long (4 lanes)
SHARED_LOAD_CYCLES = 30  # LDS, LDSM
GLOBAL_LOAD_CYCLES = 260  # LDG that hits L2 (a loop's small scale rows stay there)
BARRIER_CYCLES = 20    # BAR.SYNC once the last warp has arrived

_CONVERT = frozenset({"I2F", "F2I", "F2F", "I2FP", "F2IP", "MUFU", "I2I", "FRND"})
_SHARED_LOADS = frozenset({"LDS", "LDSM"})
_GLOBAL_LOADS = frozenset({"LDG", "LD", "LDL"})
_MMA = frozenset({"HGMMA", "IGMMA", "QGMMA", "HMMA", "IMMA", "QMMA"})
# Instructions whose operands are all read (nothing written to a register).
_NO_DEST = frozenset({
    "STS", "STG", "ST", "STL", "STSM", "RED", "BAR", "BRA", "EXIT", "DEPBAR", "LDGSTS",
    "LDGDEPBAR", "WARPSYNC", "NOP", "BSSY", "BSYNC", "FENCE", "MEMBAR", "SYNCS", "UTMALDG",
    "UTMASTG", "UTMAPF", "WARPGROUP", "CCTL", "ERRBAR", "YIELD", "CALL", "RET", "ARRIVES",
    "UBLKCP", "USETMAXREG", "BPT", "KILL",
})
# Opcodes whose second operand, when it is a predicate, is written too (carry or compare out).
_PREDICATE_OUT = frozenset({"IADD3", "LEA", "ISETP", "FSETP", "DSETP", "HSETP2", "IMAD", "LOP3",
                            "PLOP3", "UIADD3", "ULEA", "UISETP", "ULOP3", "UPLOP3", "VIADD",
                            "IADD", "R2P"})
_REGISTER = re.compile(r"\b(U?R)(\d+)(?:\.(64|128))?|\b(U?P)([0-6])\b")
_HGMMA_SHAPE = re.compile(r"\.(\d+)x(\d+)x\d+")


@dataclass(frozen=True)
class Instruction:
    op: str                 # the opcode with its modifiers, e.g. "LDS.128"
    guard: str              # the predicate guarding it ("@!P1" -> "P1"), "" when none
    operands: tuple[str, ...]

    @property
    def base(self) -> str:
        return self.op.split(".")[0]


def _registers(token: str, width: int = 1) -> list[str]:
    """Register names a token names: ``R46.64`` is R46 and R47; RZ, URZ and PT name none."""
    names = []
    for m in _REGISTER.finditer(token):
        if m.group(1):
            count = {"64": 2, "128": 4}.get(m.group(3) or "", width)
            names += [f"{m.group(1)}{int(m.group(2)) + i}" for i in range(count)]
        else:
            names.append(f"{m.group(4)}{m.group(5)}")
    return names


def _dest_width(ins: Instruction) -> int:
    """Registers the destination spans, from the opcode's modifiers."""
    parts = ins.op.split(".")
    if ins.base in ("HGMMA", "IGMMA", "QGMMA"):
        m = _HGMMA_SHAPE.search(ins.op)
        return max(int(m.group(1)) * int(m.group(2)) // 128, 1) if m else 1
    if ins.base in ("HMMA", "IMMA", "QMMA"):
        return 4 if "F32" in parts or "S32" in parts else 2
    if ins.base == "LDSM":
        return 4 if parts[-1] == "4" else 2 if parts[-1] == "2" else 1
    return 4 if "128" in parts else 2 if "64" in parts else 1


def _reads_writes(ins: Instruction) -> tuple[list[str], list[str]]:
    ops = ins.operands
    reads = _registers(ins.guard)
    if ins.base in _NO_DEST or not ops:
        for token in ops:
            reads += _registers(token)
        return reads, []
    writes = _registers(ops[0], _dest_width(ins))
    rest = ops[1:]
    if rest and ins.base in _PREDICATE_OUT and re.fullmatch(r"U?P[0-6T]", rest[0].strip()):
        writes += _registers(rest[0])
        rest = rest[1:]
    for token in rest:
        reads += _registers(token, _dest_width(ins) if ins.base in _MMA else 1)
    return reads, writes


def _latency(ins: Instruction) -> int:
    base = ins.base
    if base in _MMA:
        return 0  # the tensor cores' time is the cost model's compute term
    if base in _CONVERT:
        return CONVERT_CYCLES
    if base in _SHARED_LOADS:
        return SHARED_LOAD_CYCLES
    if base in _GLOBAL_LOADS:
        return GLOBAL_LOAD_CYCLES
    return ALU_CYCLES


def parse_body(lines: Sequence[tuple[str, str]]) -> list[Instruction]:
    """(opcode, operand text) pairs -> instructions; the guard is split off the opcode side."""
    out = []
    for op, args in lines:
        guard = ""
        if op.startswith("@"):
            guard, _, op = op.partition(" ")
        operands = tuple(t.strip() for t in args.split(",")) if args.strip() else ()
        out.append(Instruction(op=op, guard=guard.lstrip("@!"), operands=operands))
    return out


def iteration_cycles(body: Sequence[Instruction], warps_per_scheduler: int) -> int:
    """Cycles one scheduler takes to run one iteration of ``body`` for each of its warps.

    In order per warp; each cycle the scheduler issues the oldest-waiting warp whose next
    instruction has its operands (loop-carried values are ready at cycle 0). A conversion holds
    the XU pipe; a barrier releases when every warp has reached it."""
    warps = max(int(warps_per_scheduler), 1)
    if not body:
        return 0
    deps = [_reads_writes(ins) for ins in body]
    lat = [_latency(ins) for ins in body]
    ready = [dict() for _ in range(warps)]  # register -> cycle its value is ready
    pc = [0] * warps
    last_issue = [-1] * warps
    arrived = [0] * warps  # barriers each warp has passed
    at_barrier: dict[int, int] = {}  # barrier index -> warps waiting
    release: dict[int, int] = {}  # barrier index -> cycle it opens
    xu_free = 0
    cycle = 0
    n = len(body)
    limit = 64 * n * warps + 10_000  # a guard: every instruction issues within this
    while min(pc) < n and cycle < limit:
        issued = False
        for w in sorted(range(warps), key=lambda w: last_issue[w]):
            i = pc[w]
            if i >= n:
                continue
            ins = body[i]
            reads, writes = deps[i]
            if ins.base == "BAR":
                key = i
                if arrived[w] <= i:  # arriving now
                    arrived[w] = i + 1
                    at_barrier[key] = at_barrier.get(key, 0) + 1
                    if at_barrier[key] == warps:
                        release[key] = cycle + BARRIER_CYCLES
                if key in release and cycle >= release[key]:
                    pc[w] += 1
                    last_issue[w] = cycle
                    issued = True
                    break
                continue
            if any(ready[w].get(r, 0) > cycle for r in reads):
                continue
            if ins.base in _CONVERT and xu_free > cycle:
                continue
            if ins.base in _CONVERT:
                xu_free = cycle + CONVERT_PIPE_CYCLES
            for r in writes:
                ready[w][r] = cycle + lat[i]
            pc[w] += 1
            last_issue[w] = cycle
            issued = True
            break
        cycle += 1
        if not issued:
            # nothing could issue: jump to the next time something becomes ready
            upcoming = [t for w in range(warps) for t in ready[w].values() if t > cycle]
            upcoming += [t for t in release.values() if t > cycle]
            if xu_free > cycle:
                upcoming.append(xu_free)
            if upcoming:
                cycle = max(cycle, min(upcoming))
    return cycle
