"""What is particular to ``kernels/heldout/bias_gelu_gemm.py``: the fused bias + GELU (tanh)
epilogue under Triton's CPU interpreter, on fp16 with ragged edges and on fp32 tightly enough
to tell the tanh GELU from the erf one; the reference against the formula; the nn.Linear
layout and its unit K strides; the config space; FLOPs, bytes and grid by hand; real sm_90
compiles.

The per-kernel checks (contract, config space, compile args, the JIT specialization
cross-check, one sm_90 compile) run from ``test_kernel_contract.py``, which lists this kernel.

The interpreter cases run in a child process (this file run as a script) with
``TRITON_INTERPRET=1``, as in ``test_kernel_numerics.py``: the variable has to be set before
the kernel module is imported, and the rest of the session keeps compiled kernels.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from kernaudit_pipeline.kernel_spec import Shape, config_id, load_kernel_module, specialize
from tests.kernels import test_kernel_contract as contract
from tests.kernels.support import SMEM_OPTIN_LIMIT_BYTES, aot_compile_sm90, interpreter_child

NAME = "bias_gelu_gemm"

# The space size and the clean config have one home, the contract tests' tables.
SPACE_SIZE = contract.SPACE_SIZE[NAME]
CLEAN = contract.CLEAN[NAME]

# fp32 runs of the interpreter agree with the fp32 reference to about 1e-6 (sums of at most
# 130 products); the erf GELU differs from the tanh one by up to 4.7e-4 (near |z| = 2.7).
FP32_MAX_ERR = 2e-5


def _mod():
    return load_kernel_module(NAME)


def _cfg(bm: int, bn: int, bk: int, group_m: int, warps: int = 4, stages: int = 2) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "num_warps": warps, "num_stages": stages}


# --------------------------------------------------------------------------------------------
# Numerics under the interpreter
# --------------------------------------------------------------------------------------------
CASES = [
    # M, N and K all ragged: two tile-rows (the second wraps its loads and masks its store),
    # three tile-columns (the last 8 wide), a K tail of 16
    {"id": "fp16_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
     "config": _cfg(32, 32, 32, 2), "dtype": "float16", "seed": 1},
    # a decode tile from the space (16 rows, GROUP_M 8 over a single tile-row), K tail 32
    {"id": "fp16_decode_16x96x160", "dims": {"M": 16, "N": 96, "K": 160},
     "config": _cfg(16, 32, 64, 8, 4, 3), "dtype": "float16", "seed": 2},
    # grouped order: 7 tile-rows in groups of 4 and 3, 4 tile-columns (the last 8 wide), a
    # K tail of 2; every tile must be visited once
    {"id": "fp16_grouped_100x200x130", "dims": {"M": 100, "N": 200, "K": 130},
     "config": _cfg(16, 64, 32, 4), "dtype": "float16", "seed": 3},
    # fp32 end to end: the epilogue is checked to float precision (FP32_MAX_ERR)
    {"id": "fp32_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
     "config": _cfg(32, 32, 32, 2), "dtype": "float32", "seed": 4},
    # fp32 with x scaled by 8: pre-activations out to |z| ~ 30, where sigmoid(2u) saturates
    # (exp overflows to inf for z << 0); the output must be z or 0 there, never NaN
    {"id": "fp32_saturated_40x48x64", "dims": {"M": 40, "N": 48, "K": 64},
     "config": _cfg(16, 32, 32, 2), "dtype": "float32", "seed": 5, "x_scale": 8.0},
]


def _measure() -> None:
    """Child process: run every case and print one JSON line per case."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    mod = _mod()
    tol = mod.TOLERANCE
    for case in CASES:
        dtype = getattr(torch, case["dtype"])
        inputs = mod.make_inputs(Shape(case["id"], case["dims"]), "cpu", case["seed"],
                                 dtype=dtype)
        if "x_scale" in case:
            inputs["x"] = inputs["x"] * case["x_scale"]
        ref = mod.reference(inputs)
        z = torch.nn.functional.linear(inputs["x"].double(), inputs["w"].double(),
                                       inputs["b"].double())
        base = mod.baseline(inputs)
        poisoned = torch.full((case["dims"]["M"], case["dims"]["N"]), float("nan"), dtype=dtype)
        out = mod.launch(inputs, case["config"], out=poisoned)
        diff = out.float() - ref
        print(json.dumps({
            "id": case["id"],
            "in_place": out.data_ptr() == poisoned.data_ptr(),
            "out_dtype": str(out.dtype),
            "nan_count": int(torch.isnan(out).sum()),
            "inf_count": int(torch.isinf(out).sum()),
            "rel_l2": float(diff.norm() / ref.norm()),
            "max_excess": float((diff.abs() - (tol.atol + tol.rtol * ref.abs())).max()),
            # error scaled by max(1, |ref|): absolute near 0, relative for large outputs
            "max_scaled_err": float((diff.abs() / ref.abs().clamp_min(1.0)).max()),
            "baseline_rel_l2": float((base.float() - ref).norm() / ref.norm()),
            "z_min": float(z.min()), "z_max": float(z.max()),
        }), flush=True)


