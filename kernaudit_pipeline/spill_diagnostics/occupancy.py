"""Theoretical occupancy and what limits it, the way the hardware allocates.

This follows ``cuda_occupancy.h`` (``cudaOccMaxActiveBlocksPerMultiprocessor``):

- registers: ``regs/thread x 32`` rounded up to the 256-register allocation unit
  per warp; the register file is split over 4 sub-partitions, so the SM holds
  ``4 x floor(16384 / regs_per_warp)`` warps; a block needs all its warps
  (and, for the per-block hardware check, its warps rounded up to 4);
- shared memory: static + dynamic + the 1 KiB driver reserve per block,
  rounded up to 128-byte granules, against the SM's shared-memory carveout;
- warps: 64 (48 on CC 8.9) per SM; blocks: 32 (24 on CC 8.9) per SM.

The occupancy is the minimum of the four; every limit equal to it is a
limiter (ncu's ``TheoreticalOccupancy`` rule names ties the same way, e.g.
"limited by the number of required registers, and the required amount of
shared memory"). The limits are named like ncu's
``launch__occupancy_limit_{registers,shared_mem,warps,blocks}``.

The carveout: ncu's shared-memory limit uses the carveout the driver chose
for that launch (``launch__shared_mem_config_size``), which for kernels with
little shared memory can be as small as 32 KiB. Given that figure, this
module reproduces ncu's limit exactly; without it, the SM's full shared
memory is assumed, which is cuda_occupancy.h's default and gives the same
blocks per SM and limiter whenever shared memory is what binds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from kernaudit_pipeline.core.hardware import SMResources


class Limiter(StrEnum):
    REGISTERS = "registers"
    SHARED_MEM = "shared_mem"
    WARPS = "warps"
    BLOCKS = "blocks"


# Order of precedence when limits tie: the order ncu's rule text names them.
LIMITER_ORDER = (Limiter.REGISTERS, Limiter.SHARED_MEM, Limiter.WARPS, Limiter.BLOCKS)


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    limit_registers: int
    limit_shared_mem: int
    limit_warps: int
    limit_blocks: int
    limiter: Limiter | None  # None when the block cannot launch at all (all limits >0 otherwise)
    limiters: tuple[Limiter, ...]
    warps_per_block: int
    active_warps_per_sm: int
    occupancy_pct: float
    regs_allocated_per_block: int
    smem_allocated_per_block_bytes: int
    smem_config_bytes: int
    launchable: bool
    reason: str

    def limits(self) -> dict[str, int]:
        """ncu-named limits: ``{"launch__occupancy_limit_registers": 2, ...}``."""
        return {f"launch__occupancy_limit_{lim.value}": getattr(self, f"limit_{lim.value}")
                for lim in LIMITER_ORDER}


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def theoretical_occupancy(
    sm: SMResources,
    *,
    registers_per_thread: int,
    threads_per_block: int,
    shared_mem_bytes: int = 0,
    smem_config_bytes: int | None = None,
) -> Occupancy:
    """Blocks per SM under each limit, the limiter(s) and the occupancy %.

    ``shared_mem_bytes`` is the kernel's static + dynamic shared memory per
    block, without the driver's reserve (this adds it).
    """
    if threads_per_block <= 0:
        raise ValueError(f"threads_per_block must be positive, got {threads_per_block}")
    if registers_per_thread < 0 or shared_mem_bytes < 0:
        raise ValueError("registers_per_thread and shared_mem_bytes must be >= 0")
    warps = math.ceil(threads_per_block / sm.warp_size)
    reasons: list[str] = []

    # registers
    regs_per_warp = _round_up(registers_per_thread * sm.warp_size, sm.reg_alloc_unit)
    regs_per_block = regs_per_warp * warps
    regs_assumed = regs_per_warp * _round_up(warps, sm.sub_partitions)
    if registers_per_thread > sm.max_regs_per_thread:
        by_regs = 0
        reasons.append(f"{registers_per_thread} registers/thread exceed {sm.max_regs_per_thread}")
    elif regs_assumed > sm.regs_per_block or regs_per_block > sm.regs_per_block:
        by_regs = 0
        reasons.append(f"{regs_assumed} registers/block exceed {sm.regs_per_block}")
    elif regs_per_warp == 0:
        by_regs = sm.max_blocks_per_sm
    else:
        warps_per_sub = (sm.regs_per_sm // sm.sub_partitions) // regs_per_warp
        by_regs = (warps_per_sub * sm.sub_partitions) // warps

    # shared memory
    smem_alloc = _round_up(shared_mem_bytes + sm.smem_reserved_per_block_bytes, sm.smem_alloc_granule_bytes)
    smem_limit_per_block = sm.smem_per_block_optin_bytes + sm.smem_reserved_per_block_bytes
    config = sm.smem_per_sm_bytes if smem_config_bytes is None else int(smem_config_bytes)
    if smem_alloc > smem_limit_per_block:
        by_smem = 0
        reasons.append(f"{shared_mem_bytes} B shared memory/block exceed the "
                       f"{sm.smem_per_block_optin_bytes} B opt-in limit")
    else:
        if config < smem_alloc:  # the driver grows the carveout to fit one block
            config = sm.smem_per_sm_bytes
        by_smem = config // smem_alloc if smem_alloc else sm.max_blocks_per_sm

    # warps and blocks
    if threads_per_block > sm.max_threads_per_block:
        by_warps = 0
        reasons.append(f"{threads_per_block} threads/block exceed {sm.max_threads_per_block}")
    else:
        by_warps = sm.max_warps_per_sm // warps
    by_blocks = sm.max_blocks_per_sm

    limits = {Limiter.REGISTERS: by_regs, Limiter.SHARED_MEM: by_smem,
              Limiter.WARPS: by_warps, Limiter.BLOCKS: by_blocks}
    blocks = min(limits.values())
    tied = tuple(lim for lim in LIMITER_ORDER if limits[lim] == blocks)
    active_warps = blocks * warps
    return Occupancy(
        blocks_per_sm=blocks,
        limit_registers=by_regs, limit_shared_mem=by_smem, limit_warps=by_warps, limit_blocks=by_blocks,
        limiter=tied[0] if tied else None,
        limiters=tied,
        warps_per_block=warps,
        active_warps_per_sm=active_warps,
        occupancy_pct=100.0 * active_warps / sm.max_warps_per_sm,
        regs_allocated_per_block=regs_per_block,
        smem_allocated_per_block_bytes=smem_alloc,
        smem_config_bytes=config,
        launchable=blocks > 0,
        reason="; ".join(reasons) if reasons else f"limited by {' and '.join(t.value for t in tied)}",
    )


def limiters_from_ncu(limits: dict[str, object]) -> tuple[Limiter, ...]:
    """The tied-minimum limiters of ncu's own ``launch__occupancy_limit_*`` values."""
    values: dict[Limiter, int] = {}
    for lim in LIMITER_ORDER:
        for key in (f"launch__occupancy_limit_{lim.value}", f"ncu_occupancy_limit_{lim.value}", lim.value):
            raw = limits.get(key)
            if raw is None:
                continue
            try:
                number = float(raw)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                values[lim] = int(number)
                break
    if not values:
        return ()
    low = min(values.values())
    return tuple(lim for lim in LIMITER_ORDER if values.get(lim) == low)
