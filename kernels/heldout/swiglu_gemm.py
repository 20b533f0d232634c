"""Fused SwiGLU gate/up projection, out = silu(x @ W_gate) * (x @ W_up): the first half of every
Llama MLP, in one kernel.

Each program computes one BLOCK_M x BLOCK_N tile of the output. It streams the same x tile
against the matching tiles of both weights, keeps two fp32 accumulators (gate and up) and
applies silu(gate) * up in registers before the single bf16 store, so neither intermediate
ever reaches memory. Programs are numbered in groups of GROUP_M tile-rows (the Triton matmul
tutorial's grouped order) so that neighbouring programs share weight panels while they sit in
L2. On sm_90 ``tl.dot`` lowers to wgmma (BLOCK_M >= 64) and ``num_stages`` sets the depth of
the asynchronous global->shared pipeline.

What the config space has to trade: the two accumulators double the register cost of a tile
(BLOCK_M*BLOCK_N*2 fp32 values over 32*num_warps threads), and each pipeline stage holds one x
tile and two weight tiles of shared memory. So 128x128 spills on 4 warps and fits on 8, and
deep pipelines of wide tiles exceed the 227 KiB a block may use.

Baseline: the unfused PyTorch composition ``F.silu(x @ W_gate) * (x @ W_up)`` in bf16: two
cuBLAS matmuls (``torch.matmul``) and two elementwise kernels (silu, then the product), with
both (M, N) intermediates written to and read back from memory. Reference: the same
composition in fp32.

The shapes are Llama-3-8B's gate/up projection (hidden K = 4096, intermediate N = 14336) at
four batch-token counts M, the M buckets vLLM tunes per: 16 and 128 (decode, memory-bound on
the weights), 1024 and 4096 (prefill, compute-bound).

This kernel is held out from the cost model's calibration (``kernaudit_pipeline.rank``): it is
the "kernel you did not tune on" of the model's validation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernaudit_pipeline.kernel_spec import Ptr, Shape, Tolerance

NAME = "swiglu_gemm"
DTYPE = "bf16"
BASELINE_NAME = "torch.matmul x2 + silu * up (cuBLAS, unfused)"


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------
@triton.jit
def swiglu_gemm_kernel(
    x_ptr, wg_ptr, wu_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_xk,
    stride_wk, stride_wn,  # W_gate and W_up share one layout
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # Grouped ordering: walk GROUP_M tile-rows down one tile-column before moving right, so a
    # wave of programs reuses the same weight panels from L2.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # Rows/columns past the edge wrap around (% M, % N): the loads stay unmasked in M and N and
    # the final store is masked instead.
    offs_xm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_wn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + (offs_xm[:, None] * stride_xm + offs_k[None, :] * stride_xk)
    w_offs = offs_k[:, None] * stride_wk + offs_wn[None, :] * stride_wn
    wg_ptrs = wg_ptr + w_offs
    wu_ptrs = wu_ptr + w_offs

    # One x tile feeds both products: the fusion saves reading x twice and writing, then
    # re-reading, the two (M, N) intermediates.
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_remaining = K - k * BLOCK_K
        x = tl.load(x_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
        wg = tl.load(wg_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        wu = tl.load(wu_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        acc_gate = tl.dot(x, wg, acc_gate)
        acc_up = tl.dot(x, wu, acc_up)
        x_ptrs += BLOCK_K * stride_xk
        wg_ptrs += BLOCK_K * stride_wk
        wu_ptrs += BLOCK_K * stride_wk

    # SwiGLU in fp32, one rounding to the output type.
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up
    out = h.to(out_ptr.dtype.element_ty)
    offs_om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_ptr + stride_om * offs_om[:, None] + stride_on * offs_on[None, :]
    out_mask = (offs_om[:, None] < M) & (offs_on[None, :] < N)
    tl.store(out_ptrs, out, mask=out_mask)


KERNEL = swiglu_gemm_kernel


# --------------------------------------------------------------------------------------------
# The launcher
# --------------------------------------------------------------------------------------------
_TRITON_DTYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _ptr(t: torch.Tensor) -> Ptr:
    return Ptr(_TRITON_DTYPE[t.dtype], aligned=t.data_ptr() % 16 == 0)


def _tile_args(config: dict) -> dict[str, int]:
    return {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}


def _grid(M: int, N: int, config: dict) -> tuple[int, ...]:
    return (triton.cdiv(M, config["BLOCK_M"]) * triton.cdiv(N, config["BLOCK_N"]),)


def _empty_out(inputs: dict) -> torch.Tensor:
    x, wg = inputs["x"], inputs["w_gate"]
    return torch.empty((x.shape[0], wg.shape[1]), device=x.device, dtype=x.dtype)


def kernel_args(inputs: dict, config: dict,
                out: torch.Tensor | None = None) -> dict[str, object]:
    """Every ``KERNEL`` argument by name; ``launch`` and ``compile_args`` both derive from it,
    so the static audit compiles exactly what the GPU runs."""
    x, wg, wu = inputs["x"], inputs["w_gate"], inputs["w_up"]
    if wg.shape != wu.shape or wg.stride() != wu.stride():
        raise ValueError("W_gate and W_up must have the same shape and layout")
    M, K = x.shape
    N = wg.shape[1]
    if out is None:
        out = _empty_out(inputs)
    return {
        "x_ptr": x, "wg_ptr": wg, "wu_ptr": wu, "out_ptr": out,
        "M": M, "N": N, "K": K,
        "stride_xm": x.stride(0), "stride_xk": x.stride(1),
        "stride_wk": wg.stride(0), "stride_wn": wg.stride(1),
        "stride_om": out.stride(0), "stride_on": out.stride(1),
        **_tile_args(config),
    }


def launch(inputs: dict, config: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    args = kernel_args(inputs, config, out)
    swiglu_gemm_kernel[_grid(args["M"], args["N"], config)](
        **args, num_warps=config["num_warps"], num_stages=config["num_stages"])
    return args["out_ptr"]


# --------------------------------------------------------------------------------------------
# Inputs, baseline, reference
# --------------------------------------------------------------------------------------------
def make_inputs(shape: Shape, device: str, seed: int,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """x, W_gate, W_up ~ N(0, K^-1/2), so both projections are ~N(0, 1) whatever K is.

    ``dtype`` exists for the CPU interpreter, which cannot multiply bf16 (it dots the raw
    bit patterns, triton-lang/triton#11584): the numerics tests run the same kernel on fp16.
    """
    M, N, K = shape["M"], shape["N"], shape["K"]
    if torch.device(device).type == "meta":
        return {"x": torch.empty((M, K), device="meta", dtype=dtype),
                "w_gate": torch.empty((K, N), device="meta", dtype=dtype),
                "w_up": torch.empty((K, N), device="meta", dtype=dtype)}
    gen = torch.Generator(device=device).manual_seed(seed)
    scale = K ** -0.25
    x = (torch.randn((M, K), generator=gen, device=device) * scale).to(dtype)
    w_gate = (torch.randn((K, N), generator=gen, device=device) * scale).to(dtype)
    w_up = (torch.randn((K, N), generator=gen, device=device) * scale).to(dtype)
    return {"x": x, "w_gate": w_gate, "w_up": w_up}


def baseline(inputs: dict) -> torch.Tensor:
    """Two cuBLAS matmuls, then silu and the product as two elementwise kernels (unfused)."""
    x = inputs["x"]
    return F.silu(torch.matmul(x, inputs["w_gate"])) * torch.matmul(x, inputs["w_up"])


def reference(inputs: dict) -> torch.Tensor:
    x = inputs["x"].float()
    return F.silu(x @ inputs["w_gate"].float()) * (x @ inputs["w_up"].float())


# Output rounding to bf16 (unit roundoff 2^-8) dominates, as for the plain GEMM: the gate and up
# sums stay fp32 until the one final cast.
TOLERANCE = Tolerance(max_rel_l2=1e-2, atol=2e-2, rtol=2e-2)


# --------------------------------------------------------------------------------------------
# Roofline model and the static audit's view
# --------------------------------------------------------------------------------------------
def flops(shape: Shape) -> int:
    """The two products; the epilogue's few operations per output element are left out
    (under 0.1 % at K = 4096)."""
    return 4 * shape["M"] * shape["N"] * shape["K"]


def bytes_moved(shape: Shape) -> int:
    """x and both weights read once, the output written once, all bf16."""
    M, N, K = shape["M"], shape["N"], shape["K"]
    return 2 * (M * K + 2 * K * N + M * N)


def compile_args(shape: Shape, config: dict) -> dict[str, object]:
    args = kernel_args(make_inputs(shape, "meta", 0), config)
    return {k: _ptr(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def grid(shape: Shape, config: dict) -> tuple[int, ...]:
    return _grid(shape["M"], shape["N"], config)


# --------------------------------------------------------------------------------------------
# Config space and shapes
# --------------------------------------------------------------------------------------------
def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int, group_m: int) -> dict:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
            "num_warps": warps, "num_stages": stages}


def _space() -> list[dict]:
    """The grid a vLLM-style tuner would sweep, with its dead corners cut.

    - tiles BLOCK_M in 16..256 by BLOCK_N in 32..256, except 256x256 (two 256x256 fp32
      accumulators need 512 registers per thread even on 8 warps);
    - BLOCK_K 32, 64 (2 to 5 stages) and 128 (2 to 4 stages);
    - 4 warps everywhere, 8 warps where the tile has at least 64 rows (one wgmma warpgroup per
      64 rows; smaller tiles run mma.sync and have no use for a second warpgroup);
    - GROUP_M 8 on tiles of 64 rows and more (1 below: small-M tiles cover M in one row of
      programs), plus GROUP_M 1 and 4 for the 64- and 128-row tiles at BLOCK_K 64 on 8 warps,
      to see what the grouping is worth.

    Shared memory per stage is (BLOCK_M + 2*BLOCK_N) * BLOCK_K * 2 bytes, so the deep pipelines of
    wide tiles are over the limit (e.g. 128x256x64 s3: 240 KiB), and the two accumulators make
    large tiles on 4 warps spill (e.g. 128x128: 256 accumulator registers per thread).
    """
    configs = []
    for bm in (16, 32, 64, 128, 256):
        for bn in (32, 64, 128, 256):
            if bm * bn > 128 * 256:
                continue
            for bk, stage_range in ((32, (2, 3, 4, 5)), (64, (2, 3, 4, 5)), (128, (2, 3, 4))):
                for warps in ((4, 8) if bm >= 64 else (4,)):
                    for stages in stage_range:
                        configs.append(_cfg(bm, bn, bk, warps, stages, 8 if bm >= 64 else 1))
    for bm in (64, 128):
        for bn in (32, 64, 128, 256):
            for group_m in (1, 4):
                for stages in (2, 3, 4, 5):
                    configs.append(_cfg(bm, bn, 64, 8, stages, group_m))
    return configs


CONFIGS: list[dict] = _space()

_LLAMA3_8B = "llama3-8b"
_N, _K = 14336, 4096  # intermediate size, hidden size
SHAPES: list[Shape] = [
    Shape(f"llama3_8b_gate_up_m{m}", {"M": m, "N": _N, "K": _K},
          label=f"{_LLAMA3_8B} fused gate/up (K,N)=({_K},{_N}) M={m} ({phase})", phase=phase)
    for m, phase in ((16, "decode"), (128, "decode"), (1024, "prefill"), (4096, "prefill"))
]