_RESULTS: dict[str, dict] = {}


def _results() -> dict[str, dict]:
    if not _RESULTS:
        _RESULTS.update({r["id"]: r for r in interpreter_child(__file__)})
    return _RESULTS


@pytest.mark.parametrize("case_id", [c["id"] for c in CASES])
def test_kernel_matches_reference_under_interpreter(case_id: str) -> None:
    """Every element written (NaN-poisoned output, written in place) and within TOLERANCE of
    the fp32 reference; the unfused baseline on the same inputs too."""
    tol = _mod().TOLERANCE
    r = _results()[case_id]
    assert r["in_place"], f"{case_id}: launch(out=...) did not return the buffer it was given"
    assert r["nan_count"] == 0 and r["inf_count"] == 0, r
    assert r["out_dtype"] == "torch." + next(c["dtype"] for c in CASES if c["id"] == case_id)
    assert r["rel_l2"] <= tol.max_rel_l2, r
    assert r["max_excess"] <= 0.0, r
    assert r["baseline_rel_l2"] <= tol.max_rel_l2, r


@pytest.mark.parametrize("case_id", [c["id"] for c in CASES if c["dtype"] == "float32"])
def test_fp32_epilogue_is_the_tanh_gelu_to_float_precision(case_id: str) -> None:
    """On fp32 the kernel matches the fp32 reference to FP32_MAX_ERR (scaled by max(1, |ref|)).
    A 16-bit output cannot tell the erf GELU from the tanh one (they differ by at most 4.7e-4,
    under half an fp16 ulp at |z| = 2.7); this can, and catches a wrong constant or a lost
    bias as well."""
    r = _results()[case_id]
    assert r["max_scaled_err"] <= FP32_MAX_ERR, r
    assert r["z_min"] < -2.7 and r["z_max"] > 2.7, "the inputs miss GELU's curved region"


def test_saturated_gelu_stays_finite() -> None:
    """Pre-activations far past GELU's knee: the kernel writes z or 0 there, never NaN."""
    r = _results()["fp32_saturated_40x48x64"]
    assert r["z_min"] < -20 and r["z_max"] > 20, r
    assert r["nan_count"] == 0 and r["inf_count"] == 0 and r["max_scaled_err"] <= FP32_MAX_ERR


# --------------------------------------------------------------------------------------------
# Reference, baseline, inputs
# --------------------------------------------------------------------------------------------
def test_reference_is_the_formula_with_the_bias_per_output_column() -> None:
    """out[m, n] = gelu_tanh(sum_k x[m, k] W[n, k] + b[n]), written out in float64 element by
    element from the formula 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))."""
    mod = _mod()
    M, N, K = 5, 7, 33
    inputs = mod.make_inputs(Shape("t", {"M": M, "N": N, "K": K}), "cpu", 6)
    x, w, b = (inputs[k].double() for k in ("x", "w", "b"))
    c = math.sqrt(2.0 / math.pi)
    expected = torch.empty((M, N), dtype=torch.float64)
    for m in range(M):
        for n in range(N):
            z = float(sum(x[m, k] * w[n, k] for k in range(K)) + b[n])
            expected[m, n] = 0.5 * z * (1.0 + math.tanh(c * (z + 0.044715 * z ** 3)))
    ref = mod.reference(inputs)
    assert ref.dtype == torch.float32 and ref.shape == (M, N)
    assert torch.allclose(ref.double(), expected, rtol=1e-5, atol=1e-6)
    # The bias is no small correction: leaving it out moves the output far past TOLERANCE.
    no_bias = mod.reference({**inputs, "b": torch.zeros_like(inputs["b"])})
    assert float((no_bias - ref).norm() / ref.norm()) > 10 * mod.TOLERANCE.max_rel_l2


