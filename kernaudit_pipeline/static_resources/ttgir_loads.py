"""How a compiled kernel's loop reads its tiles from global memory, read from its TTGIR.

Why: tile sizes say how many bytes a K step loads, not how they lie in memory. A tile whose
contiguous dimension is short reads each 128-byte line in pieces: a bf16 weight stored (N, K), as
``nn.Linear`` keeps it, read K-major with BLOCK_K = 32 brings 64 bytes of each weight row per K
step, so every line is fetched half by one step and half by the next, and the memory system
handles twice the requests for the same bytes. Which dimension is contiguous is decided by the
compiler (Triton's coalescing pass, from the strides the JIT specialized to 1) and written into
the TTGIR as the load's blocked layout (``order``: fastest-varying dimension first), so the
static audit reads it from the very compile it already runs instead of guessing from names.

Counted: the global tile loads (rank >= 2) inside the kernel's loops, either pipelined
(``ttg.async_copy_global_to_local``) or plain (``tt.load``), each distinct load once per
iteration. For each, the contiguous run is the tile's extent along its fastest dimension times
the element size; ``line_bytes`` rounds every run up to whole 128-byte lines. Vectors (scales,
biases, index lists) are left out: they are small and their layout is not a choice. TTGIR is
text printed by the compiler (not external JSON), read line by line like the SASS.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

LINE_BYTES = 128  # an L2 cache line; sectors are 32 B, but a request covers up to a line

# "%x = ttg.async_copy_global_to_local %p, %buf ... : tensor<64x32x!tt.ptr<bf16>, #blocked1> -> ..."
# "%x = tt.load %p ... : tensor<32x256x!tt.ptr<f16>, #blocked>"
_LOAD = re.compile(r"=\s*(?P<op>ttg\.async_copy_global_to_local|tt\.load)\s+(?P<ptr>%[\w.#]+)"
                   r".*?:\s*tensor<(?P<dims>(?:\d+x)+)!tt\.ptr<(?P<elem>\w+)>,\s*(?P<layout>#\w+)>")
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

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * self.element_bits // 8

    @property
    def run_bytes(self) -> int:
        return self.shape[self.contiguous_dim] * self.element_bits // 8

    @property
    def line_bytes(self) -> int:
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

    @property
    def shortest_run_bytes(self) -> int:
        return min((t.run_bytes for t in self.loads), default=0)

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
    depth = 0
    loop_depths: list[int] = []  # brace depth at which each open scf.for began
    seen: dict[tuple, TileLoad] = {}
    found_loop = False
    for line in ttgir.splitlines():
        stripped = line.strip()
        if loop_depths:
            m = _LOAD.search(stripped)
            if m:
                dims = tuple(int(d) for d in m.group("dims").rstrip("x").split("x"))
                order = orders.get(m.group("layout"))
                bits = _ELEMENT_BITS.get(m.group("elem"))
                if len(dims) >= 2 and order and bits and order[0] < len(dims):
                    load = TileLoad(dims, bits, order[0])
                    # one per distinct pointer source: a loop body that is unrolled or peeled
                    # repeats the same tile; two operands of the same shape stay two loads
                    seen.setdefault((m.group("op"), m.group("ptr"), dims, m.group("layout")), load)
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
    return LoopLoads(tuple(seen.values()))
