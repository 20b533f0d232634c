"""Does a kernel spill, and do its spills cause memory stalls?

Which column is spill evidence depends on where the row came from (one meaning per column):

- ``spill_stores_bytes`` / ``spill_loads_bytes``: ptxas' own spill figures per thread (the
  static compile, a ptxas ``-v`` log, a Triton cache recompiled with ``-v``, the seed's
  ``spill_stores_bytes``). Any value above 0 is a spill.
- ``stack_frame_bytes``: local memory per thread (the stack frame; what Triton's
  ``n_spills * 4`` and the driver report). A Triton kernel has a stack frame only when it
  spills, so for a Triton kernel (the runner's rows, a Triton cache, any row of a
  ``kernels/`` module) with no ptxas figures the frame is the spill evidence. A CUDA kernel
  keeps local arrays in its frame: 800 B of stack frame with 0 B of spill stores is no spill
  (a public ptxas log of a flash-attention kernel shows exactly that), so the frame never
  counts where ptxas' figures are known or the kernel is not Triton's.
- ``local_spill_requests``: Nsight Compute's ``derived__local_spilling_requests``, the dynamic
  evidence: spills that ran.

The spill -> stall chain concludes "register spilling causes memory stalls"
(``spill_causes_stalls``) only when

1. there is spill evidence (above); and
2. the spills run: when ncu measured the local spilling requests, they are > 0 (static
   spills on a path never taken cause no stall); and
3. the stalls are the ones spills cause: lg_throttle >= 10 % of the warp cycles between
   issued instructions (the LSU queue filling with local loads/stores), or long_scoreboard
   >= 50 % while local spilling requests were measured > 0 (warps waiting on those loads).

Why these thresholds: in the committed H200 captures (samples/h200, ncu 2025.3.1) the
spilling Triton configs spent 15.9 % (flash attention BM256/w4), 32.6 % (fp8 GEMM 256x256/w4),
36.9 % and 41.0 % (bf16 GEMM 256x256/w4 and 128x256/w4) of their warp cycles in lg_throttle;
every clean Triton config spent at most 4.5 %. The paged-decode config on one warp (64
registers, 20,056 B of ptxas spill stores) shows 0 % lg_throttle but 72.6 % long_scoreboard
with 8.7 M local spilling requests: with one warp the LSU queue never fills, and the warp
waits on its spilled loads instead. long_scoreboard alone does not separate spills (49 % in
the clean paged-decode config, 83 % in PyTorch's gather kernels: global loads cause it too),
hence it only counts once local spilling traffic is measured. A cuDNN kernel with 0.99 M
local spilling requests but 0.003 % lg_throttle and 14 % long_scoreboard is reported as
spilling, not as stalled by it. Every figure checked is cited as
``{metric, value, op, threshold, met}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kernaudit_pipeline.core.values import finite_float, is_missing

LG_THROTTLE_SHARE_PCT = 10.0
LONG_SCOREBOARD_SHARE_PCT = 50.0

# Sources whose every row is a Triton kernel: their stack frame is spill evidence.
TRITON_SOURCES = frozenset({"runner_jsonl", "triton_cache", "static", "synthetic"})
PTXAS_SPILL_COLUMNS = ("spill_stores_bytes", "spill_loads_bytes")


@dataclass(frozen=True)
class Evidence:
    metric: str
    value: float
    op: str  # ">" or ">="
    threshold: float
    met: bool


def _check(metric: str, value: object, op: str, threshold: float) -> Evidence | None:
    v = finite_float(value)
    if v is None:
        return None
    met = v > threshold if op == ">" else v >= threshold
    return Evidence(metric, v, op, threshold, met)


def _positive(value: object) -> bool:
    v = finite_float(value)
    return v is not None and v > 0


def is_triton_row(row: Mapping) -> bool:
    """A row of a Triton kernel: from a Triton-only source or naming a ``kernels/`` module."""
    if str(row.get("source_format") or "") in TRITON_SOURCES:
        return True
    module = row.get("kernel_module")
    return not is_missing(module) and bool(str(module).strip())


def frame_is_spill_evidence(row: Mapping) -> bool:
    """The stack frame counts as spills only for a Triton kernel without ptxas' own figures."""
    has_ptxas = any(finite_float(row.get(c)) is not None for c in PTXAS_SPILL_COLUMNS)
    return not has_ptxas and is_triton_row(row)


def spill_detected(row: Mapping) -> bool:
    """Spills from the column that means spills for this row's source (module docstring)."""
    if any(_positive(row.get(c)) for c in (*PTXAS_SPILL_COLUMNS, "local_spill_requests")):
        return True
    return frame_is_spill_evidence(row) and _positive(row.get("stack_frame_bytes"))


def spill_chain(row: Mapping) -> tuple[bool, list[Evidence], str]:
    """(spilling causes memory stalls?, the figures checked, one-line verdict)."""
    get = row.get
    checks = [
        _check("spill_stores_bytes", get("spill_stores_bytes"), ">", 0),
        _check("spill_loads_bytes", get("spill_loads_bytes"), ">", 0),
        _check("stack_frame_bytes", get("stack_frame_bytes"), ">", 0),
        _check("local_spill_requests", get("local_spill_requests"), ">", 0),
        _check("local_memory_bytes", get("local_memory_bytes"), ">", 0),
        _check("stall_lg_throttle_pct", get("stall_lg_throttle_pct"), ">=", LG_THROTTLE_SHARE_PCT),
        _check("stall_long_scoreboard_pct", get("stall_long_scoreboard_pct"), ">=", LONG_SCOREBOARD_SHARE_PCT),
    ]
    evidence = [c for c in checks if c is not None]
    by = {e.metric: e for e in evidence}
    static_columns = PTXAS_SPILL_COLUMNS + (("stack_frame_bytes",) if frame_is_spill_evidence(row) else ())
    static = any(by[m].met for m in static_columns if m in by)
    dyn = by.get("local_spill_requests")
    if not static and not (dyn and dyn.met):
        frame = by.get("stack_frame_bytes")
        if frame is not None and frame.met:
            return False, evidence, "a stack frame but no spill stores: local arrays, not spills"
        return False, evidence, "no spill evidence"
    if dyn is not None and not dyn.met:
        return False, evidence, "static spills, but ncu measured 0 local spilling requests: not executed"
    lg = by.get("stall_lg_throttle_pct")
    ls = by.get("stall_long_scoreboard_pct")
    if lg is None and ls is None:
        return False, evidence, "spills, but no stall figures to tie them to stalls"
    if lg is not None and lg.met:
        return True, evidence, (f"register spilling causes memory stalls: lg_throttle {lg.value:.1f}% "
                                f">= {LG_THROTTLE_SHARE_PCT:g}%")
    if ls is not None and ls.met and dyn is not None and dyn.met:
        return True, evidence, (f"register spilling causes memory stalls: long_scoreboard {ls.value:.1f}% "
                                f">= {LONG_SCOREBOARD_SHARE_PCT:g}% with {dyn.value:,.0f} local spilling requests")
    return False, evidence, "spills, but lg_throttle/long_scoreboard below the thresholds"
