"""Roofline position of a measured kernel: how close to which ceiling.

From the kernel's FLOP and byte model and its measured latency:
achieved TFLOP/s and GB/s, and arithmetic intensity (FLOP/byte). The speed-of-
light percentages come from Nsight Compute when the row has them
(``sm__throughput`` and ``gpu__compute_memory_throughput`` as % of peak, the
KernelAgent convention); otherwise from the model against the ceilings.

Ceilings are dtype-aware (an fp8 GEMM is measured against the fp8 peak) and
measured ceilings win over the datasheet: the runner's ``peak`` records
(e.g. cuBLAS bf16 at 701 TFLOP/s, a 4.2 TB/s copy on the H200) are what the
hardware actually reaches.

efficiency = max(compute SOL, memory SOL); headroom = 100 - efficiency;
at_roofline when efficiency >= 95 %. The bottleneck:

- ``compute`` / ``memory``: efficiency >= 60 %, whichever SOL is higher;
- ``latency``: both below 60 % and the launch cannot keep the GPU busy: a
  grid of fewer blocks than half the SMs, or a kernel shorter than 5 us
  (launch and pipeline fill then dominate);
- ``underutilized``: both below 60 % otherwise;
- ``None`` when no SOL can be had (no ncu figures and no ceiling: unknown GPU).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from kernaudit_pipeline.core.hardware import GPUSpec, canonical_dtype, lookup
from kernaudit_pipeline.core.values import finite_float as _num

AT_ROOFLINE_PCT = 95.0
UNDERUTILIZED_PCT = 60.0
LATENCY_GRID_SM_FRACTION = 0.5
SHORT_KERNEL_US = 5.0


class Bottleneck(StrEnum):
    COMPUTE = "compute"
    MEMORY = "memory"
    LATENCY = "latency"
    UNDERUTILIZED = "underutilized"


class SolSource(StrEnum):
    NCU = "ncu"
    MODEL = "model"


@dataclass(frozen=True)
class MeasuredPeak:
    """One measured ceiling (the runner's ``peak`` record)."""

    name: str
    device_name: str | None
    dtype: str | None  # canonical (bf16, fp16, fp8, tf32, fp32); None for bandwidth
    tflops: float | None = None
    gb_per_s: float | None = None


@dataclass(frozen=True)
class Ceilings:
    compute_tflops: float | None
    compute_source: str | None  # "measured:<name>" | "spec:<gpu>"
    bandwidth_gb_per_s: float | None
    bandwidth_source: str | None


@dataclass(frozen=True)
class RooflinePoint:
    achieved_tflops: float | None
    achieved_gbps: float | None
    arithmetic_intensity: float | None  # FLOP per byte
    ridge_point: float | None  # FLOP/byte where the two ceilings meet
    compute_sol_pct: float | None
    memory_sol_pct: float | None
    sol_source: SolSource | None
    efficiency_pct: float | None
    headroom_pct: float | None
    at_roofline: bool | None
    bottleneck: Bottleneck | None
    ceilings: Ceilings
    note: str


_PEAK_DTYPE_RE = re.compile(r"(bf16|fp16|fp8|tf32|fp32|float8|e4m3|e5m2)", re.IGNORECASE)


def peak_from_record(record: dict) -> MeasuredPeak | None:
    """A runner ``peak`` record as a ceiling; the dtype is its ``dtype`` or in its name."""
    name = str(record.get("peak_name") or record.get("name") or "")
    tflops = _num(record.get("peak_tflops"))
    gbps = _num(record.get("peak_gb_per_s"))
    if not name or (tflops is None and gbps is None):
        return None
    dtype = canonical_dtype(record.get("dtype"))
    if dtype is None and tflops is not None:
        match = _PEAK_DTYPE_RE.search(name)
        token = match.group(1).lower() if match else None
        dtype = "fp8" if token in ("float8", "e4m3", "e5m2") else canonical_dtype(token)
    return MeasuredPeak(name=name, device_name=record.get("device_name"), dtype=dtype,
                        tflops=tflops, gb_per_s=gbps)


def _same_device(a: object, b: object) -> bool:
    if a is None or b is None:
        return True  # a peak without a device name was measured on the audited device
    spec_a, spec_b = lookup(a), lookup(b)
    if spec_a is not None and spec_b is not None:
        return spec_a.name == spec_b.name
    return str(a).strip().lower() == str(b).strip().lower()


def ceilings(spec: GPUSpec | None, dtype: object, peaks: list[MeasuredPeak] | tuple[MeasuredPeak, ...] = (),
             device_name: object = None) -> Ceilings:
    key = canonical_dtype(dtype)
    mine = [p for p in peaks if _same_device(p.device_name, device_name)]
    compute = [p for p in mine if p.tflops is not None and key is not None and p.dtype == key]
    bandwidth = [p for p in mine if p.gb_per_s is not None]
    c_val = c_src = b_val = b_src = None
    if compute:
        best = max(compute, key=lambda p: p.tflops)
        c_val, c_src = best.tflops, f"measured:{best.name}"
    elif spec is not None and spec.peak_tflops_for(key) is not None:
        c_val, c_src = spec.peak_tflops_for(key), f"spec:{spec.name}"
    if bandwidth:
        best = max(bandwidth, key=lambda p: p.gb_per_s)
        b_val, b_src = best.gb_per_s, f"measured:{best.name}"
    elif spec is not None:
        b_val, b_src = spec.mem_bandwidth_gb_per_s, f"spec:{spec.name}"
    return Ceilings(c_val, c_src, b_val, b_src)


def roofline(
    *,
    flops: object = None,
    bytes_moved: object = None,
    latency_us: object = None,
    dtype: object = None,
    spec: GPUSpec | None = None,
    peaks: list[MeasuredPeak] | tuple[MeasuredPeak, ...] = (),
    device_name: object = None,
    sm_throughput_pct: object = None,
    memory_throughput_pct: object = None,
    grid_size: object = None,
) -> RooflinePoint:
    flops_v, bytes_v, lat = _num(flops), _num(bytes_moved), _num(latency_us)
    notes: list[str] = []
    seconds = lat * 1e-6 if lat is not None and lat > 0 else None
    tflops = flops_v / seconds / 1e12 if flops_v is not None and seconds else None
    gbps = bytes_v / seconds / 1e9 if bytes_v is not None and seconds else None
    ai = flops_v / bytes_v if flops_v is not None and bytes_v else None
    ceil = ceilings(spec, dtype, peaks, device_name)
    ridge = (ceil.compute_tflops * 1e3 / ceil.bandwidth_gb_per_s
             if ceil.compute_tflops and ceil.bandwidth_gb_per_s else None)

    ncu_c, ncu_m = _num(sm_throughput_pct), _num(memory_throughput_pct)
    if ncu_c is not None or ncu_m is not None:
        c_sol, m_sol, source = ncu_c, ncu_m, SolSource.NCU
    else:
        c_sol = 100.0 * tflops / ceil.compute_tflops if tflops is not None and ceil.compute_tflops else None
        m_sol = 100.0 * gbps / ceil.bandwidth_gb_per_s if gbps is not None and ceil.bandwidth_gb_per_s else None
        source = SolSource.MODEL if (c_sol is not None or m_sol is not None) else None
        if spec is None and device_name is not None and not peaks:
            notes.append(f"unknown GPU {device_name!r}: no ceilings, SOL needs ncu figures")
        if seconds is None:
            notes.append("no valid latency")
        elif flops_v is None and bytes_v is None:
            notes.append("no FLOP/byte model")
    over = [f"{name} SOL {v:.0f}% exceeds its ceiling ({src})" for name, v, src in
            (("compute", c_sol, ceil.compute_source), ("memory", m_sol, ceil.bandwidth_source))
            if source is SolSource.MODEL and v is not None and v > 100.0]
    notes.extend(over)  # a measured "peak" the kernel beats is no ceiling: say so
    sols = [v for v in (c_sol, m_sol) if v is not None]
    if not sols:
        return RooflinePoint(tflops, gbps, ai, ridge, c_sol, m_sol, source, None, None, None, None, ceil,
                             "; ".join(notes) or "no SOL figures")
    eff = max(sols)
    headroom = max(0.0, 100.0 - eff)
    if eff >= UNDERUTILIZED_PCT:
        bottleneck = Bottleneck.COMPUTE if (c_sol or 0.0) >= (m_sol or 0.0) else Bottleneck.MEMORY
    else:
        grid = _num(grid_size)
        small_grid = (grid is not None and spec is not None
                      and grid < LATENCY_GRID_SM_FRACTION * spec.sm_count)
        short = lat is not None and lat < SHORT_KERNEL_US
        if small_grid:
            notes.append(f"grid of {int(grid)} blocks on {spec.sm_count} SMs")
        if short:
            notes.append(f"{lat:.2f} us kernel")
        bottleneck = Bottleneck.LATENCY if (small_grid or short) else Bottleneck.UNDERUTILIZED
    return RooflinePoint(tflops, gbps, ai, ridge, c_sol, m_sol, source, eff, headroom,
                         eff >= AT_ROOFLINE_PCT, bottleneck, ceil, "; ".join(notes))
