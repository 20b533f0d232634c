"""SRAM efficiency of GEMM tiles (ANCHORS.md's tile table)."""

from __future__ import annotations

import pytest

from kernaudit_pipeline.core.hardware import sm_resources
from kernaudit_pipeline.spill_diagnostics.occupancy import theoretical_occupancy
from kernaudit_pipeline.spill_diagnostics.sram import smem_bytes_per_flop, sram_efficiency, tile_smem_bytes

H200 = sm_resources("9.0")


def test_tile_model_matches_triton_shared_memory():
    assert tile_smem_bytes(128, 256, 64, 2, 3) == 147_456  # Triton's metadata.shared, ANCHORS: 144 KiB
    assert tile_smem_bytes(256, 256, 64, 2, 3) == 196_608
    assert tile_smem_bytes(64, 64, 32, 2, 3) == 24_576


def test_bigger_tiles_reuse_more():
    big = smem_bytes_per_flop(128, 256, 64, 2, 3)
    small = smem_bytes_per_flop(64, 64, 32, 2, 3)
    assert big == pytest.approx(147_456 / (2 * 128 * 256 * 64))
    assert small / big == pytest.approx(2.667, rel=1e-3)


def test_shared_memory_limited_configs():
    spill = theoretical_occupancy(H200, registers_per_thread=255, threads_per_block=128, shared_mem_bytes=196_608)
    s = sram_efficiency(196_608, H200, spill, block_m=256, block_n=256, block_k=64, num_stages=3, dtype="bf16")
    assert s.smem_limited and s.fits_per_block_limit and s.blocks_per_sm == 1
    assert s.smem_pct_of_sm == pytest.approx(100 * 196_608 / 233_472)
    reg = theoretical_occupancy(H200, registers_per_thread=60, threads_per_block=128, shared_mem_bytes=24_576)
    assert not sram_efficiency(24_576, H200, reg).smem_limited  # registers bind first
    over = sram_efficiency(288 * 1024, H200, None)
    assert over.fits_per_block_limit is False and over.smem_limited


def test_tiny_smem_with_a_small_carveout_is_not_flagged():
    o = theoretical_occupancy(H200, registers_per_thread=16, threads_per_block=64, shared_mem_bytes=0,
                              smem_config_bytes=32_768)
    assert o.limit_shared_mem == o.limit_blocks == 32
    assert not sram_efficiency(0, H200, o).smem_limited


def test_unknown_device_keeps_the_tile_model():
    s = sram_efficiency(147_456, None, None, block_m=128, block_n=256, block_k=64, num_stages=3, dtype="fp8e4m3")
    assert s.smem_limited is None and s.smem_pct_of_sm is None
    assert s.smem_bytes_per_flop == pytest.approx((128 * 64 + 64 * 256) * 3 / (2 * 128 * 256 * 64))
