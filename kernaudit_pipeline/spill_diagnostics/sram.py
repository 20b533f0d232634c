"""Shared memory (SRAM) efficiency of a tiled kernel.

Three questions: how much of the SM's shared memory one block takes (and
whether it fits the per-block opt-in limit at all), how many blocks that
leaves resident per SM, and how much reuse the tile buys. For a GEMM-like
tile that stages ``BLOCK_M x BLOCK_K`` of A and ``BLOCK_K x BLOCK_N`` of B
per k-step over ``num_stages`` buffers, one k-step does ``2 * BM * BN * BK``
FLOPs, so the bytes of shared memory per FLOP are

    (BM*BK + BK*BN) * elem_bytes * stages / (2 * BM * BN * BK)

Lower is better: a 128x256x64 bf16 tile with 3 stages holds 144 KiB and
does 4.2 MFLOP per k-step, 0.035 B/FLOP; a 64x64x32 tile with 3 stages
needs 0.094 B/FLOP, 2.7x more SRAM traffic per FLOP.

A config is *shared-memory limited* when shared memory is among the
occupancy limiters (ties with registers count, as ncu names both) and binds
below what the block size alone allows (the warps and blocks limits), or when
its shared memory exceeds the per-block opt-in limit (it cannot launch). The
second condition keeps a kernel with almost no shared memory from being
flagged because the driver gave it a small carveout.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernaudit_pipeline.core.hardware import SMResources
from kernaudit_pipeline.spill_diagnostics.occupancy import Limiter, Occupancy

ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp8e4m3": 1, "fp8e4nv": 1, "fp8e5": 1,
              "fp8e5m2": 1, "fp32": 4, "tf32": 4}


def element_bytes(dtype: object) -> int | None:
    return None if dtype is None else ELEM_BYTES.get(str(dtype).strip().lower())


@dataclass(frozen=True)
class SramEfficiency:
    smem_bytes: int
    smem_per_sm_bytes: int | None
    smem_per_block_optin_bytes: int | None
    smem_pct_of_sm: float | None
    fits_per_block_limit: bool | None
    blocks_per_sm: int | None
    smem_resident_bytes: int | None  # blocks_per_sm x allocated bytes per block
    smem_bytes_per_flop: float | None
    tile_smem_model_bytes: int | None  # (BM*BK + BK*BN) * elem * stages
    smem_limited: bool | None


def tile_smem_bytes(block_m: int, block_n: int, block_k: int, elem_bytes: int, num_stages: int) -> int:
    """Operand staging buffers of a GEMM tile (the compiler may add a little for epilogue)."""
    return (block_m * block_k + block_k * block_n) * elem_bytes * num_stages


def smem_bytes_per_flop(block_m: int, block_n: int, block_k: int, elem_bytes: int, num_stages: int) -> float:
    flops_per_k_step = 2 * block_m * block_n * block_k
    return tile_smem_bytes(block_m, block_n, block_k, elem_bytes, num_stages) / flops_per_k_step


def sram_efficiency(
    smem_bytes: int,
    sm: SMResources | None,
    occupancy: Occupancy | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_stages: int | None = None,
    dtype: object = None,
) -> SramEfficiency:
    """Everything that needs no spec is filled in even when ``sm`` is None."""
    elem = element_bytes(dtype)
    per_flop = model = None
    if None not in (block_m, block_n, block_k, elem) and all(v and v > 0 for v in (block_m, block_n, block_k)):
        stages = num_stages if num_stages and num_stages > 0 else 1
        per_flop = smem_bytes_per_flop(block_m, block_n, block_k, elem, stages)
        model = tile_smem_bytes(block_m, block_n, block_k, elem, stages)
    if sm is None:
        return SramEfficiency(smem_bytes, None, None, None, None, None, None, per_flop, model, None)
    fits = smem_bytes <= sm.smem_per_block_optin_bytes
    blocks = occupancy.blocks_per_sm if occupancy is not None else None
    resident = None if occupancy is None else blocks * occupancy.smem_allocated_per_block_bytes
    limited = (not fits) or (occupancy is not None and Limiter.SHARED_MEM in occupancy.limiters
                             and occupancy.limit_shared_mem < min(occupancy.limit_warps,
                                                                  occupancy.limit_blocks))
    return SramEfficiency(
        smem_bytes=smem_bytes,
        smem_per_sm_bytes=sm.smem_per_sm_bytes,
        smem_per_block_optin_bytes=sm.smem_per_block_optin_bytes,
        smem_pct_of_sm=100.0 * smem_bytes / sm.smem_per_sm_bytes,
        fits_per_block_limit=fits,
        blocks_per_sm=blocks,
        smem_resident_bytes=resident,
        smem_bytes_per_flop=per_flop,
        tile_smem_model_bytes=model,
        smem_limited=limited,
    )