def test_baseline_is_the_unfused_bf16_layer() -> None:
    mod = _mod()
    inputs = mod.make_inputs(Shape("t", {"M": 33, "N": 40, "K": 96}), "cpu", 7)
    assert all(inputs[k].dtype == torch.bfloat16 for k in ("x", "w", "b"))
    out, ref = mod.baseline(inputs), mod.reference(inputs)
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape == (33, 40)
    assert float((out.float() - ref).norm() / ref.norm()) <= mod.TOLERANCE.max_rel_l2
    assert [r.key for r in mod.REFERENCES] == [None]
    assert mod.REFERENCES[0].fn is mod.baseline and mod.REFERENCES[0].name == mod.BASELINE_NAME


def test_weight_is_nn_linear_layout_and_inputs_must_chain() -> None:
    mod = _mod()
    inputs = mod.make_inputs(Shape("t", {"M": 16, "N": 32, "K": 256}), "meta", 0)
    assert inputs["x"].shape == (16, 256) and inputs["x"].stride() == (256, 1)
    assert inputs["w"].shape == (32, 256) and inputs["w"].stride() == (256, 1)  # (N, K)
    assert inputs["b"].shape == (32,)
    args = mod.kernel_args(inputs, CLEAN)
    assert (args["stride_wn"], args["stride_wk"]) == (256, 1)
    with pytest.raises(ValueError, match="do not chain"):
        mod.kernel_args({**inputs, "b": inputs["b"][:16]}, CLEAN)
    with pytest.raises(ValueError, match="do not chain"):
        mod.kernel_args({**inputs, "w": inputs["w"][:, :128]}, CLEAN)
    with pytest.raises(ValueError, match="do not chain"):  # a (K, N) weight is refused
        mod.kernel_args({**inputs, "w": torch.empty((256, 32), device="meta")}, CLEAN)


# --------------------------------------------------------------------------------------------
# The contract, specialization, config space, roofline
# --------------------------------------------------------------------------------------------
def test_compile_args_make_the_unit_k_strides_constexpr_like_the_jit() -> None:
    """At every real shape, the K strides of x and W and the N stride of out are 1, so the
    static audit compiles them as constexpr 1 as the JIT does at launch; the row strides
    (6144 for x and W, 12288 for out) are runtime ints marked divisible by 16."""
    mod = _mod()
    params = [p.name for p in mod.KERNEL.params]
    for shape in mod.SHAPES:
        spec = specialize(mod.KERNEL, mod.compile_args(shape, CLEAN))
        for name in ("stride_xk", "stride_wk", "stride_on"):
            assert spec.signature[name] == "constexpr" and spec.constexprs[name] == 1, name
        for name in ("stride_xm", "stride_wn", "stride_om", "K", "N"):
            assert spec.signature[name] == "i32", name
            assert spec.attrs[(params.index(name),)] == [["tt.divisibility", 16]], name
        for name in ("x_ptr", "w_ptr", "b_ptr", "out_ptr"):
            assert spec.signature[name] == "*bf16"


