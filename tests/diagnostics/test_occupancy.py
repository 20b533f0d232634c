"""Occupancy against hand-computed cases (cuda_occupancy.h arithmetic, ANCHORS.md).

The ncu figures in comments are from this project's H200 capture (ncu 2025.3.1).
"""

from __future__ import annotations

import pytest

from kernaudit_pipeline.core.hardware import sm_resources
from kernaudit_pipeline.spill_diagnostics.occupancy import Limiter, limiters_from_ncu, theoretical_occupancy

H200 = sm_resources("9.0")


def occ(regs, threads, smem, config=None, sm=H200):
    return theoretical_occupancy(sm, registers_per_thread=regs, threads_per_block=threads,
                                 shared_mem_bytes=smem, smem_config_bytes=config)


def test_anchor_256x256x64_four_warps_is_limited_by_shared_memory():
    # 255 regs x 128 threads: 8,192 regs/warp -> 2 warps per sub-partition -> 2 blocks;
    # 196,608 + 1,024 B -> 1 block of 233,472 B. ANCHORS: "occupancy limited by shared memory".
    o = occ(255, 128, 196_608)
    assert (o.limit_registers, o.limit_shared_mem, o.limit_warps, o.limit_blocks) == (2, 1, 16, 32)
    assert o.limiter is Limiter.SHARED_MEM and o.limiters == (Limiter.SHARED_MEM,)
    assert o.blocks_per_sm == 1 and o.occupancy_pct == pytest.approx(6.25)


def test_255_registers_128_threads_register_limit():
    o = occ(255, 128, 0)
    assert o.limit_registers == 2 and o.regs_allocated_per_block == 4 * 8192
    assert o.limiter is Limiter.REGISTERS and o.occupancy_pct == pytest.approx(12.5)


def test_ties_name_every_limiter_like_ncu():
    # 207 regs x 256 threads with 147,456 B: ncu "limited by the number of required registers,
    # and the required amount of shared memory", 12.5 %.
    o = occ(207, 256, 147_456)
    assert o.limiters == (Limiter.REGISTERS, Limiter.SHARED_MEM) and o.occupancy_pct == pytest.approx(12.5)


def test_register_file_is_split_over_sub_partitions():
    # 207 regs -> 6,656 regs/warp: the whole SM would hold 9 warps (65,536 / 6,656), but each
    # 16,384-register sub-partition holds 2, so 8 one-warp blocks, not 9.
    assert occ(207, 32, 0).limit_registers == 8


def test_smem_granularity_and_reserve():
    # 24,576 + 1,024 = 25,600 B (a multiple of 128) -> 233,472 // 25,600 = 9 (ncu: 9)
    o = occ(60, 128, 24_576)
    assert o.smem_allocated_per_block_bytes == 25_600 and o.limit_shared_mem == 9
    assert o.limit_registers == 8 and o.limiter is Limiter.REGISTERS and o.occupancy_pct == 50.0
    # 100 B rounds up to a 128-byte granule after the reserve: 1,124 -> 1,152
    assert occ(32, 128, 100).smem_allocated_per_block_bytes == 1_152


def test_carveout_reproduces_ncu_limit():
    # ncu: elementwise kernel, 32 regs, 128 threads, no smem, 32 KiB carveout -> shared-mem limit 32
    o = occ(32, 128, 0, config=32_768)
    assert (o.limit_registers, o.limit_shared_mem, o.limit_warps, o.limit_blocks) == (16, 32, 16, 32)
    assert o.limiters == (Limiter.REGISTERS, Limiter.WARPS) and o.occupancy_pct == 100.0
    assert occ(32, 128, 0).limit_shared_mem == 228  # whole-SM default


def test_cannot_launch():
    over = occ(128, 256, 288 * 1024)  # 128x256x128 bf16, 3 stages: over the 227 KiB opt-in
    assert over.blocks_per_sm == 0 and not over.launchable and "opt-in" in over.reason
    too_many = occ(128, 2048, 0)
    assert too_many.blocks_per_sm == 0 and "threads/block" in too_many.reason
    assert occ(256, 128, 0).blocks_per_sm == 0


def test_other_architectures():
    l40s = sm_resources("8.9")  # 48 warps, 24 blocks, 100 KiB per SM
    o = occ(32, 256, 0, sm=l40s)
    assert o.limit_warps == 6 and o.limiter is Limiter.WARPS and o.occupancy_pct == 100.0
    a100 = sm_resources("8.0")
    assert occ(64, 128, 98_304, sm=a100).limit_shared_mem == 1  # 164 KiB // 97 KiB


def test_invalid_inputs():
    with pytest.raises(ValueError):
        occ(32, 0, 0)


def test_limiters_from_ncu_values():
    assert limiters_from_ncu({"launch__occupancy_limit_registers": "2", "launch__occupancy_limit_shared_mem": 1.0,
                              "launch__occupancy_limit_warps": 16, "launch__occupancy_limit_blocks": 32}) \
        == (Limiter.SHARED_MEM,)
    assert limiters_from_ncu({"ncu_occupancy_limit_registers": 1, "ncu_occupancy_limit_shared_mem": 1}) \
        == (Limiter.REGISTERS, Limiter.SHARED_MEM)
    assert limiters_from_ncu({}) == ()
