"""How a compiled kernel's loop reads its tiles from global memory, read from its TTGIR.

Why: tile sizes say how many bytes a K step loads, not how they lie in memory. A tile whose
contiguous dimension is short reads each 128-byte line in pieces: a bf16 weight stored (N, K), as
``nn.Linear`` keeps it, read K-major with BLOCK_K = 32 brings 64 bytes of each weight row per K
step, so every line is fetched half by one step and half by the next, and the memory system
handles twice the requests for the same bytes. A short run *across* the loop is another matter:
a weight packed along N with a narrow BLOCK_N leaves the rest of each line to the neighbouring
programs, which read it in the same wave. So what counts is a short run along the dimension the
loop advances.

Both facts are the compiler's, read from the very compile the static audit already runs rather
than guessed from argument names: which dimension is contiguous is the load's blocked layout in
the TTGIR (``order``: fastest-varying dimension first; Triton's coalescing pass sets it from the
strides the JIT specialized to 1), and the loop advances a tile along its contiguous dimension
when the pointer step in the loop is a constant equal to the tile's extent there (``tt.addptr``
by ``dense<BLOCK_K>``: a unit stride times BLOCK_K; a step along any other dimension is a
runtime stride).

Counted: the global tile loads (rank >= 2) inside the kernel's loops, either pipelined
(``ttg.async_copy_global_to_local``) or plain (``tt.load``), each distinct load once per
iteration. For each, the contiguous run is the tile's extent along its fastest dimension times
the element size; ``line_bytes`` rounds every run that the loop advances along up to whole
128-byte lines (other loads count their bytes). Vectors (scales, biases, index lists) are left
out: they are small and their layout is not a choice. TTGIR is text printed by the compiler
(not external JSON), read line by line like the SASS.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

LINE_BYTES = 128  # an L2 cache line; sectors are 32 B, but a request covers up to a line

# "%x = ttg.async_copy_global_to_local %p, %buf ... : tensor<64x32x!tt.ptr<bf16>, #blocked1> -> ..."
# "%x = tt.load %p ... : tensor<32x256x!tt.ptr<f16>, #blocked>"
_LOAD = re.compile(r"=\s*(?P<op>ttg\.async_copy_global_to_local|tt\.load)\s+(?P<ptr>%[\w.#]+)"
                   r".*?:\s*tensor<(?P<dims>(?:\d+x)+)!tt\.ptr<(?P<elem>\w+)>,\s*(?P<layout>#\w+)>")
# "%p2 = tt.addptr %p1, %cst_3 : tensor<64x32x!tt.ptr<bf16>, ...>, tensor<64x32xi32, ...>"
_ADDPTR = re.compile(r"^(?P<out>%[\w.#]+)\s*=\s*tt\.addptr\s+(?P<ptr>%[\w.#]+),\s*(?P<step>%[\w.#]+)")
# "%cst_3 = arith.constant dense<32> : tensor<64x32xi32, #blocked1>"
_CONSTANT = re.compile(r"^(?P<name>%[\w.#]+)\s*=\s*arith\.constant\s+dense<(?P<value>-?\d+)>\s*:\s*tensor<")
# "#blocked1 = #ttg.blocked<{sizePerThread = [1, 8], ..., order = [1, 0]}>"
_LAYOUT = re.compile(r"^(?P<name>#\w+)\s*=\s*#ttg\.blocked<\{.*?order\s*=\s*\[(?P<order>[\d,\s]+)\]")
_ELEMENT_BITS = {"bf16": 16, "f16": 16, "f32": 32, "f64": 64, "i8": 8, "i16": 16, "i32": 32,
                 "i64": 64, "f8E4M3FN": 8, "f8E5M2": 8, "f8E4M3FNUZ": 8, "f8E5M2FNUZ": 8,
                 "i1": 8}


@dataclass(frozen=True)
class TileLoad:
    shape: tuple[int, ...]
    element_bits: int
    contiguous_dim: int
    advances_along_run: bool = False  # the loop steps this tile along its contiguous dimension

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * self.element_bits // 8

    @property
    def run_bytes(self) -> int:
        return self.shape[self.contiguous_dim] * self.element_bits // 8

    @property
    def line_bytes(self) -> int:
        if not self.advances_along_run:
            return self.bytes
        runs = math.prod(self.shape) // self.shape[self.contiguous_dim]
        return runs * math.ceil(self.run_bytes / LINE_BYTES) * LINE_BYTES


@dataclass(frozen=True)
class LoopLoads:
    """Per program and loop iteration: the tile bytes loaded and the 128-byte lines they touch."""

    loads: tuple[TileLoad, ...]

    @property
    def load_bytes(self) -> int:
        return sum(t.bytes for t in self.loads)

    @property
    def line_bytes(self) -> int:
        return sum(t.line_bytes for t in self.loads)

    def numbers(self) -> dict[str, int]:
        return {"loop_load_bytes": self.load_bytes, "loop_line_bytes": self.line_bytes}


def _layout_orders(ttgir: str) -> dict[str, tuple[int, ...]]:
    out = {}
    for line in ttgir.splitlines():
        m = _LAYOUT.match(line.strip())
        if m:
            out[m.group("name")] = tuple(int(x) for x in m.group("order").split(","))
    return out


def loop_loads(ttgir: str) -> LoopLoads | None:
    """The tile loads inside the kernel's loops; None when there is no loop (nothing to say)."""
    orders = _layout_orders(ttgir)
    constants: dict[str, int] = {}
    steps: dict[str, int] = {}  # pointer -> constant step, for both ends of an in-loop addptr
    depth = 0
    loop_depths: list[int] = []  # brace depth at which each open scf.for began
    seen: dict[tuple, tuple[str, TileLoad]] = {}
    found_loop = False
    for line in ttgir.splitlines():
        stripped = line.strip()
        c = _CONSTANT.match(stripped)
        if c:
            constants[c.group("name")] = int(c.group("value"))
        if loop_depths:
            a = _ADDPTR.match(stripped)
            if a and a.group("step") in constants:
                step = constants[a.group("step")]
                steps[a.group("out")] = steps[a.group("ptr")] = step
            m = _LOAD.search(stripped)
            if m:
                dims = tuple(int(d) for d in m.group("dims").rstrip("x").split("x"))
                order = orders.get(m.group("layout"))
                bits = _ELEMENT_BITS.get(m.group("elem"))
                if len(dims) >= 2 and order and bits and order[0] < len(dims):
                    load = TileLoad(dims, bits, order[0])
                    # one per distinct pointer source: a loop body that is unrolled or peeled
                    # repeats the same tile; two operands of the same shape stay two loads
                    seen.setdefault((m.group("op"), m.group("ptr"), dims, m.group("layout")),
                                    (m.group("ptr"), load))
        opens, closes = stripped.count("{"), stripped.count("}")
        # attribute dicts open and close on one line; a region opens at the end of its line
        if " scf.for " in f" {stripped} " and stripped.endswith("{"):
            loop_depths.append(depth)
            found_loop = True
        depth += opens - closes
        while loop_depths and depth <= loop_depths[-1]:
            loop_depths.pop()
    if not found_loop:
        return None
    # the step may be defined after the load that uses the stepped pointer (a loop that is not
    # pipelined loads first, then advances), so it is matched once the text is read
    return LoopLoads(tuple(
        replace(load, advances_along_run=steps.get(ptr) == load.shape[load.contiguous_dim])
        for ptr, load in seen.values()))