def test_space_is_a_tuning_sweep_with_spills_and_smem_overflows() -> None:
    """The axes of a Triton-autotune / vLLM-benchmark sweep, every tile but 256 x 256, built
    deterministically; some pipelines over the shared-memory limit and some accumulators that
    spill, as the contract wants; GROUP_M swept on part of it."""
    mod = _mod()
    cfgs = mod.CONFIGS
    assert SPACE_SIZE[0] <= len(cfgs) <= SPACE_SIZE[1]
    ids = [config_id(c) for c in cfgs]
    assert len(set(ids)) == len(ids)
    assert mod._space() == cfgs  # no randomness: the same list on every import
    assert ids[0] == "BK32_BM16_BN32_GM8_s3_w4"
    assert CLEAN in cfgs
    assert {c["BLOCK_M"] for c in cfgs} == {16, 32, 64, 128, 256}
    assert {c["BLOCK_N"] for c in cfgs} == {32, 64, 128, 256}
    assert {c["BLOCK_K"] for c in cfgs} == {32, 64, 128, 256}
    assert {c["GROUP_M"] for c in cfgs} == {1, 8, 16, 32, 64}
    assert {c["num_warps"] for c in cfgs} == {4, 8}
    assert {c["num_stages"] for c in cfgs} == {2, 3, 4, 5}
    assert all(c["BLOCK_M"] * c["BLOCK_N"] <= 128 * 256 for c in cfgs)
    smem = [c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] * 2 for c in cfgs]
    assert 10 <= sum(b > SMEM_OPTIN_LIMIT_BYTES for b in smem) <= 40
    assert max(smem) <= mod.SMEM_CAP
    acc_regs = [c["BLOCK_M"] * c["BLOCK_N"] // (32 * c["num_warps"]) for c in cfgs]
    assert sum(r >= 256 for r in acc_regs) >= 10
    # The GROUP_M sweep: each value other than 8 on the same 14 tiles at BLOCK_K 64, 3 stages.
    for group_m in (1, 16, 32, 64):
        swept = [c for c in cfgs if c["GROUP_M"] == group_m]
        assert len(swept) == 14
        assert all(c["BLOCK_K"] == 64 and c["num_stages"] == 3 for c in swept)


def test_shapes_are_starcoder2_15b_c_fc_at_tp2() -> None:
    mod = _mod()
    assert [s.name for s in mod.SHAPES] == [f"starcoder2_15b_tp2_fc1_m{m}"
                                            for m in (16, 128, 1024, 4096)]
    assert [s["M"] for s in mod.SHAPES] == [16, 128, 1024, 4096]
    assert {(s["N"], s["K"]) for s in mod.SHAPES} == {(24576 // 2, 6144)}
    assert [s.phase for s in mod.SHAPES] == ["decode", "decode", "prefill", "prefill"]


def test_flops_bytes_and_grid_by_hand() -> None:
    from kernaudit_pipeline.static_resources.describe import bilinear_terms

    mod = _mod()
    m16, m4096 = mod.SHAPES[0], mod.SHAPES[-1]
    assert mod.flops(m4096) == 618_475_290_624       # 2·4096·12288·6144
    assert mod.flops(m16) == 2_415_919_104            # 2·16·12288·6144
    # 2 B·(x 4096·6144 + W 12288·6144 + b 12288 + out 4096·12288)
    assert mod.bytes_moved(m4096) == 50_331_648 + 150_994_944 + 24_576 + 100_663_296
    # at M = 16 the weight is 99.6 % of it
    assert mod.bytes_moved(m16) == 196_608 + 150_994_944 + 24_576 + 393_216
    assert bilinear_terms(mod.bytes_moved, m16) == {("K", "M"): 2.0, ("K", "N"): 2.0,
                                                   ("M", "N"): 2.0}
    assert mod.grid(m16, {"BLOCK_M": 16, "BLOCK_N": 64}) == (1 * 192,)
    assert mod.grid(m16, {"BLOCK_M": 64, "BLOCK_N": 128}) == (1 * 96,)  # rows wrap
    assert mod.grid(m4096, {"BLOCK_M": 128, "BLOCK_N": 256}) == (32 * 48,)


# --------------------------------------------------------------------------------------------
# Real ahead-of-time compiles for sm_90
# --------------------------------------------------------------------------------------------
def _compile(cfg: dict, shape_index: int = -1):
    mod = _mod()
    assert cfg in mod.CONFIGS
    return aot_compile_sm90(mod, cfg, mod.SHAPES[shape_index])


@pytest.mark.slow
@pytest.mark.parametrize(("cfg", "spills"), [
    # the strong Hopper tile: two warpgroups of wgmma, 128-register accumulator, fits
    (_cfg(128, 256, 64, 8, 8, 3), False),
    # a decode tile on mma.sync, four stages of BLOCK_K 128
    (_cfg(16, 64, 128, 8, 4, 4), False),
    # the same 128 x 256 tile on 4 warps: 256 accumulator registers per thread, so it spills
    (_cfg(128, 256, 64, 8, 4, 3), True),
], ids=lambda v: config_id(v) if isinstance(v, dict) else ("spills" if v else "fits"))
def test_aot_compile_for_sm90(cfg: dict, spills: bool) -> None:
    """At M = 4096: wgmma from 64 rows and mma.sync below, the cp.async pipeline's shared
    memory as sized, the epilogue's exp (ex2) in the PTX, and a stack frame exactly where the
    accumulator cannot fit in registers."""
    ck = _compile(cfg)
    ptx = ck.asm["ptx"]
    assert ("wgmma" in ptx) == (cfg["BLOCK_M"] >= 64)
    assert "mma" in ptx and "cp.async" in ptx
    assert "ex2" in ptx, "the GELU's exp is missing from the epilogue"
    # num_stages x and W buffers on the wgmma path, one fewer on mma.sync (kernels/README.md)
    buffers = cfg["num_stages"] - (cfg["BLOCK_M"] < 64)
    tile_bytes = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"] * 2
    assert buffers * tile_bytes <= ck.metadata.shared <= SMEM_OPTIN_LIMIT_BYTES
    usage = contract._resource_usage(ck.asm["cubin"])
    assert ("STACK:0 " not in usage) == spills, usage


if __name__ == "__main__":
    _measure()
