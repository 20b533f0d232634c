"""The grouped (mixture-of-experts) matmul family: programs that work, against those launched.

vLLM's fused MoE GEMM launches its grid for the worst-case padding and lets the programs past
the padded total exit at once, so ranking by the launched grid would charge a BLOCK_M = 256
config for thousands of programs that do nothing. These tests pin the expectation the family
rule uses to a simulation of the routing it assumes, and the features built from it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernaudit_pipeline.core.configs import config_id
from kernaudit_pipeline.core.hardware import lookup
from kernaudit_pipeline.kernel_spec import Shape
from kernaudit_pipeline.rank.features import Family, build, expected_expert_blocks
from kernaudit_pipeline.static_resources import ARCHS, CompileStatus
from kernaudit_pipeline.static_resources.describe import KernelDescription, Pair
from kernaudit_pipeline.static_resources.results import make_result

H200 = lookup("NVIDIA H200")


def _simulated_blocks(tokens: int, experts: int, top_k: int, block_m: int, trials: int = 400) -> float:
    """Route ``tokens`` tokens to ``top_k`` distinct experts each, uniformly; count padded blocks."""
    rng = np.random.default_rng(0)
    total = 0
    for _ in range(trials):
        picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
        counts = np.bincount(picks.ravel(), minlength=experts)
        total += int(np.ceil(counts / block_m).sum())
    return total / trials


@pytest.mark.parametrize(("tokens", "experts", "top_k", "block_m"),
                         [(16, 128, 8, 16), (128, 128, 8, 64), (1024, 128, 8, 128), (64, 8, 2, 32),
                          (200, 16, 4, 16)])
def test_expected_blocks_match_a_simulation_of_uniform_routing(tokens, experts, top_k, block_m):
    expected = expected_expert_blocks(tokens, experts, top_k, block_m)
    assert expected == pytest.approx(_simulated_blocks(tokens, experts, top_k, block_m), rel=0.03)


def test_one_row_blocks_count_every_pair_and_huge_blocks_count_the_experts_hit():
    assert expected_expert_blocks(100, 16, 4, 1) == pytest.approx(400.0)
    hit = 128 * (1 - (1 - 8 / 128) ** 16)  # distinct experts hit by 16 tokens
    assert expected_expert_blocks(16, 128, 8, 256) == pytest.approx(hit)


def _full_sum(tokens: int, experts: int, top_k: int, block_m: int) -> float:
    """E[ceil(C / block_m)] summed over every count C of Binomial(tokens, top_k / experts)."""
    p = top_k / experts
    lg = math.lgamma(tokens + 1)
    return experts * sum(math.exp(lg - math.lgamma(c + 1) - math.lgamma(tokens - c + 1)
                                  + c * math.log(p) + (tokens - c) * math.log1p(-p)) * math.ceil(c / block_m)
                         for c in range(1, tokens + 1))


@pytest.mark.parametrize(("tokens", "experts", "top_k", "block_m"),
                         [(4096, 128, 8, 16), (200_000, 128, 8, 16), (50_000, 8, 2, 64), (300, 16, 4, 16)])
def test_expected_blocks_need_no_sum_over_every_count(tokens, experts, top_k, block_m):
    """The sum runs over the counts within 40 standard deviations, and once the spread is four
    blocks wide the residue of the count is uniform (a closed form): both agree with the sum
    over every count."""
    assert expected_expert_blocks(tokens, experts, top_k, block_m) == pytest.approx(
        _full_sum(tokens, experts, top_k, block_m), rel=1e-9)


def test_a_huge_token_count_is_answered_without_a_sum():
    """10**12 tokens (a typo in someone's module) looped 10**12 times; now the padding of at
    most one block per expert is negligible beside 5e11 blocks of pairs."""
    assert expected_expert_blocks(10**12, 128, 8, 16) == pytest.approx(10**12 * 8 / 16, rel=1e-9)


def _desc(cfg: dict, shape: Shape) -> KernelDescription:
    em = shape["M"] * shape["TOP_K"] + shape["E"] * (cfg["BLOCK_M"] - 1)
    grid = (math.ceil(em / cfg["BLOCK_M"]) * math.ceil(shape["N"] / cfg["BLOCK_N"]),)
    flops = 2.0 * shape["M"] * shape["TOP_K"] * shape["N"] * shape["K"]
    return KernelDescription(
        path="/moe.py", name="moe", dtype="bf16", baseline_name="b", source_hash="0" * 64,
        configs=(cfg,), shapes=(shape,), module_config_ids=(config_id(cfg),), module_shape_names=(shape.name,),
        flops={shape.name: flops}, bytes_moved={shape.name: 1e8},
        pairs={(config_id(cfg), shape.name): Pair(None, "", grid)}, bytes_terms={})


def _features(cfg: dict, shape: Shape):
    smem = cfg["num_stages"] * (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * 2
    numbers = {"registers_per_thread": 128, "spill_stores_bytes": 0, "spill_loads_bytes": 0,
               "stack_frame_bytes": 0, "shared_mem_static_bytes": 0, "shared_mem_dynamic_bytes": smem,
               "shared_mem_bytes": smem, "threads_per_block": 32 * cfg["num_warps"],
               "wgmma_serialized": 0, "wgmma_waits_injected": 0}
    row = make_result(kernel_name="moe", config=cfg, shape_name=shape.name, arch=ARCHS["sm_90"],
                      status=CompileStatus.OK, message="", numbers=numbers, triton_version="t",
                      kernel_source_hash="0" * 64, cached=True)
    return build(_desc(cfg, shape), row, H200, H200.sm)


def test_moe_features_count_the_working_programs_not_the_launched_grid():
    shape = Shape("m16", {"M": 16, "N": 1536, "K": 2048, "E": 128, "TOP_K": 8})
    small = {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 3}
    big = dict(small, BLOCK_M=256)
    fs, fb = _features(small, shape), _features(big, shape)
    assert fs.family is Family.GROUPED_MATMUL
    # about 82 experts are hit by 16 tokens, one block each, whatever BLOCK_M; 12 N tiles each
    assert fs.programs == fb.programs == math.ceil(expected_expert_blocks(16, 128, 8, 16) * 12)
    assert 80 * 12 < fs.programs < 85 * 12
    # a 256-row block computes 16x the padded rows of a 16-row one, for the same pairs
    assert fb.flops_per_program == 16 * fs.flops_per_program == 16 * 2.0 * 16 * 128 * 2048
