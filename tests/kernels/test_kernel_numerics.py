"""Numerics of the kernels on small shapes, run by Triton's CPU interpreter.

``TRITON_INTERPRET=1`` has to be in the environment before a kernel module is imported (the
``@triton.jit`` decorator reads it), and ``load_kernel_module`` caches modules per process.
So the cases run in a child process (this file run as a script) with the variable set, and the
rest of the test session keeps compiled kernels for the real AOT compiles.

What the interpreter can and cannot do, and what that means here:

* It cannot multiply bf16: ``tl.dot`` on bf16 multiplies the raw bit patterns
  (triton-lang/triton#11584, "not supported yet"). The bf16 kernels (GEMM, flash attention,
  paged decode) therefore run the *same kernel code* on fp16 operands; the bf16 path itself is
  checked on the GPU by the runner's correctness gate.
* fp8 e4m3 works (the interpreter widens it to fp16 for ``tl.dot``, which is exact), so the
  fp8 GEMM runs on real e4m3 inputs. Its bf16 output cast truncates in the interpreter where
  the GPU rounds to nearest, which roughly doubles the rounding error; still inside tolerance.

Each case draws fresh inputs (the seed is printed on failure), poisons the output with NaN,
and checks that every element was overwritten and is within the module's TOLERANCE of the
higher-precision reference.
"""

from __future__ import annotations

import json
import os
import random
import sys

import pytest

from tests.kernels.support import interpreter_child


_GEMM_CFG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2,
             "num_warps": 4, "num_stages": 2}
_ATTN_CFG = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}
_ATTN_SMALL = {"B": 1, "H": 2, "KV_H": 1, "S": 64, "D": 64}

CASES: dict[str, list[dict]] = {
    "gemm": [
        {"id": "gemm_64x64x64", "dims": {"M": 64, "N": 64, "K": 64},
         "config": _GEMM_CFG, "dtype": "float16"},
        # M, N not multiples of the tile (wrap-around loads, masked store), K tail masked.
        {"id": "gemm_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
         "config": _GEMM_CFG, "dtype": "float16"},
        {"id": "gemm_decode_16x96x128", "dims": {"M": 16, "N": 96, "K": 128},
         "config": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1,
                    "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
    ],
    "fp8_gemm": [
        {"id": "fp8_64x48x160", "dims": {"M": 64, "N": 48, "K": 160},
         "config": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 2,
                    "num_warps": 4, "num_stages": 2}},
        {"id": "fp8_decode_16x64x256", "dims": {"M": 16, "N": 64, "K": 256},
         "config": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 1,
                    "num_warps": 4, "num_stages": 2}},
        # The loop's own fp32 promotion every 2 K steps: 7 steps, so 3 promotions and a tail
        # step that only the add after the loop brings in.
        {"id": "fp8_promote2_50x40x224", "dims": {"M": 50, "N": 40, "K": 224},
         "config": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "PROMOTE_K": 64,
                    "num_warps": 4, "num_stages": 2}},
    ],
    "flash_attention": [
        {"id": "attn_b1_h2_kv1_s64_d64_causal", "dims": _ATTN_SMALL,
         "causal": True, "config": _ATTN_CFG, "dtype": "float16"},
        {"id": "attn_b1_h2_kv1_s64_d64", "dims": _ATTN_SMALL,
         "causal": False, "config": _ATTN_CFG, "dtype": "float16"},
        # GQA 4/2 and a sequence length that is no multiple of either block.
        {"id": "attn_gqa_s70_d32_causal", "dims": {"B": 2, "H": 4, "KV_H": 2, "S": 70, "D": 32},
         "causal": True, "config": _ATTN_CFG, "dtype": "float16"},
        {"id": "attn_gqa_s70_d32", "dims": {"B": 2, "H": 4, "KV_H": 2, "S": 70, "D": 32},
         "causal": False, "config": _ATTN_CFG, "dtype": "float16"},
    ],
    "paged_decode_attention": [
        # Two sequences of 1 and 100 tokens: a one-token context and a split context.
        {"id": "decode_b2_ctx1_100", "dims": {"B": 2, "H": 8, "KV_H": 1, "D": 64, "PAGE_SIZE": 16,
                                              "CTX_MIN": 1, "CTX_MAX": 100},
         "config": {"BLOCK_N": 32, "PARTITION_SIZE": 64, "num_warps": 4, "num_stages": 2},
         "dtype": "float16"},
        # Blocks span several 8-token pages; up to three partitions per sequence.
        {"id": "decode_b3_pages8_ctx5_70", "dims": {"B": 3, "H": 4, "KV_H": 2, "D": 32,
                                                    "PAGE_SIZE": 8, "CTX_MIN": 5, "CTX_MAX": 70},
         "config": {"BLOCK_N": 16, "PARTITION_SIZE": 32, "num_warps": 4, "num_stages": 2},
         "dtype": "float16"},
    ],
}

