"""The ``spill_diagnostics`` stage: does a kernel spill, does it hurt, and what limits it.

One package per question, each a module:

- :mod:`.chain`: spill evidence per source and the spill -> stall chain;
- :mod:`.occupancy`: theoretical occupancy and its limiter, as the hardware allocates;
- :mod:`.sram`: shared memory per block against the SM, and its reuse per FLOP;
- :mod:`.roofline`: the roofline position (SOL %, headroom, bottleneck).

:func:`diagnose` runs all four on any frame with any subset of the ``kernel_runs`` columns
(a foreign trace may carry only a name and a duration; an empty frame is a normal case).
An unknown GPU is said so in ``diag_notes``; whatever needs no spec is still computed, and
occupancy is computed only where the spec table knows the device (never for AMD rows).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import pandas as pd

from kernaudit_pipeline.core.hardware import Vendor, lookup, resources_for, vendor_of
from kernaudit_pipeline.core.values import as_int as _int
from kernaudit_pipeline.spill_diagnostics.chain import (
    LG_THROTTLE_SHARE_PCT, LONG_SCOREBOARD_SHARE_PCT, Evidence, spill_chain, spill_detected,
)
from kernaudit_pipeline.spill_diagnostics.occupancy import Occupancy, limiters_from_ncu, theoretical_occupancy
from kernaudit_pipeline.spill_diagnostics.roofline import MeasuredPeak, peak_from_record, roofline
from kernaudit_pipeline.spill_diagnostics.sram import sram_efficiency

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


def _peaks(peaks: Iterable[MeasuredPeak | dict] | None) -> tuple[MeasuredPeak, ...]:
    out: list[MeasuredPeak] = []
    for p in peaks or ():
        peak = p if isinstance(p, MeasuredPeak) else peak_from_record(dict(p))
        if peak is not None:
            out.append(peak)
    return tuple(out)


def _is_amd(row: dict | pd.Series) -> bool:
    return vendor_of(row.get("device_name"), backend=_text(row.get("vendor"))) is Vendor.AMD


def _occupancy(row: dict | pd.Series, notes: list[str]) -> tuple[Occupancy | None, int | None]:
    get = row.get
    sm = resources_for(get("device_name"), get("compute_capability"), get("vendor"))
    if _is_amd(row):
        notes.append(f"{_text(get('device_name')) or 'an AMD GPU'}: AMD, and the spec table holds NVIDIA devices "
                     "only: no occupancy")
        smem = _int(get("shared_mem_bytes"))
        return None, smem
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
    sm = resources_for(get("device_name"), get("compute_capability"), get("vendor"))
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
    if spec is None and _text(get("device_name")) is not None and not _is_amd(row):
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
    records = out.to_dict("records")
    # bool dtype even when empty: an empty object column used as a mask selects columns
    out["spill_detected"] = pd.Series([spill_detected(r) for r in records], index=out.index, dtype=bool)
    measured = _peaks(peaks)
    fields = [diagnose_fields(r, measured) for r in records]
    for column in DIAG_COLUMNS:
        out[column] = pd.Series([f[column] for f in fields], index=out.index, dtype=object)
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


__all__ = ["DIAG_COLUMNS", "Evidence", "LG_THROTTLE_SHARE_PCT", "LONG_SCOREBOARD_SHARE_PCT", "diagnose",
           "diagnose_fields", "diagnose_record", "spill_chain", "spill_detected"]


def _jsonable(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def diagnose_record(record: dict, peaks: Iterable[MeasuredPeak | dict] | None = None) -> dict[str, Any]:
    """The diagnostic fields for one seed-style record, JSON-serializable (for ``kernaudit assess``)."""
    fields = diagnose_fields(record, _peaks(peaks))
    fields["spill_evidence"] = json.loads(fields["spill_evidence"])
    return {k: _jsonable(v) for k, v in fields.items()}
