"""Device limits and occupancy as the rules and the verifier see them.

A flat view of ``core.hardware`` (SM count, shared memory per block and per SM, registers,
warps and blocks per SM) and of :mod:`kernaudit_pipeline.spill_diagnostics.occupancy`; the rules estimate with
these, and the verifier's recompile is what checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from kernaudit_pipeline.core.configs import TRITON_DEFAULT_NUM_WARPS
from kernaudit_pipeline.core.hardware import SM_RESOURCES, SMResources, resources_for
from kernaudit_pipeline.core.hardware import lookup as lookup_gpu
from kernaudit_pipeline.core.values import as_int, finite_float, is_missing
from kernaudit_pipeline.spill_diagnostics.occupancy import theoretical_occupancy

# When a row names no known device, shared-memory limits default to sm_90's (the audit's
# reference device class); the SM count stays unknown, so the wave rule does not fire.
REFERENCE_CC = "9.0"


@dataclass(frozen=True)
class DeviceLimits:
    """A flat view of the GPU spec table; ``sm_count`` is None for an unknown device."""

    sm_count: int | None
    smem_per_block_max_bytes: int
    smem_per_sm_bytes: int
    smem_reserved_per_block_bytes: int
    regs_per_sm: int
    max_warps_per_sm: int
    max_blocks_per_sm: int
    arch: str
    known_device: bool


def sm_resources(device_name: object, compute_capability: object = None) -> SMResources:
    return resources_for(device_name, compute_capability) or SM_RESOURCES[REFERENCE_CC]


def device_limits(device_name: object, compute_capability: object = None) -> DeviceLimits:
    spec = lookup_gpu(device_name)
    sm = sm_resources(device_name, compute_capability)
    return DeviceLimits(
        sm_count=spec.sm_count if spec else None,
        smem_per_block_max_bytes=sm.smem_per_block_optin_bytes,
        smem_per_sm_bytes=sm.smem_per_sm_bytes,
        smem_reserved_per_block_bytes=sm.smem_reserved_per_block_bytes,
        regs_per_sm=sm.regs_per_sm,
        max_warps_per_sm=sm.max_warps_per_sm,
        max_blocks_per_sm=sm.max_blocks_per_sm,
        arch="sm_" + sm.compute_capability.replace(".", ""),
        known_device=spec is not None,
    )


@dataclass(frozen=True)
class OccupancyView:
    blocks_per_sm: int
    limiter: str | None  # registers | shared_mem | warps | blocks (ncu's names); None: cannot launch
    blocks_by_registers: int
    blocks_by_shared_mem: int
    occupancy_pct: float


def occupancy(registers_per_thread: int, threads_per_block: int, shared_mem_bytes: int,
              device_name: object = None, compute_capability: object = None) -> OccupancyView:
    """Blocks per SM and their limiter (cuda_occupancy.h arithmetic)."""
    occ = theoretical_occupancy(sm_resources(device_name, compute_capability),
                                registers_per_thread=registers_per_thread,
                                threads_per_block=threads_per_block, shared_mem_bytes=shared_mem_bytes)
    return OccupancyView(occ.blocks_per_sm, None if occ.limiter is None else str(occ.limiter),
                         occ.limit_registers, occ.limit_shared_mem, occ.occupancy_pct)


def row_occupancy(row: Mapping) -> OccupancyView | None:
    """The diagnostics' occupancy columns when present, else computed from the row's resources."""
    blocks, by_regs, by_smem = (as_int(row.get(c)) for c in (
        "blocks_per_sm", "occupancy_limit_registers", "occupancy_limit_shared_mem"))
    if None not in (blocks, by_regs, by_smem):
        limiter = row.get("occupancy_limiter")
        return OccupancyView(blocks, None if is_missing(limiter) else str(limiter), by_regs, by_smem,
                             finite_float(row.get("occupancy_pct")) or 0.0)
    regs = as_int(row.get("registers_per_thread"))
    smem = as_int(row.get("shared_mem_bytes"))
    warps = as_int(row.get("num_warps")) or TRITON_DEFAULT_NUM_WARPS
    threads = as_int(row.get("threads_per_block")) or 32 * warps
    if regs is None or smem is None:
        return None
    return occupancy(regs, threads, smem, row.get("device_name"), row.get("compute_capability"))


def accumulator_regs_per_thread(block_m: int, block_n: int, num_warps: int,
                                head_dim: int | None = None) -> float:
    """fp32 accumulator registers each thread holds for a BLOCK_M x BLOCK_N tile.

    For attention (``head_dim`` given) the O tile (BLOCK_M x D) and the score tile
    (BLOCK_M x BLOCK_N) are both live.
    """
    cols = block_n + (head_dim or 0)
    return block_m * cols / (32 * num_warps)