CASES["swiglu_gemm"] = [
    {"id": "swiglu_64x64x64", "dims": {"M": 64, "N": 64, "K": 64},
     "config": _GEMM_CFG, "dtype": "float16"},
    # ragged M and N (wrap-around loads, masked store) and a masked K tail
    {"id": "swiglu_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
     "config": _GEMM_CFG, "dtype": "float16"},
    {"id": "swiglu_decode_16x96x128", "dims": {"M": 16, "N": 96, "K": 128},
     "config": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1,
                "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
]

CASES["rmsnorm_gemm"] = [
    {"id": "rmsnorm_64x64x64", "dims": {"M": 64, "N": 64, "K": 64},
     "config": _GEMM_CFG, "dtype": "float16"},
    # ragged M and N, and a K tail: the masked x and g columns must add nothing to the norm's
    # sum of squares, and the mean still divides by the real K
    {"id": "rmsnorm_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
     "config": _GEMM_CFG, "dtype": "float16"},
    {"id": "rmsnorm_decode_16x96x160", "dims": {"M": 16, "N": 96, "K": 160},
     "config": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1,
                "num_warps": 2, "num_stages": 2}, "dtype": "float16"},
]

CASES["w8a16_gemm"] = [
    # four K steps inside one 128-row scale group
    {"id": "w8a16_64x64x128", "dims": {"M": 64, "N": 64, "K": 128},
     "config": _GEMM_CFG, "dtype": "float16"},
    # ragged M and N, and a K tail inside a single partial group: the masked int8 rows must
    # add nothing whatever the scale
    {"id": "w8a16_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
     "config": _GEMM_CFG, "dtype": "float16"},
    # three groups (128, 128, 32): each step reads its own group's scale row, the tail step
    # the last, partial group's
    {"id": "w8a16_decode_16x96x288", "dims": {"M": 16, "N": 96, "K": 288},
     "config": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1,
                "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
    # BLOCK_K = GROUP_SIZE: one step per group
    {"id": "w8a16_bk128_32x64x384", "dims": {"M": 32, "N": 64, "K": 384},
     "config": {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_M": 1,
                "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
]

CASES["w4a16_gemm"] = [
    # four K steps inside one 128-row group: one zero and scale row
    {"id": "w4a16_64x64x128", "dims": {"M": 64, "N": 64, "K": 128},
     "config": _GEMM_CFG, "dtype": "float16"},
    # ragged M and N (9 packed words: the word offsets wrap % N // 8), and a K tail inside a
    # single partial group: the masked rows unpack to q = 0, nonzero after the zero point, and
    # the zeroed x columns must cancel them
    {"id": "w4a16_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
     "config": _GEMM_CFG, "dtype": "float16"},
    # three groups (128, 128, 32): each step reads its own group's zero and scale rows
    {"id": "w4a16_decode_16x96x288", "dims": {"M": 16, "N": 96, "K": 288},
     "config": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1,
                "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
    # BLOCK_K = GROUP_SIZE and a 64-wide tile (8 words a row)
    {"id": "w4a16_bk128_32x128x384", "dims": {"M": 32, "N": 128, "K": 384},
     "config": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1,
                "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
]

CASES["fp8_block_gemm"] = [
    # four K steps inside one 128-wide K group: one activation and one weight scale each
    {"id": "fp8_block_64x64x128", "dims": {"M": 64, "N": 64, "K": 128}, "config": _GEMM_CFG},
    # ragged M and N (wrap-around loads, masked store), and a K tail inside a single partial
    # group: the masked e4m3 columns must add nothing whatever the scales
    {"id": "fp8_block_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
     "config": _GEMM_CFG},
    # three K groups (128, 128, 32), and 32-wide tiles, four to a 128-wide weight block: the
    # last tile-column lies in the second block
    {"id": "fp8_block_decode_16x160x288", "dims": {"M": 16, "N": 160, "K": 288},
     "config": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1,
                "num_warps": 4, "num_stages": 2}},
    # BLOCK_K = 128, one step per group, and a 256-wide tile spanning two weight blocks; N =
    # 300 ends in a partial block, and the second tile-column wraps round to the first
    {"id": "fp8_block_bk128_bn256_40x300x384", "dims": {"M": 40, "N": 300, "K": 384},
     "config": {"BLOCK_M": 32, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 2,
                "num_warps": 4, "num_stages": 2}},
]

CASES["fused_moe_gemm"] = [
    # two experts, each token routed to both: 50 pairs per expert over four 16-row blocks, the
    # last one ragged (sentinel rows masked); ragged N (wrap-around W loads, masked store) and
    # a K tail
    {"id": "moe_e2_top2_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80, "E": 2, "TOP_K": 2},
     "config": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2,
                "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
    # 6 pairs over 8 experts: at least two experts get no tokens, most blocks are padding,
    # and the upper-bound grid has block-rows past the padded total
    {"id": "moe_e8_top2_empty_experts_3x64x96",
     "dims": {"M": 3, "N": 64, "K": 96, "E": 8, "TOP_K": 2},
     "config": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1,
                "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
    # top_k 3 (rows p // 3), a 64-wide tile over N = 100 and grouped order over 4 block-rows
    {"id": "moe_e6_top3_37x100x130", "dims": {"M": 37, "N": 100, "K": 130, "E": 6, "TOP_K": 3},
     "config": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 4,
                "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
    # vLLM's decode regime: 8 of 16 experts per token, one 16-row block each
    {"id": "moe_e16_top8_decode_4x96x128",
     "dims": {"M": 4, "N": 96, "K": 128, "E": 16, "TOP_K": 8},
     "config": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 16,
                "num_warps": 4, "num_stages": 2}, "dtype": "float16"},
]

SEED = random.SystemRandom().randrange(2**31)


def _measure(kernel: str, seed: int) -> None:
    """Child process: run every case of ``kernel`` and print one JSON line per case."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    import torch

    from kernaudit_pipeline.kernel_spec import Shape, load_kernel_module

    mod = load_kernel_module(kernel)
    tol = mod.TOLERANCE
    for i, case in enumerate(CASES[kernel]):
        shape = Shape(case["id"], case["dims"], causal=case.get("causal"))
        kwargs = {"dtype": getattr(torch, case["dtype"])} if "dtype" in case else {}
        inputs = mod.make_inputs(shape, "cpu", seed + i, **kwargs)
        ref = mod.reference(inputs).float()
        base = mod.baseline(inputs)
        poisoned = torch.full_like(base, float("nan"))
        out = mod.launch(inputs, case["config"], out=poisoned)
        diff = out.float() - ref
        print(json.dumps({
            "id": case["id"],
            "in_place": out.data_ptr() == poisoned.data_ptr(),
            "out_dtype": str(out.dtype),
            "nan_count": int(torch.isnan(out).sum()),
            "rel_l2": float(diff.norm() / ref.norm()),
            # against the PyTorch baseline (dequantize, then matmul) on the same inputs
            "baseline_rel_l2": float((out.float() - base.float()).norm() / base.float().norm()),
            "max_excess": float((diff.abs() - (tol.atol + tol.rtol * ref.abs())).max()),
        }), flush=True)


_RESULTS: dict[str, dict[str, dict]] = {}


def _results(kernel: str) -> dict[str, dict]:
    if kernel not in _RESULTS:
        _RESULTS[kernel] = {r["id"]: r for r in interpreter_child(__file__, kernel, str(SEED))}
    return _RESULTS[kernel]


@pytest.mark.parametrize(("kernel", "case_id"),
                         [(k, c["id"]) for k, cases in CASES.items() for c in cases])
def test_kernel_matches_reference_under_interpreter(kernel: str, case_id: str) -> None:
    from kernaudit_pipeline.kernel_spec import load_kernel_module

    tol = load_kernel_module(kernel).TOLERANCE
    r = _results(kernel)[case_id]
    where = f"{kernel}/{case_id} seed={SEED}"
    assert r["in_place"], f"{where}: launch(out=...) did not return the buffer it was given"
    assert r["nan_count"] == 0, f"{where}: {r['nan_count']} poisoned elements never written"
    assert r["rel_l2"] <= tol.max_rel_l2, f"{where}: rel L2 {r['rel_l2']:.3g} > {tol.max_rel_l2}"
    assert r["max_excess"] <= 0.0, (
        f"{where}: an element exceeds atol={tol.atol} + rtol={tol.rtol}·|ref| by "
        f"{r['max_excess']:.3g}")


def test_fp8_kernel_keeps_bf16_output() -> None:
    r = _results("fp8_gemm")["fp8_64x48x160"]
    assert r["out_dtype"] == "torch.bfloat16"


@pytest.mark.parametrize("case_id", [c["id"] for c in CASES["fp8_block_gemm"]])
def test_fp8_block_kernel_matches_the_dequantize_then_matmul_baseline(case_id: str) -> None:
    """The block-scaled kernel writes bf16 and agrees with the PyTorch baseline (both operands
    dequantized to bf16 with their block scales, then matmul) as well as with the fp32
    reference."""
    from kernaudit_pipeline.kernel_spec import load_kernel_module

    tol = load_kernel_module("fp8_block_gemm").TOLERANCE
    r = _results("fp8_block_gemm")[case_id]
    assert r["out_dtype"] == "torch.bfloat16"
    assert r["baseline_rel_l2"] <= tol.max_rel_l2, (
        f"fp8_block_gemm/{case_id} seed={SEED}: rel L2 {r['baseline_rel_l2']:.3g} against the "
        f"baseline > {tol.max_rel_l2}")


if __name__ == "__main__":
    _measure(sys.argv[1], int(sys.argv[2]))
