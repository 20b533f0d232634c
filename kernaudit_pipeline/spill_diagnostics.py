"""The ``spill_diagnostics`` stage: does a kernel spill, does it hurt, and what limits it.

Static evidence is ptxas' spill store/load bytes (or a stack frame, which a
Triton kernel only has when it spills). Dynamic evidence is Nsight Compute's
local-memory spilling requests and the lg_throttle / long_scoreboard stall
shares. A row with no spill evidence is never flagged.

The spill -> stall chain concludes "register spilling causes memory stalls"
(``spill_causes_stalls``) only when

1. there is spill evidence: spill bytes > 0, a stack frame > 0, or ncu's
   ``derived__local_spilling_requests`` > 0; and
2. the spills run: when ncu measured the local spilling requests, they are
   > 0 (static spills on a path never taken cause no stall); and
3. the stalls are the ones spills cause: lg_throttle >= 10 % of the warp
   cycles between issued instructions (the LSU queue filling with local
   loads/stores), or long_scoreboard >= 50 % while local spilling requests
   were measured > 0 (warps waiting on those local loads).

Why these thresholds: in the committed H200 captures (samples/h200, ncu
2025.3.1) the spilling Triton configs spent 15.9 % (flash attention
BM256/w4), 32.6 % (fp8 GEMM 256x256/w4), 36.9 % and 41.0 % (bf16 GEMM
256x256/w4 and 128x256/w4) of their warp cycles in lg_throttle; every clean
Triton config spent at most 4.5 %. The paged-decode config on one warp
(64 registers, 20,056 B of ptxas spill stores) shows 0 % lg_throttle but
72.6 % long_scoreboard with 8.7 M local spilling requests: with one warp the
LSU queue never fills, and the warp waits on its spilled loads instead.
long_scoreboard alone does not separate spills (49 % in the clean
paged-decode config, 83 % in PyTorch's gather kernels: global loads cause it
too), hence it only counts once local spilling traffic is measured. A cuDNN kernel with
0.99 M local spilling requests but 0.003 % lg_throttle and 14 % long_scoreboard
is reported as spilling, not as stalled by it.
Every figure checked is cited as ``{metric, value, op, threshold, met}``.

Beside the chain, each row gets its occupancy and limiter
(:mod:`occupancy`), SRAM efficiency (:mod:`sram`) and roofline position
(:mod:`roofline`). An unknown GPU is said so in ``diag_notes``; whatever needs
no spec is still computed.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import pandas as pd

from kernaudit_pipeline.core.hardware import lookup, resources_for
from kernaudit_pipeline.occupancy import Occupancy, limiters_from_ncu, theoretical_occupancy
from kernaudit_pipeline.roofline import MeasuredPeak, peak_from_record, roofline
from kernaudit_pipeline.sram import sram_efficiency
from kernaudit_pipeline.core.values import finite_float as _num, as_int as _int

LG_THROTTLE_SHARE_PCT = 10.0
LONG_SCOREBOARD_SHARE_PCT = 50.0

DIAG_COLUMNS = (
    "gpu_spec", "occupancy_pct", "occupancy_limiter", "occupancy_limiters", "blocks_per_sm",
    "occupancy_limit_registers", "occupancy_limit_shared_mem", "occupancy_limit_warps",
    "occupancy_limit_blocks", "ncu_occupancy_limiters", "occupancy_matches_ncu",
    "smem_limited", "smem_pct_of_sm", "smem_bytes_per_flop",
    "achieved_tflops", "achieved_gbps", "arithmetic_intensity", "compute_sol_pct", "memory_sol_pct",
    "sol_source", "efficiency_pct", "headroom_pct", "at_roofline", "bottleneck",
    "compute_ceiling_tflops", "bandwidth_ceiling_gb_per_s", "ceiling_source",
    "spill_causes_stalls", "spill_evidence", "diag_notes",
)


def _text(value: object) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    text = str(value).strip()
    return text or None


def _pos(value: object) -> bool:
    f = _num(value)
    return f is not None and f > 0


def spill_detected(row: dict | pd.Series) -> bool:
    """Spills are detected from spill bytes (static) or local spill requests (ncu)."""
    get = row.get
    return any(_pos(get(col)) for col in ("spill_stores_bytes", "spill_loads_bytes", "local_spill_requests"))


@dataclass(frozen=True)
class Evidence:
    metric: str
    value: float
    op: str  # ">" or ">="
    threshold: float
    met: bool


def _check(metric: str, value: object, op: str, threshold: float) -> Evidence | None:
    v = _num(value)
    if v is None:
        return None
    met = v > threshold if op == ">" else v >= threshold
    return Evidence(metric, v, op, threshold, met)


def spill_chain(row: dict | pd.Series) -> tuple[bool, list[Evidence], str]:
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
    static = any(by[m].met for m in ("spill_stores_bytes", "spill_loads_bytes", "stack_frame_bytes") if m in by)
    dyn = by.get("local_spill_requests")
    if not static and not (dyn and dyn.met):
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


def _peaks(peaks: Iterable[MeasuredPeak | dict] | None) -> tuple[MeasuredPeak, ...]:
    out: list[MeasuredPeak] = []
    for p in peaks or ():
        peak = p if isinstance(p, MeasuredPeak) else peak_from_record(dict(p))
        if peak is not None:
            out.append(peak)
    return tuple(out)


def _occupancy(row: dict | pd.Series, notes: list[str]) -> tuple[Occupancy | None, int | None]:
    get = row.get
    sm = resources_for(get("device_name"), get("compute_capability"))
    regs = _int(get("registers_per_thread"))
    threads = _int(get("threads_per_block"))
    if threads is None and _int(get("num_warps")):
        threads = 32 * _int(get("num_warps"))
    smem = _int(get("shared_mem_bytes"))
    if smem is None and (_int(get("shared_mem_static_bytes")) is not None or _int(get("shared_mem_dynamic_bytes")) is not None):
        smem = (_int(get("shared_mem_static_bytes")) or 0) + (_int(get("shared_mem_dynamic_bytes")) or 0)
    if regs is None or threads is None or smem is None:
        missing = [n for n, v in (("registers", regs), ("threads/warps", threads), ("shared memory", smem)) if v is None]
        notes.append(f"occupancy: no {', '.join(missing)}")
        return None, smem
    if sm is None:
        notes.append(f"unknown GPU ({_text(get('device_name')) or _text(get('compute_capability')) or 'no device'}): "
                     "no occupancy without the SM's resources")
        return None, smem
    return theoretical_occupancy(sm, registers_per_thread=regs, threads_per_block=threads, shared_mem_bytes=smem,
                                 smem_config_bytes=_int(get("ncu_shared_mem_config_bytes"))), smem


def diagnose_fields(row: dict | pd.Series, peaks: tuple[MeasuredPeak, ...] = ()) -> dict[str, Any]:
    """Every diagnostic column for one row (plain Python values, None when unknown)."""
    get = row.get
    notes: list[str] = []
    spec = lookup(get("device_name"))
    sm = resources_for(get("device_name"), get("compute_capability"))
    occ, smem = _occupancy(row, notes)
    ncu_lims = limiters_from_ncu({k: get(f"ncu_occupancy_limit_{k}") for k in ("registers", "shared_mem", "warps", "blocks")})
    matches = None
    if occ is not None and ncu_lims:
        matches = set(ncu_lims) == set(occ.limiters) or occ.limiter in ncu_lims
    sram = sram_efficiency(smem, sm, occ, block_m=_int(get("block_m")), block_n=_int(get("block_n")),
                           block_k=_int(get("block_k")), num_stages=_int(get("num_stages")),
                           dtype=get("dtype")) if smem is not None else None
    roof = roofline(flops=get("flops"), bytes_moved=get("bytes_moved"), latency_us=get("latency_us"),
                    dtype=get("dtype"), spec=spec, peaks=peaks, device_name=get("device_name"),
                    sm_throughput_pct=get("sm_throughput_pct"), memory_throughput_pct=get("memory_throughput_pct"),
                    grid_size=get("grid_size"))
    if roof.note:
        notes.append(f"roofline: {roof.note}")
    causes, evidence, verdict = spill_chain(row)
    notes.append(verdict)
    if spec is None and _text(get("device_name")) is not None:
        notes.insert(0, f"unknown GPU {_text(get('device_name'))!r}")
    return {
        "gpu_spec": spec.name if spec else None,
        "occupancy_pct": occ.occupancy_pct if occ else None,
        "occupancy_limiter": str(occ.limiter) if occ and occ.limiter else None,
        "occupancy_limiters": ",".join(map(str, occ.limiters)) if occ else None,
        "blocks_per_sm": occ.blocks_per_sm if occ else None,
        "occupancy_limit_registers": occ.limit_registers if occ else None,
        "occupancy_limit_shared_mem": occ.limit_shared_mem if occ else None,
        "occupancy_limit_warps": occ.limit_warps if occ else None,
        "occupancy_limit_blocks": occ.limit_blocks if occ else None,
        "ncu_occupancy_limiters": ",".join(map(str, ncu_lims)) if ncu_lims else None,
        "occupancy_matches_ncu": matches,
        "smem_limited": sram.smem_limited if sram else None,
        "smem_pct_of_sm": sram.smem_pct_of_sm if sram else None,
        "smem_bytes_per_flop": sram.smem_bytes_per_flop if sram else None,
        "achieved_tflops": roof.achieved_tflops,
        "achieved_gbps": roof.achieved_gbps,
        "arithmetic_intensity": roof.arithmetic_intensity,
        "compute_sol_pct": roof.compute_sol_pct,
        "memory_sol_pct": roof.memory_sol_pct,
        "sol_source": str(roof.sol_source) if roof.sol_source else None,
        "efficiency_pct": roof.efficiency_pct,
        "headroom_pct": roof.headroom_pct,
        "at_roofline": roof.at_roofline,
        "bottleneck": str(roof.bottleneck) if roof.bottleneck else None,
        "compute_ceiling_tflops": roof.ceilings.compute_tflops,
        "bandwidth_ceiling_gb_per_s": roof.ceilings.bandwidth_gb_per_s,
        "ceiling_source": ", ".join(s for s in (roof.ceilings.compute_source, roof.ceilings.bandwidth_source) if s) or None,
        "spill_causes_stalls": causes,
        "spill_evidence": json.dumps([asdict(e) for e in evidence]),
        "diag_notes": "; ".join(notes),
    }


def diagnose(comparisons: pd.DataFrame, *, peaks: Iterable[MeasuredPeak | dict] | None = None) -> pd.DataFrame:
    """The comparisons frame plus ``spill_detected`` and the diagnostic columns.

    Works on any subset of the kernel_runs columns (seed rows are all-NaN
    beyond the seed's seven fields). ``peaks``: the runner's measured ceilings.
    """
    out = comparisons.copy()
    out["spill_detected"] = [spill_detected(row) for _, row in out.iterrows()]
    measured = _peaks(peaks)
    fields = [diagnose_fields(row, measured) for _, row in out.iterrows()]
    for column in DIAG_COLUMNS:
        out[column] = [f[column] for f in fields] if fields else pd.Series(dtype="object")
    for column in ("occupancy_pct", "smem_pct_of_sm", "smem_bytes_per_flop", "achieved_tflops", "achieved_gbps",
                   "arithmetic_intensity", "compute_sol_pct", "memory_sol_pct", "efficiency_pct", "headroom_pct",
                   "compute_ceiling_tflops", "bandwidth_ceiling_gb_per_s"):
        out[column] = pd.to_numeric(out[column], errors="coerce").astype(float)
    for column in ("blocks_per_sm", "occupancy_limit_registers", "occupancy_limit_shared_mem",
                   "occupancy_limit_warps", "occupancy_limit_blocks"):
        out[column] = pd.array(out[column], dtype="Int64")
    for column in ("occupancy_matches_ncu", "smem_limited", "at_roofline"):
        out[column] = pd.array(out[column], dtype="boolean")
    out["spill_causes_stalls"] = out["spill_causes_stalls"].astype(bool)
    return out


def _jsonable(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def diagnose_record(record: dict, peaks: Iterable[MeasuredPeak | dict] | None = None) -> dict[str, Any]:
    """The diagnostic fields for one seed-style record, JSON-serializable (for ``kernaudit assess``)."""
    fields = diagnose_fields(record, _peaks(peaks))
    fields["spill_evidence"] = json.loads(fields["spill_evidence"])
    return {k: _jsonable(v) for k, v in fields.items()}
