"""What is particular to ``kernels/heldout/w8a8_int8_gemm.py``: int8 x int8 -> int32 on the tensor
cores with a per-token x scale, a per-channel W scale and a bias in the epilogue. Under Triton's
CPU interpreter (which runs an int8 ``tl.dot`` into an int32 accumulator exactly) on bf16 with
ragged edges and K tails, and on fp32 to float precision; inputs in which every scale and the
bias are visible; the exact reference against the formula; the ``torch._int_mm`` baseline and its
padding; the nn.Linear layout and its unit K strides; the config space; FLOPs, bytes and grid by
hand; real sm_90 compiles (int8 wgmma and mma.sync).

The per-kernel checks (contract, config space, compile args, the JIT specialization
cross-check, one sm_90 compile) run from ``test_kernel_contract.py``, which lists this kernel.

The interpreter cases run in a child process (this file run as a script) with
``TRITON_INTERPRET=1``, as in ``test_kernel_numerics.py``: the variable has to be set before
the kernel module is imported, and the rest of the session keeps compiled kernels.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from kernaudit_pipeline.kernel_spec import Shape, config_id, load_kernel_module, specialize
from tests.kernels import test_kernel_contract as contract
from tests.kernels.support import SMEM_OPTIN_LIMIT_BYTES, aot_compile_sm90, interpreter_child

NAME = "w8a8_int8_gemm"

# The space size and the clean config have one home, the contract tests' tables.
SPACE_SIZE = contract.SPACE_SIZE[NAME]
CLEAN = contract.CLEAN[NAME]

# fp32 output: the integer sums are exact, so the kernel's error is that of the int32 -> fp32
# conversion, two multiplies and an add (a few fp32 ulps); scaled by max(1, |ref|).
FP32_MAX_ERR = 1e-6


def _mod():
    return load_kernel_module(NAME)


def _cfg(bm: int, bn: int, bk: int, group_m: int, warps: int = 4, stages: int = 2) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "num_warps": warps, "num_stages": stages}


def _rel_l2(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref.double()).norm() / ref.double().norm())


def _wrong_layers(inputs: dict) -> dict[str, torch.Tensor]:
    """The layer with one term dropped or misplaced, in float64 from the exact product: what a
    kernel with that bug would compute. Rolling by one row or column gives every element
    another token's or channel's value."""
    acc = inputs["x"].double() @ inputs["w"].double().t()
    xs, ws, b = (inputs[k].double() for k in ("x_scale", "w_scale", "b"))
    return {
        "no_x_scale": acc * ws + b,
        "no_w_scale": acc * xs + b,
        "no_bias": acc * xs * ws,
        "x_scale_of_another_row": acc * xs.roll(1, 0) * ws + b,
        "w_scale_of_another_column": acc * xs * ws.roll(1, 0) + b,
        "bias_of_another_column": acc * xs * ws + b.roll(1, 0),
        "bias_before_the_scales": (acc + b) * xs * ws,
    }


# --------------------------------------------------------------------------------------------
# Numerics under the interpreter
# --------------------------------------------------------------------------------------------
CASES = [
    # M, N and K all ragged: two tile-rows (the second wraps its loads and masks its store),
    # three tile-columns (the last 8 wide), a K tail of 16 after one full step
    {"id": "bf16_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
     "config": _cfg(32, 32, 64, 2), "dtype": "bfloat16", "seed": 1},
    # a decode tile from the space (16 rows, GROUP_M 8 over a single tile-row), K tail 8
    {"id": "bf16_decode_16x96x200", "dims": {"M": 16, "N": 96, "K": 200},
     "config": _cfg(16, 32, 64, 8, 4, 3), "dtype": "bfloat16", "seed": 2},
    # grouped order: 7 tile-rows in groups of 4 and 3, 4 tile-columns (the last 8 wide), a
    # K tail of 2; every tile must be visited once
    {"id": "bf16_grouped_100x200x130", "dims": {"M": 100, "N": 200, "K": 130},
     "config": _cfg(16, 64, 64, 4), "dtype": "bfloat16", "seed": 3},
    # BLOCK_K 256 over K = 100: a single, mostly masked K step; 64-row tile over 40 rows
    {"id": "bf16_bk256_40x48x100", "dims": {"M": 40, "N": 48, "K": 100},
     "config": _cfg(64, 32, 256, 8), "dtype": "bfloat16", "seed": 4},
    # a wgmma-sized tile (64 x 128, BLOCK_K 128) with wrapped rows and columns and K tail 32
    {"id": "bf16_wide_70x300x288", "dims": {"M": 70, "N": 300, "K": 288},
     "config": _cfg(64, 128, 128, 2), "dtype": "bfloat16", "seed": 5},
    # fp32 output and bias: the exact integer sums and the epilogue to float precision
    {"id": "fp32_ragged_50x72x80", "dims": {"M": 50, "N": 72, "K": 80},
     "config": _cfg(32, 32, 64, 2), "dtype": "float32", "seed": 6},
    {"id": "fp32_grouped_100x200x130", "dims": {"M": 100, "N": 200, "K": 130},
     "config": _cfg(16, 64, 64, 4), "dtype": "float32", "seed": 7},
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
        ref = mod.reference(inputs)
        base = mod.baseline(inputs)
        poisoned = torch.full((case["dims"]["M"], case["dims"]["N"]), float("nan"), dtype=dtype)
        out = mod.launch(inputs, case["config"], out=poisoned)
        diff = out.float() - ref
        print(json.dumps({
            "id": case["id"],
            "in_place": out.data_ptr() == poisoned.data_ptr(),
            "out_dtype": str(out.dtype),
            "nan_count": int(torch.isnan(out).sum()),
            "rel_l2": float(diff.norm() / ref.norm()),
            "max_excess": float((diff.abs() - (tol.atol + tol.rtol * ref.abs())).max()),
            "max_scaled_err": float((diff.abs() / ref.abs().clamp_min(1.0)).max()),
            "baseline_rel_l2": _rel_l2(base, ref),
            "baseline_dtype": str(base.dtype),
            # how far the kernel's output is from each wrong layer
            "wrong_rel_l2": {k: _rel_l2(out, v) for k, v in _wrong_layers(inputs).items()},
        }), flush=True)


_RESULTS: dict[str, dict] = {}


def _results() -> dict[str, dict]:
    if not _RESULTS:
        _RESULTS.update({r["id"]: r for r in interpreter_child(__file__)})
    return _RESULTS


@pytest.mark.parametrize("case_id", [c["id"] for c in CASES])
def test_kernel_matches_the_exact_reference_under_interpreter(case_id: str) -> None:
    """Every element written (NaN-poisoned output, written in place) and within TOLERANCE of
    the exact reference; the torch._int_mm baseline on the same inputs too."""
    tol = _mod().TOLERANCE
    r = _results()[case_id]
    dtype = "torch." + next(c["dtype"] for c in CASES if c["id"] == case_id)
    assert r["in_place"], f"{case_id}: launch(out=...) did not return the buffer it was given"
    assert r["nan_count"] == 0, r
    assert r["out_dtype"] == r["baseline_dtype"] == dtype, r
    assert r["rel_l2"] <= tol.max_rel_l2, r
    assert r["max_excess"] <= 0.0, r
    assert r["baseline_rel_l2"] <= tol.max_rel_l2, r


@pytest.mark.parametrize("case_id", [c["id"] for c in CASES if c["dtype"] == "float32"])
def test_fp32_output_is_exact_sums_scaled_to_float_precision(case_id: str) -> None:
    """With an fp32 output there is no bf16 rounding to hide behind: the integer sums must be
    exact and the epilogue right to a few fp32 ulps (the baseline, exact int32 from _int_mm
    and the same fp32 operations, too)."""
    r = _results()[case_id]
    assert r["max_scaled_err"] <= FP32_MAX_ERR, r
    assert r["rel_l2"] <= FP32_MAX_ERR and r["baseline_rel_l2"] <= FP32_MAX_ERR, r


@pytest.mark.parametrize("case_id", [c["id"] for c in CASES])
def test_kernel_output_is_far_from_every_wrong_layer(case_id: str) -> None:
    """The inputs make every term visible: the kernel's output would fail the tolerance against
    the layer with either scale or the bias dropped, taken from another row or column, or
    the bias added before the scales, so a kernel with any of those bugs fails the test above."""
    tol = _mod().TOLERANCE
    wrong = _results()[case_id]["wrong_rel_l2"]
    assert set(wrong) == {"no_x_scale", "no_w_scale", "no_bias", "x_scale_of_another_row",
                          "w_scale_of_another_column", "bias_of_another_column",
                          "bias_before_the_scales"}
    for name, rel in wrong.items():
        assert rel > 5 * tol.max_rel_l2, (case_id, name, rel)


def test_every_term_is_visible_at_the_served_k() -> None:
    """The same at the real K (13824) and M = 16, with the scales as they come out of the
    per-token and per-channel quantization of N(0, 1) and N(0, 1/K) rows: each wrong layer is
    at least 5x the relative L2 tolerance away from the right one."""
    mod = _mod()
    K = mod.SHAPES[0]["K"]
    inputs = mod.make_inputs(Shape("t", {"M": 16, "N": 256, "K": K}), "cpu", 8)
    ref = mod.reference(inputs)
    for name, wrong in _wrong_layers(inputs).items():
        assert _rel_l2(wrong, ref) > 5 * mod.TOLERANCE.max_rel_l2, name
    # realistic magnitudes: token scales ~ |x|max / 127, channel scales ~ 1 / sqrt(K) of that
    assert 5e-3 < float(inputs["x_scale"].min()) and float(inputs["x_scale"].max()) < 0.1
    assert 5e-5 < float(inputs["w_scale"].min()) and float(inputs["w_scale"].max()) < 1e-3
    assert 0.3 < float(ref.std()) < 3.0  # outputs of order 1


# --------------------------------------------------------------------------------------------
# Reference, baseline, inputs
# --------------------------------------------------------------------------------------------
def test_reference_is_the_formula_in_exact_integers() -> None:
    """out[m, n] = (sum_k x[m, k] W[n, k]) x_scale[m] w_scale[n] + b[n], the sum taken in
    Python integers element by element."""
    mod = _mod()
    M, N, K = 5, 7, 67
    inputs = mod.make_inputs(Shape("t", {"M": M, "N": N, "K": K}), "cpu", 9)
    x, w = inputs["x"].tolist(), inputs["w"].tolist()
    xs, ws = inputs["x_scale"][:, 0].tolist(), inputs["w_scale"].tolist()
    b = inputs["b"].double().tolist()
    expected = torch.tensor([[sum(x[m][k] * w[n][k] for k in range(K)) * xs[m] * ws[n] + b[n]
                              for n in range(N)] for m in range(M)], dtype=torch.float64)
    ref = mod.reference(inputs)
    assert ref.dtype == torch.float32 and ref.shape == (M, N)
    assert torch.allclose(ref.double(), expected, rtol=1e-6, atol=1e-7)


def test_inputs_are_per_token_and_per_channel_int8_quantizations() -> None:
    """int8 values in [-127, 127] with every row's extreme at +-127 (absmax scaling), fp32
    scales (M, 1) and (N,) that differ between rows, a bf16 bias; seeded, so the same seed gives
    the same inputs."""
    mod = _mod()
    shape = Shape("t", {"M": 33, "N": 40, "K": 96})
    inputs = mod.make_inputs(shape, "cpu", 10)
    assert inputs["x"].dtype == inputs["w"].dtype == torch.int8
    assert inputs["x_scale"].dtype == inputs["w_scale"].dtype == torch.float32
    assert inputs["b"].dtype == torch.bfloat16
    assert inputs["x_scale"].shape == (33, 1) and inputs["w_scale"].shape == (40,)
    for q in (inputs["x"], inputs["w"]):
        assert int(q.min()) >= -127 and int(q.max()) <= 127
        assert torch.all(q.int().abs().amax(dim=1) == 127)
    for s in (inputs["x_scale"], inputs["w_scale"]):
        assert float(s.min()) > 0 and float(s.max() / s.min()) > 1.5
    again = mod.make_inputs(shape, "cpu", 10)
    assert all(torch.equal(inputs[k], again[k]) for k in inputs)
    assert not torch.equal(inputs["x"], mod.make_inputs(shape, "cpu", 11)["x"])


@pytest.mark.parametrize("dims", [
    {"M": 16, "N": 40, "K": 96},   # the M = 16 bucket: x padded to 32 rows
    {"M": 5, "N": 40, "K": 96},    # fewer rows still
    {"M": 33, "N": 40, "K": 96},   # no padding at all
    {"M": 9, "N": 45, "K": 130},   # K and N no multiple of 8: padded with zeros too
], ids=lambda d: "x".join(str(v) for v in d.values()))
def test_baseline_is_int_mm_then_elementwise_scaling(dims: dict) -> None:
    """``int_mm`` is the exact integer product whatever padding CUDA's _int_mm would need, and
    the baseline (it, times both scales, plus the bias, cast to bf16) is within tolerance of the
    exact reference."""
    mod = _mod()
    inputs = mod.make_inputs(Shape("t", dims), "cpu", 12)
    acc = mod.int_mm(inputs["x"], inputs["w"])
    assert acc.dtype == torch.int32 and acc.shape == (dims["M"], dims["N"])
    assert torch.equal(acc.long(), inputs["x"].long() @ inputs["w"].long().t())
    out, ref = mod.baseline(inputs), mod.reference(inputs)
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    assert _rel_l2(out, ref) <= mod.TOLERANCE.max_rel_l2
    tol = mod.TOLERANCE
    assert torch.all((out.float() - ref).abs() <= tol.atol + tol.rtol * ref.abs())


def test_baseline_names_its_library_and_the_m16_padding() -> None:
    mod = _mod()
    assert [r.key for r in mod.REFERENCES] == [None]
    primary = mod.REFERENCES[0]
    assert primary.fn is mod.baseline and primary.name == mod.BASELINE_NAME
    assert primary.backend == "cuBLAS int8 GEMM (torch._int_mm) + PyTorch elementwise scaling"
    assert "torch._int_mm" in mod.BASELINE_NAME and "padded to 32 rows" in mod.BASELINE_NAME
    # CUDA's _int_mm refuses M <= 16; the padding takes every declared shape past it
    assert mod.INT_MM_MIN_ROWS == 17 and mod.INT_MM_PAD_ROWS >= mod.INT_MM_MIN_ROWS
    assert all(s["K"] % 8 == 0 and s["N"] % 8 == 0 for s in mod.SHAPES)


def test_weight_is_nn_linear_layout_and_inputs_must_chain() -> None:
    mod = _mod()
    inputs = mod.make_inputs(Shape("t", {"M": 16, "N": 32, "K": 256}), "meta", 0)
    assert inputs["x"].shape == (16, 256) and inputs["x"].stride() == (256, 1)
    assert inputs["w"].shape == (32, 256) and inputs["w"].stride() == (256, 1)  # (N, K)
    assert inputs["x_scale"].shape == (16, 1) and inputs["w_scale"].shape == (32,)
    assert inputs["b"].shape == (32,)
    args = mod.kernel_args(inputs, CLEAN)
    assert (args["stride_wn"], args["stride_wk"]) == (256, 1)
    assert args["out_ptr"].dtype == torch.bfloat16 and args["out_ptr"].shape == (16, 32)
    bad = {
        "b": inputs["b"][:16],
        "w": inputs["w"][:, :128],
        "x_scale": inputs["x_scale"].view(16),  # one scale per token, as (M, 1)
        "w_scale": inputs["w_scale"][:16],
        "x": torch.empty((16, 256), device="meta", dtype=torch.bfloat16),
    }
    for key, value in bad.items():
        with pytest.raises(ValueError, match="do not chain"):
            mod.kernel_args({**inputs, key: value}, CLEAN)
    with pytest.raises(ValueError, match="do not chain"):  # a (K, N) weight is refused
        mod.kernel_args({**inputs, "w": torch.empty((256, 32), device="meta",
                                                    dtype=torch.int8)}, CLEAN)


# --------------------------------------------------------------------------------------------
# The contract, specialization, config space, roofline
# --------------------------------------------------------------------------------------------
def test_compile_args_make_the_unit_k_strides_constexpr_like_the_jit() -> None:
    """At every real shape, the K strides of x and W and the N stride of out are 1, so the
    static audit compiles them as constexpr 1 as the JIT does at launch; the row strides
    (13824 for x and W, 5120 for out) are runtime ints marked divisible by 16."""
    mod = _mod()
    params = [p.name for p in mod.KERNEL.params]
    for shape in mod.SHAPES:
        spec = specialize(mod.KERNEL, mod.compile_args(shape, CLEAN))
        for name in ("stride_xk", "stride_wk", "stride_on"):
            assert spec.signature[name] == "constexpr" and spec.constexprs[name] == 1, name
        for name in ("stride_xm", "stride_wn", "stride_om", "K", "N", "M"):
            assert spec.signature[name] == "i32", name
            assert spec.attrs[(params.index(name),)] == [["tt.divisibility", 16]], name
        assert [spec.signature[n] for n in ("x_ptr", "w_ptr", "xs_ptr", "ws_ptr", "b_ptr",
                                            "out_ptr")] == ["*i8", "*i8", "*fp32", "*fp32",
                                                            "*bf16", "*bf16"]


def test_space_is_a_tuning_sweep_with_spills_and_smem_overflows() -> None:
    """The axes of a Triton-autotune / vLLM-benchmark sweep, every tile but 256 x 256, built
    deterministically; most configs launchable, a few pipelines over the shared-memory limit
    and some accumulators that spill, as the contract wants; GROUP_M swept on part of it."""
    mod = _mod()
    cfgs = mod.CONFIGS
    assert SPACE_SIZE == (380, 440) and SPACE_SIZE[0] <= len(cfgs) <= SPACE_SIZE[1]
    assert len(cfgs) == 418
    ids = [config_id(c) for c in cfgs]
    assert len(set(ids)) == len(ids)
    assert mod._space() == cfgs  # no randomness: the same list on every import
    assert ids[0] == "BK64_BM16_BN32_GM8_s3_w4"
    assert "BK128_BM128_BN256_GM8_s4_w8" in ids
    assert CLEAN in cfgs
    assert {c["BLOCK_M"] for c in cfgs} == {16, 32, 64, 128, 256}
    assert {c["BLOCK_N"] for c in cfgs} == {32, 64, 128, 256}
    assert {c["BLOCK_K"] for c in cfgs} == {64, 128, 256}  # int8 MMAs step K by 32
    assert {c["GROUP_M"] for c in cfgs} == {1, 8, 16, 32, 64}
    assert {c["num_warps"] for c in cfgs} == {4, 8}
    assert {c["num_stages"] for c in cfgs} == {2, 3, 4, 5}
    assert all(c["BLOCK_M"] * c["BLOCK_N"] <= 128 * 256 for c in cfgs)
    # one-byte operands: (BLOCK_M + BLOCK_N) * BLOCK_K bytes a stage
    smem = [c["num_stages"] * (c["BLOCK_M"] + c["BLOCK_N"]) * c["BLOCK_K"] for c in cfgs]
    assert sum(b > SMEM_OPTIN_LIMIT_BYTES for b in smem) == 10
    assert max(smem) <= mod.SMEM_CAP
    acc_regs = [c["BLOCK_M"] * c["BLOCK_N"] // (32 * c["num_warps"]) for c in cfgs]
    assert sum(r >= 256 for r in acc_regs) == 16
    launchable = [b <= SMEM_OPTIN_LIMIT_BYTES and r < 256 for b, r in zip(smem, acc_regs)]
    assert sum(launchable) >= 0.9 * len(cfgs)
    # The GROUP_M sweep: each value other than 8 on the same 14 tiles at BLOCK_K 128, 4 stages.
    for group_m in (1, 16, 32, 64):
        swept = [c for c in cfgs if c["GROUP_M"] == group_m]
        assert len(swept) == 14
        assert all(c["BLOCK_K"] == 128 and c["num_stages"] == 4 for c in swept)


def test_shapes_are_qwen2_5_32b_down_proj_at_tp2() -> None:
    """K = 27648 / 2 and N = 5120, multiples of 256, and an int8 weight (70.8 MB) larger than
    the 50 MB L2 of an H100 or H200."""
    mod = _mod()
    assert [s.name for s in mod.SHAPES] == [f"qwen2_5_32b_tp2_down_proj_m{m}"
                                            for m in (16, 128, 1024, 4096)]
    assert [s["M"] for s in mod.SHAPES] == [16, 128, 1024, 4096]
    assert {(s["N"], s["K"]) for s in mod.SHAPES} == {(5120, 27648 // 2)}
    assert all(s["N"] % 256 == 0 and s["K"] % 256 == 0 for s in mod.SHAPES)
    assert mod.SHAPES[0]["N"] * mod.SHAPES[0]["K"] > 50 * 2**20
    assert [s.phase for s in mod.SHAPES] == ["decode", "decode", "prefill", "prefill"]


def test_flops_bytes_and_grid_by_hand() -> None:
    from kernaudit_pipeline.static_resources.describe import bilinear_terms

    mod = _mod()
    m16, m4096 = mod.SHAPES[0], mod.SHAPES[-1]
    assert mod.flops(m4096) == 579_820_584_960       # 2·4096·5120·13824
    assert mod.flops(m16) == 2_264_924_160            # 2·16·5120·13824
    # x 1 B·4096·13824 + W 1 B·5120·13824 + fp32 scales 4 B·(4096 + 5120) + bf16 b 2 B·5120
    # + bf16 out 2 B·4096·5120
    assert mod.bytes_moved(m4096) == (56_623_104 + 70_778_880 + 36_864 + 10_240
                                      + 41_943_040)
    # at M = 16 the weight is 99.5 % of it
    assert mod.bytes_moved(m16) == 221_184 + 70_778_880 + 20_544 + 10_240 + 163_840
    assert bilinear_terms(mod.bytes_moved, m16) == {("K", "M"): 1.0, ("K", "N"): 1.0,
                                                   ("M", "N"): 2.0}
    assert mod.grid(m16, {"BLOCK_M": 16, "BLOCK_N": 64}) == (1 * 80,)
    assert mod.grid(m16, {"BLOCK_M": 64, "BLOCK_N": 128}) == (1 * 40,)  # rows wrap
    assert mod.grid(m4096, {"BLOCK_M": 128, "BLOCK_N": 256}) == (32 * 20,)


# --------------------------------------------------------------------------------------------
# Real ahead-of-time compiles for sm_90
# --------------------------------------------------------------------------------------------
def _compile(cfg: dict, shape_index: int = -1):
    mod = _mod()
    assert cfg in mod.CONFIGS
    return aot_compile_sm90(mod, cfg, mod.SHAPES[shape_index])


@pytest.mark.slow
@pytest.mark.parametrize(("cfg", "spills"), [
    # the strong Hopper tile: two warpgroups of int8 wgmma, 128-register accumulator, fits
    (_cfg(128, 256, 128, 8, 8, 4), False),
    # a decode tile on mma.sync (m16n8k32 s8), four stages of BLOCK_K 128
    (_cfg(16, 64, 128, 8, 4, 4), False),
    # the same 128 x 256 tile on 4 warps: 256 accumulator registers per thread, so it spills
    (_cfg(128, 256, 128, 8, 4, 4), True),
], ids=lambda v: config_id(v) if isinstance(v, dict) else ("spills" if v else "fits"))
def test_aot_compile_for_sm90(cfg: dict, spills: bool) -> None:
    """At M = 4096: int8 tensor-core MMAs into int32 (wgmma from 64 rows, mma.sync below), the
    int32 -> fp32 conversion of the epilogue, the cp.async pipeline's shared memory as sized
    (one byte an element), and a stack frame exactly where the accumulator cannot fit."""
    ck = _compile(cfg)
    ptx = ck.asm["ptx"]
    if cfg["BLOCK_M"] >= 64:
        assert "wgmma.mma_async" in ptx and ".s32.s8.s8" in ptx
    else:
        assert "wgmma" not in ptx and "mma.sync" in ptx and ".s32.s8.s8.s32" in ptx
    assert "cvt.rn.f32.s32" in ptx, "the accumulator is not converted from int32"
    assert "cp.async" in ptx
    # num_stages x and W buffers on the wgmma path, one fewer on mma.sync (kernels/README.md)
    buffers = cfg["num_stages"] - (cfg["BLOCK_M"] < 64)
    tile_bytes = (cfg["BLOCK_M"] + cfg["BLOCK_N"]) * cfg["BLOCK_K"]
    assert buffers * tile_bytes <= ck.metadata.shared <= SMEM_OPTIN_LIMIT_BYTES
    usage = contract._resource_usage(ck.asm["cubin"])
    assert ("STACK:0 " not in usage) == spills, usage


if __name__ == "__main__":
    _measure()
